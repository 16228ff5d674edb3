"""Recurring schedules: every fire exactly once, never early, nothing after a remove or a
pause returned; against a model, across restarts and crashes inside a firing step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import InvalidScheduleError, Message, MessageStore
from store.schedule.schedule_book import (PROPERTY_SCHEDULE_FIRE_MS, PROPERTY_SCHEDULE_FIRES,
                                    PROPERTY_SCHEDULE_KEY)
from tests.conftest import SMALL

T0 = 1_790_000_000_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def fired(store) -> list[tuple[str, int, int]]:
    """(key, fire time, deliver time) of every copy in the store, in store order per queue."""
    return [(k, t, d) for k, t, d, _ in fired_counted(store)]


def fired_counted(store) -> list[tuple[str, int, int, int]]:
    """(key, fire time, deliver time, due times it stands for) of every copy in the store."""
    out = []
    if "orders" not in store.topics():
        return out
    for q in store.queue_ids("orders"):
        batch = store.read_arrow("orders", q, 0, store.max_offset("orders", q))
        for props, deliver in zip(batch.column("properties").to_pylist(),
                                  batch.column("deliver_timestamp").to_pylist()):
            p = dict(props)
            out.append((p[PROPERTY_SCHEDULE_KEY], int(p[PROPERTY_SCHEDULE_FIRE_MS]),
                        int(deliver.timestamp() * 1000), int(p.get(PROPERTY_SCHEDULE_FIRES, 1))))
    return out


class Crash(Exception):
    pass


KEYS = st.sampled_from(["a", "b", "c"])
POLICIES = st.sampled_from(["all", "latest_once", "skip"])
OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), KEYS, st.integers(1, 5).map(lambda k: k * 250),
              st.one_of(st.none(), st.integers(0, 3000)), POLICIES),
    st.tuples(st.just("remove"), KEYS), st.tuples(st.just("pause"), KEYS),
    st.tuples(st.just("resume"), KEYS), st.tuples(st.just("advance"), st.integers(1, 2500)),
    st.tuples(st.just("deliver")), st.tuples(st.just("reopen")),
    st.tuples(st.just("crash"), st.sampled_from(["before_append", "after_flush"])),
), min_size=1, max_size=25)


class Model:
    """What should have fired: per key, its interval, anchor, floor (no fire at or before),
    catch-up policy and whether it is paused; fires happen when a delivery runs: the due
    times it finds go out by the policy (all: each; latest_once: the latest, standing for
    them all; skip: a lone one only)."""

    def __init__(self) -> None:
        self.schedules: dict[str, dict] = {}
        self.fired: list[tuple[str, int, int]] = []  # (key, fire time, stands for)

    def add(self, key, every, start, now, policy="all"):
        old = self.schedules.get(key)
        if old is not None and (old["every"], old["start"]) == (every, start):
            old["policy"] = policy  # the same definition: its progress (and phase) is kept
            return
        anchor = now + every if start is None else start
        # fires from now on: an anchor in the past fires none of its past times
        self.schedules[key] = {"every": every, "anchor": anchor, "floor": now, "paused": False,
                               "last": None, "start": start, "policy": policy}

    def deliver(self, now):
        for key, s in self.schedules.items():
            if s["paused"]:
                continue
            t = s["anchor"]
            if s["last"] is not None:
                t = s["last"] + s["every"]
            while t <= s["floor"]:
                t += s["every"]
            due = []
            while t <= now:
                due.append(t)
                t += s["every"]
            if not due:
                continue
            if s["policy"] == "all":
                self.fired.extend((key, d, 1) for d in due)
            elif s["policy"] == "latest_once" or len(due) == 1:
                self.fired.append((key, due[-1], len(due)))
            s["last"] = due[-1]  # (skip with several due: all dropped; the phase is kept)

    def resume(self, key, now):
        s = self.schedules.get(key)
        if s is not None and s["paused"]:
            s["paused"] = False
            s["floor"] = now  # what fell due while paused is skipped


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS)
def test_fires_exactly_once_never_early_across_restarts_and_crashes(fresh_dir, monkeypatch,
                                                                    ops):
    path = str(fresh_dir("schedules") / "s")
    now = [T0]
    model = Model()
    store = MessageStore.open(path, SMALL, clock=lambda: now[0], flush_service=False)
    try:
        for op in ops:
            kind = op[0]
            if kind == "add":
                _, key, every, start, policy = op
                start = None if start is None else now[0] + start - 1000
                store.producer("g").schedule(Message("orders", b"r"), key=key, every_ms=every,
                                             start_at_ms=start, catch_up=policy)
                model.add(key, every, start, now[0], policy)
            elif kind == "remove":
                assert store.remove_schedule(op[1]) == (model.schedules.pop(op[1], None)
                                                        is not None)
            elif kind == "pause":
                assert store.pause_schedule(op[1]) == (op[1] in model.schedules)
                if op[1] in model.schedules:
                    model.schedules[op[1]]["paused"] = True
            elif kind == "resume":
                assert store.resume_schedule(op[1]) == (op[1] in model.schedules)
                model.resume(op[1], now[0])
            elif kind == "advance":
                now[0] += op[1]
            elif kind == "deliver":
                store.deliver_due()
                model.deliver(now[0])
            elif kind == "reopen":
                store.close()
                store = MessageStore.open(path, SMALL, clock=lambda: now[0], flush_service=False)
            elif kind == "crash":  # a firing step dies at that point; the store is reopened
                book = store.recurring
                if op[1] == "before_append":
                    monkeypatch.setattr(store, "append", _raise)
                else:
                    real_flush = store.flush

                    def flush_then_die():
                        real_flush()
                        raise Crash()
                    monkeypatch.setattr(store, "flush", flush_then_die)
                try:
                    book.fire_due()
                    crashed = False
                except Crash:
                    crashed = True
                monkeypatch.undo()
                if not crashed or op[1] == "after_flush":
                    # the copies were written (or there were none: missed fires dropped)
                    model.deliver(now[0])
                store.close()
                store = MessageStore.open(path, SMALL, clock=lambda: now[0], flush_service=False)
            got = fired_counted(store)
            assert sorted((k, t, n) for k, t, _, n in got) == sorted(model.fired)
            assert all(t <= now[0] and d == t for _, t, d, _ in got)  # never early
        store.deliver_due()
        model.deliver(now[0])
        assert sorted((k, t, n) for k, t, _, n in fired_counted(store)) == sorted(model.fired)
    finally:
        store.close()


def _raise(*args, **kwargs):
    raise Crash()


def test_cron_schedule_in_a_time_zone_and_its_listing(tmp_path):
    now = [T0]  # 2026-09-21T14:13:20Z
    with MessageStore.open(str(tmp_path / "s"), SMALL, clock=lambda: now[0],
                           flush_service=False) as store:
        info = store.producer("g").schedule(
            Message("orders", b"daily", tags="t", keys="k1", properties={"p": "v"}),
            key="daily", cron="0 9 * * *", tz="Europe/Paris", max_fires=2, catch_up="all")
        assert info.next_fire_ms == 1_790_060_400_000  # 2026-09-22T09:00+02:00
        assert info.state == "active"
        now[0] = 1_790_060_400_000 - 1
        assert store.deliver_due() == 0  # never early
        now[0] += 86_400_000 * 3  # three days later: two fires due, max_fires=2
        assert store.deliver_due() == 2
        [info] = store.schedules()
        assert (info.fires, info.next_fire_ms, info.state) == (2, None, "ended")
        rows = [r for q in store.queue_ids("orders")
                for r in store.read_arrow("orders", q, 0, store.max_offset("orders", q))
                .to_pylist()]
        assert [r["tags"] for r in rows] == ["t", "t"] and rows[0]["keys"] == ["k1"]
        assert dict(rows[1]["properties"])["p"] == "v"
        assert len({r["msg_id"] for r in rows}) == 2


def test_replacing_a_schedule_by_its_key(tmp_path):
    now = [T0]
    with MessageStore.open(str(tmp_path / "s"), SMALL, clock=lambda: now[0],
                           flush_service=False) as store:
        p = store.producer("g")
        p.schedule(Message("orders", b"old"), key="k", every_ms=1000)
        p.schedule(Message("orders", b"new"), key="k", every_ms=5000)
        now[0] += 5000
        assert store.deliver_due() == 1
        [info] = store.schedules()
        assert info.every_ms == 5000 and info.fires == 1


@pytest.mark.parametrize("kwargs, words", [
    ({"key": "", "every_ms": 1}, "key"), ({"key": "k"}, "exactly one"),
    ({"key": "k", "cron": "@daily", "every_ms": 5}, "exactly one"),
    ({"key": "k", "every_ms": 0}, "every_ms"), ({"key": "k", "cron": "0 25 * * *"}, "hour"),
    ({"key": "k", "cron": "@daily", "tz": "Nowhere/City"}, "IANA"),
    ({"key": "k", "every_ms": 1000, "start_at_ms": 10, "end_at_ms": 5}, "before"),
    ({"key": "k", "every_ms": 1000, "max_fires": 0}, "max_fires"),
    ({"key": "k", "every_ms": 1000, "catch_up": "some"}, "latest_once"),
    ({"key": "k", "every_ms": 1000, "catch_up_window_ms": -1}, "catch_up_window_ms"),
    ({"key": "k", "every_ms": 99}, "every_ms=99 is below this store's floor of 100 ms"),
])
def test_bad_schedules_are_refused_and_change_nothing(tmp_path, kwargs, words):
    with MessageStore.open(str(tmp_path / "s"), SMALL) as store:
        with pytest.raises(InvalidScheduleError, match=words):
            store.producer("g").schedule(Message("orders", b"x"), **kwargs)
        assert store.schedules() == []


FIRING_CHILD = """
import sys, time
from store import MessageStore, Message
from tests.conftest import SMALL
now = [int(sys.argv[2])]
with MessageStore.open(sys.argv[1], SMALL, clock=lambda: now[0], flush_service=False) as s:
    print("ready", flush=True)
    while True:
        now[0] += 50
        s.deliver_due()
