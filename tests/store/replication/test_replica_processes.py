"""A replica set as two ``rmq serve --replica-set`` processes on loopback: sends of every kind
on the leader reach the follower byte for byte; the follower, SIGKILLed and restarted, catches
up; ``rmq stats --json`` shows the role, epoch and lag, served and stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from test_replica_set import commitlog_bytes, free_port, replica_file

from store import (
    LocalTransactionState,
    Message,
    NotLeaderError,
    StoreReader,
    connect,
    server_status,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
TOKEN = "replica-token"
ENV = dict(os.environ, PYTHONPATH=ROOT)

pytestmark = pytest.mark.slow


class Commit:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, view):
        return LocalTransactionState.COMMIT_MESSAGE


def serve(path, port, rs, token_file):
    return subprocess.Popen(
        [sys.executable, "-m", "rmq_cli.cli", "serve", "--store", path, "--create",
         "--listen", f"127.0.0.1:{port}", "--replica-set", rs, "--token-file", token_file,
         "--log-level", "WARNING"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for(what, check, proc=None, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if proc is not None:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def served(path, proc):
    status = server_status(path)
    ok = status and status.get("attached") and status.get("pid") == proc.pid \
        and status.get("replication")
    return status if ok else None


def start_pair(tmp_path, **fields):
    """Two ``rmq serve`` processes of one replica set (the first leads), each serving:
    ``(ports, token_file, leader dir, follower dir, {"a": proc, "b": proc})``.  The caller
    kills what is still running (``stop_all``)."""
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, **fields)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    procs = {"a": serve(a, ports[0], rs, str(token_file))}
    try:
        procs["b"] = serve(b, ports[1], rs, str(token_file))
        wait_for("the leader serves", lambda: served(a, procs["a"]), procs["a"])
        wait_for("the follower serves", lambda: served(b, procs["b"]), procs["b"])
    except BaseException:
        stop_all(procs)
        raise
    return ports, rs, token_file, a, b, procs


def stop_all(procs):
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def stats_json(path) -> dict:
    out = subprocess.run([sys.executable, "-m", "rmq_cli.cli", "stats", "--store", path,
                          "--json"], env=ENV, capture_output=True, timeout=120, check=True)
    return json.loads(out.stdout)["replication"]


def test_two_rmq_serve_processes_replicate_and_the_follower_catches_up(tmp_path):
    ports, rs, token_file, a, b, procs = start_pair(tmp_path)
    try:
        with connect(f"rmq://127.0.0.1:{ports[0]}", token=TOKEN, timeout_s=30) as leader:
            p = leader.producer("g")
            ids = [p.send(Message("orders", b"single-%d" % i)).msg_id for i in range(20)]
            ids += [r.msg_id for r in p.send_batch([Message("orders", b"batch-%d" % i)
                                                    for i in range(20)])]
            ids += p.send_table(pa.table({"body": [b"row-%d" % i for i in range(5000)]}),
                                topic="bulk").column("msg_id").to_pylist()
            p.send(Message("orders", b"delayed"), delay_ms=300)
            tx = leader.transaction_producer("tg", Commit())
            ids.append(tx.send_in_transaction(Message("orders", b"in-tx")).msg_id)

            def delivered():  # by the leader's loop, then copied
                with connect(f"rmq://127.0.0.1:{ports[1]}", token=TOKEN) as follower:
                    bodies = [b for q in follower.queue_ids("orders") for b in follower.read_arrow(
                        "orders", q, 0, follower.max_offset("orders", q)).column(
                        "body").to_pylist()]
                return b"delayed" in bodies

            wait_for("the delivery is replicated", delivered, procs["b"])
            with connect(f"rmq://127.0.0.1:{ports[1]}", token=TOKEN) as follower, \
                    pytest.raises(NotLeaderError, match=str(ports[0])):
                follower.producer("g").send(Message("orders", b"refused"))
            live = stats_json(b)
            assert live["role"] == "follower" and live["epoch"] == 1 and live["running"]
            assert live["lag_bytes"] is not None

            procs["b"].send_signal(signal.SIGKILL)
            procs["b"].wait(timeout=30)
            p.send_table(pa.table({"body": [b"later-%d" % i for i in range(3000)]}),
                         topic="bulk")
            leader.flush()
        procs["b"] = serve(b, ports[1], rs, str(token_file))
        lead = wait_for("the leader's end", lambda: served(a, procs["a"]))
        end = lead["replication"]["end"]
        wait_for("the follower catches up", lambda: (s := served(b, procs["b"])) and
                 s["replication"]["end"] == end, procs["b"])
        assert commitlog_bytes(b, end) == commitlog_bytes(a, end)
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=60)
        stopped = stats_json(b)
        assert stopped["role"] == "follower" and not stopped["running"]
        assert stopped["lag_bytes"] is None
        assert stats_json(a)["role"] == "leader"
    finally:
        stop_all(procs)


def test_a_synchronous_leader_killed_and_the_running_follower_promoted_by_rmq_promote(
        tmp_path):
    """Two ``rmq serve`` processes with ``min_insync_replicas: 2``: every acknowledged send
    is on the follower when the leader is SIGKILLed; ``rmq promote`` on the running
    follower makes it the leader, which delivers the timers due; its clients read below its
    high watermark, which stays where it was while its follower is gone."""
    ports, _rs, _token, _a, b, procs = start_pair(tmp_path, min_insync_replicas=2,
                                                 replica_ack_timeout_ms=10_000)
    try:
        acked = []
        with connect(f"rmq://127.0.0.1:{ports[0]}", token=TOKEN, timeout_s=30) as leader:
            p = leader.producer("g")
            for i in range(30):
                p.send(Message("orders", b"m-%d" % i))
                acked.append(b"m-%d" % i)
            p.send(Message("orders", b"timer"), delay_ms=3_000)  # due after the failover
            acked.append(b"timer")
        procs["a"].send_signal(signal.SIGKILL)
        procs["a"].wait(timeout=30)
        out = subprocess.run([sys.executable, "-m", "rmq_cli.cli", "promote", "--store", b,
                              "--json"], env=ENV, capture_output=True, timeout=120,
                             check=False)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        assert json.loads(out.stdout)["epoch"] == 2
        def delivered():  # (its own log, as its services see it)
            with StoreReader.open(b) as store:
                bodies = [v for q in store.queue_ids("orders") for v in store.read_arrow(
                    "orders", q, 0, store.max_offset("orders", q)).column("body").to_pylist()]
            return bodies if b"timer" in bodies else None

        bodies = wait_for("the new leader delivers the timer", delivered, procs["b"])
        assert sorted(bodies) == sorted(acked)  # every acknowledged send, each once
        with connect(f"rmq://127.0.0.1:{ports[1]}", token=TOKEN, timeout_s=30) as new:
            seen = [v for q in new.queue_ids("orders") for v in new.read_arrow(
                "orders", q, 0, new.max_offset("orders", q)).column("body").to_pylist()]
        # min_insync_replicas 2 and no follower: what it delivered alone is not read yet
        assert set(seen) <= set(acked) and b"timer" not in seen
        assert stats_json(b)["role"] == "leader"
    finally:
        stop_all(procs)
