"""``rmq query``: the messages of a key, an id or a time range, found without a scan."""

from __future__ import annotations

import click

from .opening import check_no_token, open_target, remote_options
from .tail import _render


@click.command("query")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR|URL", help="The store directory (rmq's or Apache RocketMQ's), a "
              "store group's directory, or a served store's rmq:// URL.")
@click.option("--topic", help="The topic (required with --key and without --id).")
@click.option("--key", help="A message key (KEYS) or unique key (msg_id): the key index.")
@click.option("--id", "msg_id", help="A message id: an offset message id or a unique key.")
@click.option("--from", "begin_ms", type=int, help="Stored at or after this epoch ms.")
@click.option("--to", "end_ms", type=int, help="Stored at or before this epoch ms.")
@click.option("--max", "max_messages", type=click.IntRange(min=1), default=64,
              show_default=True, help="At most this many messages.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@remote_options
def query(store_path, topic, key, msg_id, begin_ms, end_ms, max_messages, fmt, token,
          token_file):
    """Messages of a key (--key), an id (--id) or stored between --from and --to, read-only.

    \b
      rmq query --store ./s --topic orders --key order-42
      rmq query --store ./s --id 7F0000011A2B...        (the SendResult's msg_id)
      rmq query --store ./s --topic orders --from 1700000000000 --to 1700003600000
      rmq query --store rmq://host:7911 --token-file t --topic orders --key order-42

    A store group's messages name their store; read-only everywhere.
    """
    from store import StoreGroup, StoreReader, is_remote, is_store_group

    if msg_id is not None and (key is not None or begin_ms is not None or end_ms is not None):
        raise click.UsageError("--id finds one message; it takes no --key, --from or --to")
    if msg_id is None and not topic:
        raise click.UsageError("--topic is required (with --key, or --from/--to)")
    group = is_store_group(store_path)
    if is_remote(store_path):
        store = open_target(store_path, token, token_file)
    else:
        check_no_token(store_path, token, token_file)
        store = (StoreGroup.open(store_path, read_only=True) if group
                 else StoreReader.open(store_path))
    try:
        if msg_id is not None:
            found = store.view_message(msg_id, topic=topic)
            found = [] if found is None else [found]
        else:
            found = store.query_messages(topic, key=key, begin_ms=begin_ms, end_ms=end_ms,
                                         max=max_messages)
    finally:
        store.close()
    for item in found:
        name, view = item if group else (None, item)
        click.echo(_render(view, fmt, name))
    if not found:
        click.echo("no message found", err=True)
