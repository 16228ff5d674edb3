"""The ``rmq`` command line: ``demo``, ``stats``, ``send``, ``tail``, ``serve``, ``repair``
and ``doctor``.

Exit codes: 0 success; 1 a store error (one clear line on stderr); 2 bad arguments (click's
usage error); 3 ``demo`` finished but an invariant failed; 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from .opening import open_store as _open_store
from .opening import (check_no_token, open_target, open_writable_store, refuse_url,
                      remote_options)

EXIT_STORE_ERROR = 1
EXIT_INVARIANT = 3
EXIT_INTERRUPTED = 130
#: Lines ``rmq send`` appends per call when reading from a pipe or a file.
SEND_CHUNK = 10_000


def _line_chunks(stream, size: int):
    """Non-empty lines of ``stream`` as UTF-8 bytes, in lists of ``size``."""
    chunk = []
    for line in stream:
        body = line.rstrip("\n").encode("utf-8")
        if body:
            chunk.append(body)
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _progress(verb: str):
    """A ``progress(done, total)`` overwriting one line of a terminal's stderr (``None`` when
    stderr is no terminal); end the line with ``click.echo("", err=True)`` afterwards."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        click.echo(f"\r{verb} {done / 1e6:,.0f} of {total / 1e6:,.0f} MB", err=True, nl=False)

    return show


def _fail(exc: Exception) -> None:
    click.echo(f"rmq: error: {exc}", err=True)
    sys.exit(EXIT_STORE_ERROR)


class _Group(click.Group):
    """Turns store errors into one line and exit code 1 for every command."""

    def invoke(self, ctx):
        from rmq_source.setup_check import store_package_problem

        problem = store_package_problem()
        if problem is not None:
            click.echo(f"rmq: error: {problem}", err=True)
            sys.exit(EXIT_STORE_ERROR)
        from store import StoreError

        try:
            return super().invoke(ctx)
        except StoreError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            click.echo("rmq: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rmq", prog_name="rmq")
def main() -> None:
    """rmq: RocketMQ-style delayed and transactional messages on a local store, read by Spark.

    \b
    Start here:
      rmq demo                         the order time-out pipeline end to end (temp store)
      rmq demo --store ./demo-store    ... keeping the store to look at afterwards
      rmq stats --store ./demo-store   what is in a store
      echo hello | rmq send --store ./s --create --topic orders --delay-ms 5000
      rmq tail --store ./s --topic orders --from earliest
      rmq serve --store ./s            deliver due messages and run retention, until stopped
      rmq tail --store rmq://HOST:7911 --token-file F --topic orders   a served store
      rmq lag --checkpoint ./ckpt --store ./s   how far a streaming query is behind
      rmq retention --store ./s --dry-run   what retention would delete, and why not
      rmq pending --store ./s          the next delayed messages due, the oldest open transactions
      rmq repair --store ./s           rebuild the queues from the CommitLog
    """


# --------------------------------------------------------------------------- stats
@main.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR|URL",
              help="The store directory, or a served store's URL (rmq://HOST:PORT: its "
                   "topics and queues).")
@remote_options
@click.option("--json", "as_json", is_flag=True,
              help="Print machine-readable JSON instead of tables.")
@click.option("--system", is_flag=True,
              help="Also list system topics (delay levels, timer, transactions).")
@click.option("--verify", is_flag=True,
              help="Also check every CommitLog record (structure and body CRC); exit 1 when "
                   "one is damaged.")
