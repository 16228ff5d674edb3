"""``rmq serve`` / StoreServer: due delivery with no reader, SIGTERM, SIGKILL and restart,
one server per store, retention on its schedule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from conftest import SMALL, FakeClock

from rmq_cli.cli import main
from store import Message, MessageStore, StoreError, StoreServer, server_status
from store.operations import server as server_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P = SMALL.timer_precision_ms


def _serve(path: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "rmq_cli.cli", "serve", "--store", path,
                             "--create",
                             "--log-level", "WARNING", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_attached(path: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status = server_status(path)
        if status and status["attached"] and status.get("running"):
            return
        assert proc.poll() is None, proc.communicate()
        if time.monotonic() >= deadline:
            proc.kill()
            raise AssertionError(f"the server never reported itself running: {status}; "
                                 f"its stderr: {proc.communicate()[1][-3000:]!r}")
        time.sleep(0.05)


def _count(store, topic: str) -> int:
    return sum(store.max_offset(topic, q) for q in store.queue_ids(topic)) \
        if topic in store.topics() else 0


def _views(store, topic: str):
    out = []
    for q in store.queue_ids(topic):
        end = store.max_offset(topic, q)
        if end:
            out += store.pull(topic, q, 0, end)
    return out


def _send(store, n_timer: int, n_level: int, rng) -> None:
    p = store.producer("load")
    if n_timer:
        p.send_table(pa.table({
            "body": [b"t%06d" % i for i in range(n_timer)],
            "delay_ms": pa.array(rng.integers(500, 5001, size=n_timer), pa.int64())}),
            topic="timeouts")
    if n_level:
        p.send_table(pa.table({
            "body": [b"l%06d" % i for i in range(n_level)],
            "delay_level": pa.array(rng.integers(1, 3, size=n_level), pa.int64())}),
            topic="reminders")


def _wait_for(store, want: dict[str, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_count(store, t) < n for t, n in want.items()):
        assert time.monotonic() < deadline, {t: _count(store, t) for t in want}
        time.sleep(0.1)


def test_serve_delivers_on_time_with_no_reader(tmp_path):
    path = str(tmp_path / "store")
    MessageStore.open(path, SMALL).close()
    proc = _serve(path)
    try:
        _wait_attached(path, proc)
        floor, done = [], threading.Event()

        def scheduling_floor() -> None:
            """How late this machine wakes a sleeper at each precision tick, meanwhile: the
            server cannot be more punctual than the scheduler lets any process be."""
            while not done.is_set():
                now = time.time()
                tick = (int(now * 1000) // P + 1) * P / 1000
                time.sleep(tick - now)
                floor.append((time.time() - tick) * 1000)

        watcher = threading.Thread(target=scheduling_floor, daemon=True)
        watcher.start()
        with MessageStore.open(path, SMALL) as store:  # this process never delivers
            _send(store, 5_000, 5_000, np.random.default_rng(1))
            _wait_for(store, {"timeouts": 5_000, "reminders": 5_000}, 30)
            views = _views(store, "timeouts") + _views(store, "reminders")
        done.set()
        watcher.join()
        late = np.array([v.store_timestamp_ms - v.deliver_timestamp_ms for v in views])
        slack = float(np.percentile(floor, 99)) if floor else 0.0
        print("lateness p50/p99/max ms:", np.percentile(late, [50, 99, 100]).tolist(),
              "scheduling floor p99 ms:", slack)
        assert len(views) == 10_000 and len({v.msg_id for v in views}) == 10_000
        assert late.min() >= 0  # never early
        # The typical message within a precision and 100 ms of its due time, plus what the
        # machine's scheduler cost a sleeper in the same seconds (0-5 ms on a quiet machine);
        # a quiet machine gives p50 ~55 ms and p99 ~110 ms here (bench/bench_timer.py
        # measures lateness properly).  The tail gets 500 ms more: under the suite's two
        # workers the server, a third busy process on two cores, was measured at p99 246 and
        # 283 ms while a sleeper's p99 was 13 ms, so CPU share, not the server, set the tail.
        # A server that polled late (say every second) still fails both bounds.
        p50, p99 = np.percentile(late, [50, 99])
        assert p50 <= P + 100 + slack, (np.percentile(late, [50, 99, 100]), slack)
        assert p99 <= P + 600 + slack, (np.percentile(late, [50, 99, 100]), slack)
        status = server_status(path)
        assert status["attached"] and status["delivered"] == 10_000
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert b"stopped; 10000 delivered" in err
    status = server_status(path)
    assert status == {**status, "attached": False, "running": False}


def test_killed_and_restarted_under_load_delivers_each_once(tmp_path):
    path = str(tmp_path / "store")
    MessageStore.open(path, SMALL).close()
    rng = np.random.default_rng(2)
    proc = _serve(path)
    try:
        _wait_attached(path, proc)
        with MessageStore.open(path, SMALL) as store:
            for _ in range(6):  # load keeps arriving while the server delivers
                _send(store, 500, 100, rng)
                time.sleep(0.25)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            _send(store, 500, 100, rng)  # sent while no server runs
            time.sleep(0.5)
            proc = _serve(path)
            _wait_attached(path, proc)
            _wait_for(store, {"timeouts": 3_500, "reminders": 700}, 40)
            time.sleep(3 * P / 1000)
            views = _views(store, "timeouts") + _views(store, "reminders")
        assert len(views) == 4_200
        assert len({v.msg_id for v in views}) == 4_200  # none twice
        assert min(v.store_timestamp_ms - v.deliver_timestamp_ms for v in views) >= 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def _stats(path: str) -> dict:
    r = CliRunner().invoke(main, ["stats", "--store", path, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_one_server_per_store_and_stats_show_it(store_path):
    clock = FakeClock()
    with MessageStore.open(store_path, SMALL, clock=clock) as store:
        store.producer("g").send(Message("t", b"x"), delay_ms=1_000)
    data = _stats(store_path)
    assert data["server"] is None and data["due_behind_ms"] > 0  # due, nobody delivered it
    first = StoreServer(store_path, SMALL)
    try:
        with pytest.raises(StoreError, match="another rmq server already runs"):
            StoreServer(store_path, SMALL)
        first.step()
        data = _stats(store_path)
        assert data["server"]["attached"] and data["server"]["delivered"] == 1
        assert data["due_behind_ms"] == 0
        assert "server: attached" in CliRunner().invoke(main, ["stats", "--store",
                                                               store_path]).stdout
    finally:
        first.close()
    second = StoreServer(store_path, SMALL)  # the lock is free again
    second.close()


def test_stop_ends_run_after_the_current_step(store_path):
    server = StoreServer(store_path, SMALL)
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + 30
    while server.counters.delivery_runs < 3:  # one step per precision (100 ms)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.stop()
    thread.join(timeout=2 * P / 1000 + 1)
    assert not thread.is_alive()
    assert server_status(store_path) == {**server_status(store_path), "attached": False,
                                         "running": False}


def _fill_segments(store, clock, segments: int) -> None:
    p = store.producer("g")
    while len(store.commit_log.files.files) < segments:
        p.send_batch([Message("t", bytes(1000)) for _ in range(20)])
        clock.advance(1_000)


def test_retention_runs_at_its_hour_and_keeps_what_is_pending(store_path, monkeypatch):
    clock = FakeClock()
    hour = time.localtime(clock() / 1000).tm_hour
    other = (hour + 12) % 24
    monkeypatch.setattr(server_module, "disk_used_ratio", lambda path: 0.10)
    config = SMALL.replace(delete_when=f"{other:02d}", file_reserved_time_hours=1)
    server = StoreServer(store_path, config, clock=clock)
    try:
        store = server.store
        _fill_segments(store, clock, 3)
        pending = store.producer("g").send(Message("later", b"x"), delay_ms=30 * 86_400_000)
        _fill_segments(store, clock, 8)
        clock.advance(2 * 3_600_000)  # everything is past its reserved time
        assert server.retention() == 0  # not a delete_when hour, disk not full
        server.hours = frozenset({time.localtime(clock() / 1000).tm_hour})
        deleted = server.retention()
        # the segments before the pending delayed message go; its segment and later stay
        assert deleted >= 2
        assert store.commit_log.min_offset() <= pending.commitlog_offset
        assert server.counters.segments_deleted == deleted
    finally:
        server.close()


def test_a_full_disk_forces_retention_at_any_hour(store_path, monkeypatch):
    clock = FakeClock()
    hour = time.localtime(clock() / 1000).tm_hour
    config = SMALL.replace(delete_when=f"{(hour + 12) % 24:02d}")
    server = StoreServer(store_path, config, clock=clock)
    try:
        _fill_segments(server.store, clock, 6)
        monkeypatch.setattr(server_module, "disk_used_ratio", lambda path: 0.80)
        assert server.retention() == 0  # over 75 %: runs, but nothing is 72 h old
        monkeypatch.setattr(server_module, "disk_used_ratio", lambda path: 0.90)
        assert server.retention() == 5  # over 85 %: age ignored, the newest segment kept
    finally:
        server.close()


def test_cli_retention_dry_run_then_run_and_cancel(store_path):
    clock = FakeClock()  # 2023: every segment is long past its reserved time for the CLI
    with MessageStore.open(store_path, SMALL, clock=clock) as store:
        _fill_segments(store, clock, 4)
        p = store.producer("g")
        pending = p.send(Message("later", b"x"), delay_ms=400 * 86_400_000 - 1)
        _fill_segments(store, clock, 8)
        segment = store.commit_log.files.find(pending.commitlog_offset).start
    r = CliRunner().invoke(main, ["retention", "--store", store_path, "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)["segments"]
    actions = [p["action"] for p in plan]
    kept = next(i for i, p in enumerate(plan) if p["start"] == segment)
    assert actions[:kept] == ["delete"] * kept and actions[kept] == "needed"
    assert set(actions[kept + 1:]) == {"after a kept segment"}
    r = CliRunner().invoke(main, ["retention", "--store", store_path])
    assert r.exit_code == 0, r.output
    assert f"deleted {kept} of {len(plan)} segment(s)" in r.stderr
    with MessageStore.open(store_path, SMALL) as store:  # the real clock from here on
        assert store.commit_log.min_offset() == segment
        cancelled = store.producer("g").send(Message("later", b"y"), delay_ms=600_000)
    r = CliRunner().invoke(main, ["cancel", "--store", store_path, "--topic", "later",
                                  "--msg-id", cancelled.msg_id])
    assert r.exit_code == 0 and f"cancelled {cancelled.msg_id}" in r.stdout, r.output
    r = CliRunner().invoke(main, ["cancel", "--store", store_path, "--topic", "later",
                                  "--msg-id", cancelled.msg_id, "--msg-id", "nope"])
    assert r.exit_code == 1 and "not pending" in r.stderr


def test_cli_pending_lists_the_next_due_and_the_oldest_open(store_path):
    from store import LocalTransactionState

    with MessageStore.open(store_path, SMALL) as store:  # the real clock: the CLI's
        p = store.producer("g")
        later = p.send(Message("t", b"later"), delay_ms=60_000)
        soon = p.send(Message("t", b"soon"), delay_ms=30_000)
        gone = p.send(Message("t", b"gone"), delay_ms=20_000)
        assert p.cancel("t", gone.msg_id)
        level = p.send(Message("t", b"level"), delay_level=3)
        store.deliver_due()  # the timer records into the wheel
        p.send(Message("t", b"queued"), delay_ms=90_000)  # still in the queue
        class Undecided:
            def execute_local_transaction(self, message, arg):
                return LocalTransactionState.UNKNOW

            def check_local_transaction(self, view):
                return LocalTransactionState.UNKNOW

        tx = store.transaction_producer("payments", Undecided()).send_in_transaction(
            Message("pay", b"p"))
    r = CliRunner().invoke(main, ["pending", "--store", store_path, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [i["msg_id"] for i in data["timer"]][:2] == [soon.msg_id, later.msg_id]
    assert gone.msg_id not in {i["msg_id"] for i in data["timer"]}  # cancelled
    assert len(data["timer"]) == 3 and data["timer"][2]["topic"] == "t"
    assert [i["msg_id"] for i in data["delay_levels"]] == [level.msg_id]
    assert [(t["transaction_id"], t["producer_group"], t["topic"]) for t in
            data["transactions"]] == [(tx.transaction_id, "payments", "pay")]
    r = CliRunner().invoke(main, ["pending", "--store", store_path, "--limit", "1"])
    assert r.exit_code == 0 and "timer messages: 1 shown" in r.stdout


def test_in_process_listeners_answer_the_servers_rounds(store_path):
    from store import LocalTransactionState

    clock = FakeClock()

    class Listener:
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, view):  # odd orders were paid
            return ("COMMIT" if int(view.keys[0][2:]) % 2 else "ROLLBACK") \
                if view.keys[0] != "o-4" else LocalTransactionState.UNKNOW

    with MessageStore.open(store_path, SMALL, clock=clock) as store:
        txp = store.transaction_producer("pay", Listener())
        ids = [txp.send_in_transaction(Message("paid", b"p", keys=f"o-{i}")).transaction_id
               for i in range(5)]
        clock.advance(60_000)  # past the immunity
        server = StoreServer(store_path, SMALL, clock=clock, check_transactions=True)
        try:
            assert server.check_round() == 5
            last, result = store.answer_check_rounds()  # this process's listener answers
            assert last == 1
            assert (result.checked, result.committed, result.rolled_back, result.unknown) == \
                (5, 2, 2, 1)
            again, result = store.answer_check_rounds(after=last)
            assert (again, result.checked) == (1, 0)  # nothing new
            assert store.transactions.is_ended(ids) == [True, True, True, True, False]
            clock.advance(60_000)
            assert server.check_round() == 1  # only o-4 is asked again, by the server
            last, result = store.answer_check_rounds(after=last)
            assert (last, result.checked, result.unknown) == (2, 1, 1)
        finally:
            server.close()


def test_check_rounds_follow_the_recorded_check_interval(store_path):
    """A server opened with default settings runs rounds at the interval the producers'
    store recorded (config/transactionConfig.json), not at the 30 s default."""
    MessageStore.open(store_path, SMALL.replace(transaction_check_interval_ms=1_500)).close()
    server = StoreServer(store_path, check_transactions=True)
    try:
        before = time.monotonic()
        server.step()
        assert server.counters.check_rounds == 1
        assert server._next_check - before <= 1.5 + 0.5
    finally:
        server.close()


def test_serve_a_store_group_runs_a_server_per_store(tmp_path):
    from store import StoreGroup

    path = str(tmp_path / "group")
    with StoreGroup.create(path, 2, SMALL) as group:
        p = group.producer("g")
        sent = [p.send(Message("t", f"m{i}".encode()), delay_ms=300 + 100 * i) for i in range(10)]
    assert {r.store_name for r in sent} == {"store-0", "store-1"}
    proc = _serve(path)
    try:
        for _, member in StoreGroup.members(path):
            _wait_attached(member, proc)
        deadline = time.monotonic() + 30
        while True:
            with StoreGroup.open(path, read_only=True) as group:
                counts = [_count(s, "t") for _, s in group.stores()]
            if sum(counts) == 10 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert sum(counts) == 10 and min(counts) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert b"10 delivered" in err and b"in 2 stores" in err
    with StoreGroup.open(path, read_only=True) as group:
        assert all(not server_status(m)["attached"] for m in group.layout.paths)


def test_serve_fires_recurring_schedules_with_no_reader(tmp_path):
    path = str(tmp_path / "store")
    MessageStore.open(path, SMALL).close()
    proc = _serve(path)
    try:
        _wait_attached(path, proc)
        with MessageStore.open(path, SMALL) as store:
            store.producer("g").schedule(Message("reminders", b"pay"), key="o1",
                                         every_ms=300, max_fires=5, catch_up="all")
        deadline = time.time() + 30
        while time.time() < deadline:
            with MessageStore.open(path, SMALL) as store:  # this process never delivers
                [info] = store.schedules()
                if info.state == "ended":
                    rows = [r for q in store.queue_ids("reminders") for r in store.read_arrow(
                        "reminders", q, 0, store.max_offset("reminders", q)).to_pylist()]
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the server did not fire the five reminders")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    fires = sorted(int(dict(r["properties"])["RMQ_SCHEDULE_FIRE_MS"]) for r in rows)
    assert len(fires) == 5 and all(b - a == 300 for a, b in zip(fires, fires[1:]))
    late = [r["store_timestamp"].timestamp() * 1000 - int(dict(r["properties"])[
        "RMQ_SCHEDULE_FIRE_MS"]) for r in rows]
    assert min(late) >= 0 and max(late) <= P + 400, late  # never early, about a precision
