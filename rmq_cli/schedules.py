"""``rmq schedules`` and ``rmq schedule add/remove/pause/resume``: a store's recurring
schedules."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time

import click

from .opening import open_target, remote_options

_WHY = "its schedules are rmq's own (RocketMQ has none)"
_STORE_HELP = "The store directory, or a served store's URL (rmq://HOST:PORT)."


def _open(store_path: str, token: str | None, token_file: str | None, create=None):
    from store import is_store_group

    if is_store_group(store_path):
        raise click.UsageError(f"{store_path} is a store group; a schedule lives in one of its "
                               "stores: name that store's directory")
    return open_target(store_path, token, token_file, create=create, why=_WHY)


def _now_ms(store) -> int:
    """The store's clock; a served store's is not served, so this host's."""
    now = getattr(store, "now_ms", None)
    return now() if now is not None else int(time.time() * 1000)


def _when(ms, now: int) -> str:
    if ms is None:
        return "-"
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return f"{stamp.isoformat(timespec='seconds')} (in {(ms - now) / 1000:.0f} s)"


@click.command("schedules")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR|URL", help=_STORE_HELP)
@remote_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def schedules(store_path, token_file, token, as_json):
    """The store's recurring schedules: key, state (active, paused, ended), topic, cron or
    interval, next fire time ('-' while paused or ended), fires so far, catch-up policy."""
    store = _open(store_path, token, token_file)
    try:
        listed = store.schedules()
        now = _now_ms(store)
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
        catch_up = s.catch_up + ("" if s.catch_up_window_ms is None
                                 else f" within {s.catch_up_window_ms} ms")
        # a paused schedule's next fire is not known until it is resumed (from then on)
        upcoming = "-" if s.state == "paused" else _when(s.next_fire_ms, now)
        click.echo(f"{s.key}  {s.state}  {s.topic}  {when}  next {upcoming}  fired {s.fires}"
                   f"  catch-up {catch_up}")


@click.group("schedule")
def schedule() -> None:
    """Add, remove, pause or resume a recurring schedule (rmq schedules lists them)."""


@schedule.command("add")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR|URL", help=_STORE_HELP)
@click.option("--create", is_flag=True,
              help="Make a new store at --store when none is there (else that is an error).")
@remote_options
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
@click.option("--catch-up", type=click.Choice(["latest_once", "all", "skip"]),
              default="latest_once", show_default=True,
              help="Fires missed while nothing delivered: one copy standing for them all, a "
                   "copy each, or none.")
@click.option("--catch-up-window-ms", type=int, default=None,
              help="Missed fires older than this are dropped (default: none is too old).")
def add(store_path, create, token_file, token, key, topic, body, tags, keys, cron, every_ms,
        tz, start_at_ms, end_at_ms, max_fires, catch_up, catch_up_window_ms):
    """Add (or replace) a schedule; print its first fire time."""
    from store import Message

    store = _open(store_path, token, token_file, create)
    try:
        info = store.producer("rmq-cli").schedule(
            Message(topic, body.encode("utf-8"), tags=tags, keys=keys), key=key, cron=cron,
            every_ms=every_ms, tz=tz, start_at_ms=start_at_ms, end_at_ms=end_at_ms,
            max_fires=max_fires, catch_up=catch_up, catch_up_window_ms=catch_up_window_ms)
        click.echo(f"scheduled {info.key}: next fire {_when(info.next_fire_ms, _now_ms(store))}")
    finally:
        store.close()


def _change(verb: str, method: str, summary: str):
    @schedule.command(verb, help=f"{summary}. Exit 1 if a key is unknown.",
                      short_help=summary + ".")
    @click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
                  metavar="DIR|URL", help=_STORE_HELP)
    @remote_options
    @click.option("--key", "keys", required=True, multiple=True,
                  help="The schedule's key (repeat for several).")
    def command(store_path, token_file, token, keys):
        store = _open(store_path, token, token_file)
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