def stats(store_path: str, token_file, token, as_json: bool, system: bool,
          verify: bool) -> None:
    """Topics, queues, offsets, pending delayed and half messages, disk use of a store.

    Given a store group, the same for each of its stores (JSON: ``{"group", "stores":
    {name: ...}}``); given a served store's URL, its topics and queues."""
    from store import is_remote

    from .opening import keyed_by_store, store_members
    from .stats import collect_remote_stats, collect_stats, render_stats, render_verify

    if is_remote(store_path):
        for flag, given in (("--verify", verify), ("--system", system)):
            if given:
                raise click.UsageError(f"{flag} reads the store's files; run `rmq stats "
                                       f"--store DIR {flag}` on the server's host")
        with open_target(store_path, token, token_file) as remote:
            data = collect_remote_stats(remote)
        if as_json:
            click.echo(json.dumps(data, indent=2, sort_keys=True))
        else:
            render_stats(data)
        return
    check_no_token(store_path, token, token_file)
    members = store_members(store_path)
    results = {}
    for name, path in members:
        store = _open_store(path)
        try:
            data = collect_stats(store, include_system=system)
            if verify:
                progress = _progress("verified")
                data["verify"] = store.verify_commitlog(progress).as_dict()
                if progress is not None:
                    click.echo("", err=True)
        finally:
            store.close()
        results[name] = data
    if as_json:
        click.echo(json.dumps(keyed_by_store(store_path, results), indent=2, sort_keys=True))
    else:
        for (name, path), data in zip(members, results.values()):
            if name is not None:
                click.echo(f"== store {name} ({path})")
            render_stats(data)
            if verify:
                render_verify(data["verify"])
    if verify and not all(d["verify"]["ok"] for d in results.values()):
        sys.exit(1)


# --------------------------------------------------------------------------- doctor
@main.command()
def doctor() -> None:
    """Check that Spark can use the rmq source from here.

    Starts a local Spark session the way a job started from this shell would (PYSPARK_PYTHON
    and PYTHONPATH as they are), runs one Python task on its workers and reads through
    format("rmq"); says which Python the workers run, what they cannot import, and what to
    change.  Exits 1 when something is wrong.
    """
    import warnings

    from rmq_source.setup_check import check_spark
    from store import warm_up

    # numba's cache filled here, so that no first run after an install compiles (store.base.jit)
    click.echo(f"compiled loops ready in {warm_up():.1f} s")

    warnings.filterwarnings("ignore", category=FutureWarning)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("rmq-doctor")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        problems = check_spark(spark)
    finally:
        spark.stop()
    click.echo(f"this Python: {sys.executable}")
    click.echo(f"PYSPARK_PYTHON: {os.environ.get('PYSPARK_PYTHON') or '(unset: python3 on PATH)'}")
    for problem in problems:
        click.echo(f"problem: {problem}")
    if problems:
        sys.exit(1)
    click.echo('ok: Spark\'s workers import rmq and format("rmq") works')


# --------------------------------------------------------------------------- repair
@main.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="The store directory.")
def repair(store_path: str) -> None:
    """Rebuild every ConsumeQueue and the topic table from the CommitLog.

    For queue files that were deleted, truncated, zeroed or overwritten (messages missing
    although the CommitLog holds them).  The message-key index is checked file by file
    (header, slots, entries) and rebuilt from the CommitLog when one is damaged or it is
    missing.  Damaged files are renamed to *.damaged, never
    deleted; no CommitLog record is removed.  Run it while nothing else uses the store.
    """
    refuse_url(store_path, "rmq repair", "run `rmq repair --store DIR` on the server's host, "
               "with the server stopped")
    store = open_writable_store(store_path, "rmq only reads it (repair it with RocketMQ's own "
                                "tools)")
    try:
        progress = _progress("scanned")
        result = store.rebuild_queues(progress)
        if progress is not None:
            click.echo("", err=True)
        index_aside, index_rebuilt = store.rebuild_key_index()
    finally:
        store.close()
    click.echo(f"rebuilt {result.queues} queue(s): {result.entries} entries from "
               f"{result.records} records (CommitLog valid to {result.end_offset})")
    if index_rebuilt:
        click.echo("rebuilt the message-key index from the CommitLog")
    for name in [*result.set_aside, *index_aside]:
        click.echo(f"set aside damaged file as {name}")
    if result.topics_widened:
        click.echo(f"topic table updated: {', '.join(result.topics_widened)}")
    if result.stopped_early:
        click.echo("warning: the CommitLog has an invalid record before its confirmed end; "
                   "the records after it were not indexed", err=True)


