"""``rmq schedules`` and ``rmq schedule add/remove/pause/resume``: a store's recurring
schedules."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import click

from .opening import open_writable_store

_WHY = "its schedules are rmq's own (RocketMQ has none)"


def _open(store_path: str):
    from store import is_store_group

    if is_store_group(store_path):
        raise click.UsageError(f"{store_path} is a store group; a schedule lives in one of its "
                               "stores: name that store's directory")
    return open_writable_store(store_path, _WHY)


def _when(ms, now: int) -> str:
    if ms is None:
        return "-"
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return f"{stamp.isoformat(timespec='seconds')} (in {(ms - now) / 1000:.0f} s)"


@click.command("schedules")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="The store directory.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def schedules(store_path, as_json):
    """The store's recurring schedules: key, state (active, paused, ended), topic, cron or
    interval, next fire time ('-' while paused or ended), fires so far."""
    store = _open(store_path)
    try:
        listed = store.schedules()
        now = store.now_ms()
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps([{**dataclasses.asdict(s), "state": s.state} for s in listed],
                              indent=2, sort_keys=True))
        return
    if not listed:
        click.echo("no schedules")
    for s in listed:
        when = s.cron + (f" ({s.tz})" if s.tz != "UTC" else "") if s.cron else \
            f"every {s.every_ms} ms"
        # a paused schedule's next fire is not known until it is resumed (from then on)
        upcoming = "-" if s.state == "paused" else _when(s.next_fire_ms, now)
        click.echo(f"{s.key}  {s.state}  {s.topic}  {when}  next {upcoming}  fired {s.fires}")


@click.group("schedule")
def schedule() -> None:
    """Add, remove, pause or resume a recurring schedule (rmq schedules lists them)."""


@schedule.command("add")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="The store directory (created when missing).")
@click.option("--key", required=True, help="Names the schedule; one with this key is replaced.")
@click.option("--topic", required=True, help="The topic each fire sends to.")
@click.option("--body", required=True, help="The message body (UTF-8 text).")
@click.option("--tags", default=None, help="The message's tag.")
@click.option("--keys", default=None, help="The message's keys (space-separated).")
@click.option("--cron", default=None, help="Five cron fields or @hourly, @daily, ...")
@click.option("--every-ms", type=int, default=None, help="A fixed interval in ms instead.")
@click.option("--tz", default="UTC", show_default=True, help="IANA time zone of --cron.")
@click.option("--start-at-ms", type=int, default=None, help="No fire before (epoch ms).")
@click.option("--end-at-ms", type=int, default=None, help="No fire after (epoch ms).")
@click.option("--max-fires", type=int, default=None, help="End after this many fires.")
def add(store_path, key, topic, body, tags, keys, cron, every_ms, tz, start_at_ms, end_at_ms,
        max_fires):
    """Add (or replace) a schedule; print its first fire time."""
    from store import Message, MessageStore, is_store_group

    if is_store_group(store_path):
        _open(store_path)  # the usage error
    store = MessageStore.open(store_path)
    try:
        info = store.producer("rmq-cli").schedule(
            Message(topic, body.encode("utf-8"), tags=tags, keys=keys), key=key, cron=cron,
            every_ms=every_ms, tz=tz, start_at_ms=start_at_ms, end_at_ms=end_at_ms,
            max_fires=max_fires)
        click.echo(f"scheduled {info.key}: next fire {_when(info.next_fire_ms, store.now_ms())}")
    finally:
        store.close()


def _change(verb: str, method: str, summary: str):
    @schedule.command(verb, help=f"{summary}. Exit 1 if a key is unknown.",
                      short_help=summary + ".")
    @click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
                  help="The store directory.")
    @click.option("--key", "keys", required=True, multiple=True,
                  help="The schedule's key (repeat for several).")
    def command(store_path, keys):
        store = _open(store_path)
        missing = []
        try:
            for key in keys:
                if getattr(store, method)(key):
                    click.echo(f"{verb}d {key}" if verb.endswith("e") else f"{verb}ed {key}")
                else:
                    missing.append(key)
                    click.echo(f"no schedule {key!r}", err=True)
        finally:
            store.close()
        if missing:
            raise SystemExit(1)

    return command


remove = _change("remove", "remove_schedule", "Delete schedules by key: they never fire again")
pause = _change("pause", "pause_schedule",
                "Stop schedules firing, keeping them and their fire counts, until resumed")
resume = _change("resume", "resume_schedule",
                 "Let paused schedules fire again, from their next fire time after now (the "
                 "fires due while paused are skipped)")