"""


@pytest.mark.slow
def test_a_process_killed_while_firing_leaves_each_fire_once(tmp_path):
    """SIGKILL a process firing 200 schedules every 50 ms of a fast clock, at random moments;
    after the last reopen every due fire is in the store exactly once."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, SMALL, clock=lambda: T0, flush_service=False) as store:
        p = store.producer("g")
        for i in range(200):
            p.schedule(Message("orders", b"x" * 20), key=f"k{i}", every_ms=100, catch_up="all",
                       start_at_ms=T0 + 1 + i % 100)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        x for x in (ROOT, os.environ.get("PYTHONPATH")) if x))
    start = T0
    for round_ in range(4):
        child = subprocess.Popen([sys.executable, "-c", FIRING_CHILD, path, str(start)],
                                 env=env, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3 + 0.2 * round_)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        start += 3_000  # a later clock each round (the child's own clock went on)
    # past any time a child's own clock reached (50 ms per step, for under a second each)
    end = start + 60_000
    with MessageStore.open(path, SMALL, clock=lambda: end, flush_service=False) as store:
        assert len(fired(store)) > 200  # the killed processes fired
        store.deliver_due()
        got = [(k, t) for k, t, _ in fired(store)]
        assert len(got) == len(set(got))  # nothing twice
        per_key: dict[str, list[int]] = {}
        for k, t in got:
            per_key.setdefault(k, []).append(t)
        for i in range(200):  # nothing missing: every due time from the first on
            times = sorted(per_key[f"k{i}"])
            assert times == list(range(T0 + 1 + i % 100, end + 1, 100)), f"k{i}"