# --------------------------------------------------------------------------- send
@main.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR|URL",
              help="The store directory, a store group's (lines spread over its stores), or a "
                   "served store's URL (rmq://HOST:PORT).")
@click.option("--create", is_flag=True,
              help="Make a new store at --store when none is there (else that is an error).")
@remote_options
@click.option("--topic", required=True, help="Destination topic.")
@click.option("--tags", default=None, help="Tag of every message (one word, no '|').")
@click.option("--keys", default=None, help="Space-separated business keys of every message.")
@click.option("--delay-ms", type=click.IntRange(min=0), default=None,
              help="Deliver each message this many ms after it is sent (timer wheel).")
@click.option("--delay-level", type=click.IntRange(min=1), default=None,
              help="4.x delay level 1..18 (1s 5s 10s 30s 1m ... 2h; higher levels are clamped).")
@click.option("--deliver-at-ms", type=click.IntRange(min=0), default=None,
              help="Deliver at this epoch ms (timer wheel).")
@click.option("--group", default="rmq-cli", show_default=True, help="Producer group.")
@click.option("--print-ids", is_flag=True, help="Print each message id on stdout.")
def send(store_path, create, token_file, token, topic, tags, keys, delay_ms, delay_level,
         deliver_at_ms, group, print_ids):
    """Send one message per line of standard input.

    \b
    Examples:
      printf 'a\\nb\\n' | rmq send --store ./s --create --topic orders --tags created
      echo reminder | rmq send --store ./s --topic reminders --delay-ms 60000
    """
    import pyarrow as pa

    from store import StoreGroup, is_store_group

    given = [n for n, v in (("--delay-ms", delay_ms), ("--delay-level", delay_level),
                            ("--deliver-at-ms", deliver_at_ms)) if v is not None]
    if len(given) > 1:
        raise click.UsageError(f"{' and '.join(given)} cannot be combined; give at most one")
    # a store group spreads the lines over its stores (round robin, GroupProducer)
    if is_store_group(store_path):
        check_no_token(store_path, token, token_file)
        store = StoreGroup.open(store_path)
    else:
        store = open_target(store_path, token, token_file, create=create)
    interactive = sys.stdin.isatty()
    if interactive:
        click.echo("rmq send: reading messages from standard input, one per line "
                   "(Ctrl-D to finish)", err=True)
    progress = not interactive and sys.stderr.isatty()
    sent = 0
    try:
        producer = store.producer(group)
        # lines typed at a terminal go one by one; piped lines in tables of SEND_CHUNK rows
        for bodies in _line_chunks(sys.stdin, 1 if interactive else SEND_CHUNK):
            n = len(bodies)
            columns = {"body": pa.array(bodies, pa.binary())}
            for name, value, type_ in (("tags", tags, pa.string()), ("keys", keys, pa.string()),
                                       ("delay_ms", delay_ms, pa.int64()),
                                       ("delay_level", delay_level, pa.int64()),
                                       ("deliver_at", deliver_at_ms, pa.int64())):
                if value is not None:
                    columns[name] = pa.array([value] * n, type_)
            result = producer.send_table(pa.table(columns), topic=topic)
            sent += n
            if print_ids:
                click.echo("\n".join(result.column("msg_id").to_pylist()))
            if progress:
                click.echo(f"\rsent {sent:,}", err=True, nl=False)
    finally:
        store.close()
        if progress and sent:
            click.echo("", err=True)
    when = ""
    if delay_ms is not None:
        when = f", due in {delay_ms} ms"
    elif delay_level is not None:
        when = f", delay level {delay_level}"
    elif deliver_at_ms is not None:
        when = f", due at {deliver_at_ms}"
    click.echo(f"sent {sent} message(s) to {topic}{when}", err=True)


# --------------------------------------------------------------------------- tail
@main.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR|URL",
              help="The store directory, a store group's, or a served store's URL "
                   "(rmq://HOST:PORT).")
@remote_options
@click.option("--topic", required=True, help="Topic to follow.")
@click.option("--from", "start", type=click.Choice(["earliest", "latest"]), default="latest",
              show_default=True, help="Start at the oldest message or only show new ones.")
