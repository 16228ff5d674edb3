"""``rmq query``: the messages of a key, an id or a time range, found without a scan."""

from __future__ import annotations

import click

from .opening import refuse_url
from .tail import _render


@click.command("query")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR", help="The store directory (rmq's or Apache RocketMQ's).")
@click.option("--topic", help="The topic (required with --key and without --id).")
@click.option("--key", help="A message key (KEYS) or unique key (msg_id): the key index.")
@click.option("--id", "msg_id", help="A message id: an offset message id or a unique key.")
@click.option("--from", "begin_ms", type=int, help="Stored at or after this epoch ms.")
@click.option("--to", "end_ms", type=int, help="Stored at or before this epoch ms.")
@click.option("--max", "max_messages", type=click.IntRange(min=1), default=64,
              show_default=True, help="At most this many messages.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def query(store_path, topic, key, msg_id, begin_ms, end_ms, max_messages, fmt):
    """Messages of a key (--key), an id (--id) or stored between --from and --to, read-only.

    \b
      rmq query --store ./s --topic orders --key order-42
      rmq query --store ./s --id 7F0000011A2B...        (the SendResult's msg_id)
      rmq query --store ./s --topic orders --from 1700000000000 --to 1700003600000
    """
    from store import StoreReader

    refuse_url(store_path, "rmq query", "run it on the server's host with --store DIR")
    if msg_id is not None and (key is not None or begin_ms is not None or end_ms is not None):
        raise click.UsageError("--id finds one message; it takes no --key, --from or --to")
    if msg_id is None and not topic:
        raise click.UsageError("--topic is required (with --key, or --from/--to)")
    store = StoreReader.open(store_path)
    try:
        if msg_id is not None:
            view = store.view_message(msg_id, topic=topic)
            views = [] if view is None else [view]
        else:
            views = store.query_messages(topic, key=key, begin_ms=begin_ms, end_ms=end_ms,
                                         max=max_messages)
    finally:
        store.close()
    for view in views:
        click.echo(_render(view, fmt))
    if not views:
        click.echo("no message found", err=True)
