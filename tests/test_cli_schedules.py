"""``rmq schedules`` and ``rmq schedule add/remove/pause/resume``."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rmq_cli.cli import main
from store import Message, MessageStore


def run(*args, code=0):
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == code, r.output
    return r


def test_add_list_pause_resume_remove(tmp_path):
    path = str(tmp_path / "s")
    r = run("schedule", "add", "--store", path, "--create", "--key", "remind-o1", "--topic",
            "orders", "--body", "pay please", "--tags", "reminder", "--every-ms", "60000")
    assert "scheduled remind-o1: next fire" in r.output
    run("schedule", "add", "--store", path, "--key", "daily", "--topic", "reports", "--body",
        "x", "--cron", "0 9 * * *", "--tz", "Europe/Paris", "--max-fires", "3")
    listed = {s["key"]: s for s in json.loads(run("schedules", "--store", path,
                                                  "--json").stdout)}
    assert listed["daily"]["cron"] == "0 9 * * *" and listed["daily"]["tz"] == "Europe/Paris"
    assert listed["remind-o1"]["every_ms"] == 60000 and listed["remind-o1"]["state"] == "active"
    assert "every 60000 ms" in run("schedules", "--store", path).output

    r = run("schedule", "pause", "--store", path, "--key", "remind-o1", "--key", "nope", code=1)
    assert "paused remind-o1" in r.output and "no schedule 'nope'" in r.output
    assert json.loads(run("schedules", "--store", path, "--json").stdout)[1]["state"] == "paused"
    run("schedule", "resume", "--store", path, "--key", "remind-o1")
    run("schedule", "remove", "--store", path, "--key", "daily")
    with MessageStore.open(path) as store:
        [info] = store.schedules()
        assert (info.key, info.state) == ("remind-o1", "active")


def test_bad_input_says_what_is_allowed(tmp_path):
    path = str(tmp_path / "s")
    r = run("schedule", "add", "--store", path, "--create", "--key", "k", "--topic", "orders",
            "--body", "x", "--cron", "0 25 * * *", code=1)
    assert "allowed: 0-23" in r.output
    r = run("schedule", "add", "--store", path, "--key", "k", "--topic", "orders", "--body",
            "x", code=1)
    assert "exactly one of cron" in r.output
    assert "no schedules" in run("schedules", "--store", path).output


def test_a_paused_schedule_shows_no_next_fire_time(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, clock=lambda: 1_700_000_000_000) as store:  # long ago
        store.producer("g").schedule(Message("orders", b"x"), key="old", every_ms=60_000)
        store.producer("g").schedule(Message("orders", b"y"), key="live", every_ms=60_000)
        assert store.pause_schedule("old")
    lines = {line.split()[0]: line for line in run("schedules", "--store", path).output
             .splitlines()}
    assert "paused" in lines["old"] and "next -  " in lines["old"]
    assert "next -" not in lines["live"] and "active" in lines["live"]


def test_schedule_help_describes_every_subcommand():
    out = run("schedule", "--help").output
    commands = out.split("Commands:", 1)[1].splitlines()
    described = {line.split()[0]: line.split(None, 1)[1:] for line in commands
                 if line.startswith("  ") and not line.startswith("    ")}
    assert set(described) == {"add", "pause", "remove", "resume"}
    assert all(text for text in described.values()), described
    assert "skipped" in run("schedule", "resume", "--help").output