@click.option("--tags", default=None, help="Only messages with one of these tags ('a || b').")
@click.option("--follow/--no-follow", default=True, show_default=True,
              help="Keep waiting for new messages, or stop at the end.")
@click.option("--deliver-due/--no-deliver-due", default=True, show_default=True,
              help="Move due delayed messages into their topics while following.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Output format (json: one object per line).")
@click.option("--max-messages", type=click.IntRange(min=1), default=None,
              help="Stop after this many messages.")
@click.option("--poll-ms", type=click.IntRange(min=10), default=200, show_default=True,
              help="How often to look for new messages.")
def tail(store_path, token_file, token, topic, start, tags, follow, deliver_due, fmt,
         max_messages, poll_ms):
    """Print messages of a topic as they become visible (delivering due delayed ones; a
    served store's server delivers them itself)."""
    from store import StoreGroup, is_remote, is_store_group

    from .tail import follow_topic

    if is_store_group(store_path):  # every store of the group, each message naming its store
        check_no_token(store_path, token, token_file)
        group = StoreGroup.open(store_path)
        try:
            follow_topic(group, topic, start=start, tags=tags, follow=follow,
                         deliver_due=deliver_due, fmt=fmt, max_messages=max_messages,
                         poll_s=poll_ms / 1000, echo=click.echo)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        finally:
            group.close()
        return
    remote = is_remote(store_path)
    store = open_target(store_path, token, token_file, why=None)
    try:
        follow_topic(store, topic, start=start, tags=tags, follow=follow,
                     deliver_due=deliver_due and not remote
                     and not getattr(store, "read_only", False),
                     fmt=fmt, max_messages=max_messages,
                     poll_s=poll_ms / 1000, echo=click.echo)
    finally:
        store.close()


# --------------------------------------------------------------------------- demo
@main.command()
@click.option("--store", "store_path", default=None, type=click.Path(file_okay=False),
              help="Keep the store here (default: a temporary directory, removed at the end).")
@click.option("--orders", type=click.IntRange(min=10), default=2000, show_default=True,
              help="How many orders to produce.")
@click.option("--timeout-s", type=click.FloatRange(min=1.0), default=6.0, show_default=True,
              help="Order time-out (RocketMQ's 30 minutes, scaled to seconds).")
@click.option("--remind-s", type=click.FloatRange(min=1.0), default=2.0, show_default=True,
              help="Remind every open order this often until it is paid or closed.")
@click.option("--quiet", is_flag=True, help="No live table; print only the summary.")
def demo(store_path, orders, timeout_s, remind_s, quiet):
    """Run the order time-out pipeline end to end on an embedded store.

    Orders get a delayed "close if unpaid" message; most are paid through transactional
    messages (committed at once, rolled back, or left unknown for the check loop); a Spark
    streaming query closes the unpaid ones when their time-out surfaces and reminds every
    open order every --remind-s seconds (a recurring schedule, removed once it is paid or
    closed), and a second query runs the transaction check loop.  Exits 3 if any invariant
    fails.
    """
    from .demo import run_demo

    if store_path is not None:
        refuse_url(store_path, "rmq demo", "it makes and fills a store directory of its own: "
                   "give --store DIR (or none), then serve that")
    started = time.time()
    ok = run_demo(store_path=store_path, orders=orders, timeout_s=timeout_s, remind_s=remind_s,
                  quiet=quiet)
    click.echo(f"demo finished in {time.time() - started:.1f} s", err=True)
    sys.exit(0 if ok else EXIT_INVARIANT)


from .ops import cancel, lag, pending, retention, serve  # noqa: E402  (operating a store)
from .schedules import schedule, schedules  # noqa: E402  (recurring schedules)
from .query import query  # noqa: E402  (messages by key, id or time)
from .replicas import promote  # noqa: E402  (replica sets)

for _command in (serve, lag, retention, cancel, pending, schedules, schedule, query, promote):
    main.add_command(_command)

if __name__ == "__main__":  # pragma: no cover
    main()
