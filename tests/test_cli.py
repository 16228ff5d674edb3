"""The ``rmq`` command line: send, stats, tail, bad arguments, and the demo end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rmq_cli.cli import main
from store import MessageStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def runner():
    return CliRunner()


def test_send_then_stats_and_tail(runner, tmp_path):
    path = str(tmp_path / "s")
    r = runner.invoke(main, ["send", "--store", path, "--create", "--topic", "orders", "--tags",
                             "created", "--keys", "k1", "--print-ids"], input="a\nb\n\nc\n")
    assert r.exit_code == 0, r.output
    ids = [line for line in r.stdout.splitlines() if line]
    assert len(ids) == 3 and len(set(ids)) == 3
    r = runner.invoke(main, ["send", "--store", path, "--topic", "orders", "--delay-ms",
                             "3600000"], input="later\n")
    assert r.exit_code == 0, r.output

    r = runner.invoke(main, ["stats", "--store", path, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    orders = [t for t in data["topics"] if t["topic"] == "orders"][0]
    assert orders["messages"] == 3
    assert data["delayed"]["pending"] == 1
    assert data["delayed"]["timer_pending"] == 1
    r = runner.invoke(main, ["stats", "--store", path])
    assert r.exit_code == 0 and "orders" in r.stdout

    r = runner.invoke(main, ["tail", "--store", path, "--topic", "orders", "--from", "earliest",
                             "--no-follow", "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted(row["body"] for row in rows) == ["a", "b", "c"]
    assert all(row["tags"] == "created" and row["keys"] == ["k1"] for row in rows)


def test_tail_delivers_due_messages(runner, tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        store.producer("g").send(__import__("store").Message("r", b"soon"), delay_ms=1)
    import time

    time.sleep(1.2)  # past the due time (timer precision is 1 s by default)
    r = runner.invoke(main, ["tail", "--store", path, "--topic", "r", "--from", "earliest",
                             "--no-follow"])
    assert r.exit_code == 0, r.output
    assert "soon" in r.stdout and "due=" in r.stdout


@pytest.mark.parametrize("args, code, text", [
    (["stats", "--store", "/nonexistent/rmq"], 1, "is not an rmq store"),
    (["send", "--store", "X", "--topic", "t", "--delay-ms", "5", "--delay-level", "2"], 2,
     "cannot be combined"),
    (["send", "--store", "X", "--topic", "t", "--delay-level", "0"], 2, "--delay-level"),
    (["tail", "--store", "X"], 2, "--topic"),
    (["nope"], 2, "No such command"),
])
def test_bad_arguments_one_line_and_exit_code(runner, args, code, text):
    r = runner.invoke(main, args, input="")
    assert r.exit_code == code, r.output
    assert text in r.output


def test_bad_topic_is_a_store_error(runner, tmp_path):
    r = runner.invoke(main, ["send", "--store", str(tmp_path / "s"), "--create", "--topic",
                             "../etc"],
                      input="x\n")
    assert r.exit_code == 1
    assert "rmq: error:" in r.output and "topic" in r.output


def test_help_is_actionable(runner):
    r = runner.invoke(main, ["--help"])
    assert r.exit_code == 0
    for word in ("demo", "stats", "send", "tail", "rmq demo --store"):
        assert word in r.stdout


@pytest.mark.slow
@pytest.mark.spark
def test_demo_end_to_end_then_cli_on_its_store(tmp_path, runner):
    """The README's first command (small), then stats and tail on the store it left."""
    path = str(tmp_path / "demo")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p), PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "rmq_cli.cli", "demo", "--store", path, "--orders", "200",
         "--timeout-s", "4", "--quiet"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for line in ("PASS every time-out surfaced exactly once", "PASS nothing surfaced early",
                 "PASS exactly the committed payments seen",
                 "PASS every unpaid order closed", "PASS every reminder seen once, never early",
                 "PASS no reminder fired after its order's schedule was removed",
                 "PASS no reminder schedule left"):
        assert line in proc.stdout
    r = runner.invoke(main, ["stats", "--store", path, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    topics = {t["topic"]: t["messages"] for t in data["topics"]}
    assert topics["order_timeouts"] == 200 + 1  # the warm-up order is scheduled too
    assert topics["orders"] == 201  # 200 orders and the warm-up order
    r = runner.invoke(main, ["tail", "--store", path, "--topic", "order_closed", "--from",
                             "earliest", "--no-follow", "--format", "json"])
    assert r.exit_code == 0
    assert len(r.stdout.splitlines()) == topics.get("order_closed", 0)


def test_send_of_many_piped_lines_goes_in_tables(runner, tmp_path, monkeypatch):
    """200k piped lines: appended SEND_CHUNK at a time (not one send each), every line once."""
    import rmq_cli.cli as cli

    calls = []
    from store.produce.producer import Producer

    real = Producer.send_table

    def counting(self, table, **kw):
        calls.append(table.num_rows)
        return real(self, table, **kw)

    monkeypatch.setattr(Producer, "send_table", counting)
    path = str(tmp_path / "s")
    lines = "".join(f"line {i}\n" for i in range(25_000))
    r = runner.invoke(main, ["send", "--store", path, "--create", "--topic", "bulk",
                             "--delay-level", "1"],
                      input=lines)
    assert r.exit_code == 0, r.output
    assert calls == [cli.SEND_CHUNK, cli.SEND_CHUNK, 5_000]
    assert "sent 25000 message(s) to bulk, delay level 1" in r.stderr
    with MessageStore.open(path) as store:
        assert store.pending_delayed_stats()["schedule_pending"] == 25_000


def test_stats_of_a_store_group_and_commands_that_take_one_store(runner, tmp_path):
    from store import Message, StoreGroup

    path = str(tmp_path / "group")
    with StoreGroup.create(path, 2) as g:
        p = g.producer("pg")
        for i in range(6):
            p.send(Message("orders", f"m{i}".encode()))
        p.send(Message("orders", b"later"), delay_ms=600_000, store="store-1")
    r = runner.invoke(main, ["stats", "--store", path, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert sorted(data["stores"]) == ["store-0", "store-1"]
    counts = [sum(q["messages"] for q in s["topics"]) for s in data["stores"].values()]
    assert counts == [3, 3]
    assert data["stores"]["store-1"]["delayed"]["pending"] == 1
    r = runner.invoke(main, ["stats", "--store", path])
    assert r.exit_code == 0 and "== store store-1" in r.output
    r = runner.invoke(main, ["send", "--store", path, "--topic", "lines"],
                      input="".join(f"line-{i}\n" for i in range(20)))
    assert r.exit_code == 0, r.output
    with StoreGroup.open(path, read_only=True) as g:
        per = [sum(s.max_offset("lines", q) for q in s.queue_ids("lines")) for _, s in g.stores()]
    assert per == [10, 10]
    r = runner.invoke(main, ["tail", "--store", path, "--topic", "orders", "--no-follow",
                             "--from", "earliest", "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert sorted(x["body"] for x in rows) == sorted(f"m{i}" for i in range(6))
    assert sorted({x["store"] for x in rows}) == ["store-0", "store-1"]
    r = runner.invoke(main, ["tail", "--store", path, "--topic", "orders", "--no-follow"])
    assert r.exit_code == 0 and r.output == ""  # from latest: nothing old, in any store
    r = runner.invoke(main, ["pending", "--store", path, "--json"])
    assert r.exit_code == 0, r.output
    pending = json.loads(r.output)["stores"]
    assert [len(pending[n]["timer"]) for n in ("store-0", "store-1")] == [0, 1]
    msg_id = pending["store-1"]["timer"][0]["msg_id"]
    assert "== store store-1" in runner.invoke(main, ["pending", "--store", path]).output
    r = runner.invoke(main, ["retention", "--store", path, "--dry-run", "--json"])
    assert r.exit_code == 0 and sorted(json.loads(r.output)["stores"]) == ["store-0", "store-1"]
    r = runner.invoke(main, ["cancel", "--store", path, "--topic", "orders", "--msg-id", msg_id])
    assert r.exit_code == 0 and f"cancelled {msg_id}" in r.output
    r = runner.invoke(main, ["cancel", "--store", path, "--topic", "orders", "--msg-id", msg_id])
    assert r.exit_code == 1  # cancelled already: not pending in any store
    r = runner.invoke(main, ["repair", "--store", path])
    assert r.exit_code != 0 and "store-0 (" in r.output
    assert not os.path.exists(os.path.join(path, "commitlog"))  # no store made at the root


def test_tail_from_latest_skips_what_every_queue_already_holds(runner, tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        p = store.producer("g")
        for i in range(8):  # two messages in each of the four queues
            p.send(__import__("store").Message("t", f"m{i}".encode()))
    r = runner.invoke(main, ["tail", "--store", path, "--topic", "t", "--no-follow"])
    assert r.exit_code == 0 and r.output == ""
    r = runner.invoke(main, ["tail", "--store", path, "--topic", "t", "--no-follow",
                             "--from", "earliest"])
    assert len(r.output.splitlines()) == 8


def test_serve_grpc_options_are_checked(runner, tmp_path):
    path = str(tmp_path / "s")
    acl = tmp_path / "acl.json"
    acl.write_text('{"accounts": [{"accessKey": "a", "secretKey": "secret"}]}')
    r = runner.invoke(main, ["serve", "--store", path, "--acl", str(acl)])
    assert r.exit_code == 2 and "--acl needs --listen or --grpc" in r.output
    r = runner.invoke(main, ["serve", "--store", path, "--insecure"])
    assert r.exit_code == 2 and "need --listen or --grpc" in r.output
    r = runner.invoke(main, ["serve", "--store", path, "--create", "--grpc", "0.0.0.0:0",
                             "--duration-s", "0"])
    assert r.exit_code == 1 and "--acl" in r.output  # non-loopback without an ACL
    bad = tmp_path / "bad.json"
    bad.write_text('{"accounts": [{"accessKey": "a"}]}')
    r = runner.invoke(main, ["serve", "--store", path, "--create", "--grpc", "127.0.0.1:0", "--acl",
                             str(bad), "--duration-s", "0"])
    assert r.exit_code == 1 and "secretKey" in r.output


def test_serve_grpc_of_a_store_group_is_one_endpoint(runner, tmp_path):
    from store import StoreGroup

    StoreGroup.create(str(tmp_path / "g"), 2).close()
    r = runner.invoke(main, ["serve", "--store", str(tmp_path / "g"), "--grpc", "127.0.0.1:0",
                             "--duration-s", "0.5"])
    assert r.exit_code == 0, r.output
    assert "RocketMQ clients connect to 127.0.0.1:" in r.output
    r = runner.invoke(main, ["serve", "--store", str(tmp_path / "g"), "--grpc", "0.0.0.0:0",
                             "--duration-s", "0"])
    assert r.exit_code == 1 and "--acl" in r.output


def test_cancel_by_delay_key(runner, tmp_path):
    from store import Message

    path = str(tmp_path / "s")
    with MessageStore.open(path) as s:
        s.producer().send(Message("orders", b"x"), delay_ms=3_600_000, key="order-1")
    r = runner.invoke(main, ["cancel", "--store", path, "--key", "order-1", "--key", "nope"])
    assert r.exit_code == 1 and "cancelled key order-1" in r.output
    assert "not pending: key nope" in r.output
    r = runner.invoke(main, ["cancel", "--store", path, "--key", "order-1"])
    assert r.exit_code == 1  # cancelled already
    for bad in (["--key", "a", "--topic", "orders", "--msg-id", "0" * 32], ["--topic", "t"],
                [], ["--key", "a\x01b"]):
        r = runner.invoke(main, ["cancel", "--store", path, *bad])
        assert r.exit_code == 2, (bad, r.output)
    with MessageStore.open(path) as s:
        assert s.producer().pending_keys(["order-1"]).tolist() == [False]
