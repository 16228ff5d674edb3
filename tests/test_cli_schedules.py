"""``rmq schedules`` and ``rmq schedule add/remove/pause/resume``."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rmq_cli.cli import main
from store import MessageStore


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