def test_a_book_left_only_as_its_backup_keeps_every_schedule(tmp_path):
    """An earlier version, killed between the two renames of a book write, left the book
    only as ``rmq_schedules.json.bak``: the schedules are all still there and fire on (they
    were read as none and the next write saved an empty book)."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, SMALL, clock=lambda: T0, flush_service=False) as store:
        p = store.producer("g")
        for i in range(3):
            p.schedule(Message("orders", b"x"), key=f"k{i}", every_ms=100, start_at_ms=T0 + 100)
    book = os.path.join(path, "config", "rmq_schedules.json")
    os.replace(book, book + ".bak")
    with MessageStore.open(path, SMALL, clock=lambda: T0 + 150, flush_service=False) as store:
        assert [s.key for s in store.schedules()] == ["k0", "k1", "k2"]
        assert store.deliver_due() == 3
    with MessageStore.open(path, SMALL, clock=lambda: T0 + 250, flush_service=False) as store:
        assert [s.key for s in store.schedules()] == ["k0", "k1", "k2"]
        assert store.deliver_due() == 3
        assert sorted(k for k, _, _ in fired(store)) == ["k0", "k0", "k1", "k1", "k2", "k2"]


def test_a_read_only_view_lists_schedules_and_refuses_changes(tmp_path):
    from store import ReadOnlyStoreError, StoreReader

    path = str(tmp_path / "s")
    with MessageStore.open(path, SMALL) as store:
        store.producer("g").schedule(Message("orders", b"x"), key="k", every_ms=1000)
        expected = store.schedules()
    reader = StoreReader.open(path)
    try:
        assert reader.schedules() == expected
        for method in ("remove_schedule", "pause_schedule", "resume_schedule"):
            with pytest.raises(ReadOnlyStoreError):
                getattr(reader, method)("k")
    finally:
        reader.close()


@pytest.mark.parametrize("then", ["carry_on", "killed", "another_process"])
def test_bounded_calls_write_the_book_once_and_fire_each_time_once(tmp_path, then):
    """A fresh process fires in bounded calls (MessageStore.deliver_due until its compiled
    loops are in): the book is written at the end of the step only; a process killed between
    the calls, or another one taking over, still leaves every fire exactly once."""
    import pyarrow as pa

    from store.schedule.schedule_book import ScheduleBook

    path, now = str(tmp_path / "s"), [T0]
    n = 50
    with MessageStore.open(path, SMALL, clock=lambda: now[0]) as s:
        s.producer().schedule_table(pa.table({
            "key": [f"k{i:02d}" for i in range(n)], "body": [b"x"] * n,
            "every_ms": pa.array([1000] * n, pa.int64())}), topic="orders")
        book_file = os.path.join(path, "config", "rmq_schedules.json")
        written = os.stat(book_file).st_mtime_ns
        now[0] += 1000
        assert [s.recurring.fire_due(10) for _ in range(3)] == [10, 10, 10]
        assert os.stat(book_file).st_mtime_ns == written  # not yet: the step goes on
        assert os.path.exists(os.path.join(path, "config", "rmq_schedules.mark"))
        if then == "carry_on":
            assert s.recurring.fire_due(10) == 10 and s.recurring.fire_due(10) == 10
            assert s.recurring.fire_due(10) == 0
            assert os.stat(book_file).st_mtime_ns != written
            assert not os.path.exists(os.path.join(path, "config", "rmq_schedules.mark"))
        elif then == "another_process":  # a second book: what another process would see
            other = ScheduleBook(s)
            assert other.fire_due() == 20
            assert s.recurring.fire_due() == 0  # this one sees the book the other wrote
        else:
            s.recurring = ScheduleBook(s)  # the first one dies with its parsed copy
    with MessageStore.open(path, SMALL, clock=lambda: now[0]) as s:
        s.deliver_due()
        got = fired(s)
        assert sorted(k for k, _, _ in got) == [f"k{i:02d}" for i in range(n)]
        assert all(f == T0 + 1000 for _, f, _ in got)
        assert {i.key: i.fires for i in s.schedules()} == {f"k{i:02d}": 1 for i in range(n)}
