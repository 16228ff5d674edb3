"""A process killed at every write of the timer and transaction paths (store.files.crash_points),
then reopened: no delayed message early, none lost, none delivered twice; no transaction
ended twice.

A child process runs one workload on a fake clock with one crash point armed
(``RMQ_CRASH_AT=<point>:<before|after>:<n>``): timer messages (short delays, and long ones
that roll), delay-level messages, keyed messages (half of them replaced), a recurring
schedule, half messages, commits and check rounds.  It writes its clock before each step.
The parent reopens the store at that clock (nothing due later may be visible), then runs the
rest of the workload and checks every message once, at or after its due time.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap

import pytest

from store import LocalTransactionState, Message, MessageStore
from store.files.crash_points import POINTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = 1_700_000_000_000
END = T0 + 520_000  # past the long delays (rolled: the SMALL wheel spans 409.6 s)
SHORT = {b"s%02d" % i: 2_000 + 50 * i for i in range(40)}
LONG = {b"l%d" % i: 450_000 + 10_000 * i for i in range(4)}
LEVELS = {b"v%02d" % i: 1 + i % 2 for i in range(20)}  # levels 1 (1 s) and 2 (5 s)
KEYS = ["k%d" % i for i in range(5)]
COMMIT = 3  # the first three of the parent's halves are committed at T0 + 10 s
STEP = 1_000

WORKLOAD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from conftest import SMALL
    from store import LocalTransactionState, Message, MessageStore

    path, start, end, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    now = [start]

    class Undecided:
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, view):
            return LocalTransactionState.UNKNOW

    def note_clock():
        with open(os.path.join(path, "..", "clock"), "w") as fh:
            fh.write(str(now[0]))

    note_clock()
    store = MessageStore.open(path, SMALL, clock=lambda: now[0])
    if start == {t0}:
        tx = store.transaction_producer("child-tx", Undecided())
        for i in range(2):
            tx.send_in_transaction(Message("paid", b"child%d" % i))
    while now[0] <= end:
        note_clock()
        store.deliver_due()
        if now[0] == {t0} + 10_000:
            ids = open(os.path.join(path, "..", "commit")).read().split()
            store.end_transactions([(i, LocalTransactionState.COMMIT_MESSAGE) for i in ids])
        if now[0] in ({t0} + 20_000, {t0} + 40_000):
            store.check_transactions(lambda view: LocalTransactionState.UNKNOW)
        now[0] += step if now[0] < {t0} + 60_000 else 10 * step  # the long delays: coarser
    store.close()
""")


def _prepare(path: str, small_config) -> list[str]:
    clock = [T0]
    with MessageStore.open(path, small_config, clock=lambda: clock[0]) as store:
        p = store.producer("g")
        for body, delay in {**SHORT, **LONG}.items():
            p.send(Message("timer", body), delay_ms=delay)
        for body, level in LEVELS.items():
            p.send(Message("levels", body), delay_level=level)
        for key in KEYS:
            p.send(Message("keyed", b"old-" + key.encode()), delay_ms=3_000, key=key)
            p.send(Message("keyed", b"new-" + key.encode()), delay_ms=4_000, key=key)
        p.schedule(Message("every", b"tick"), key="tick", every_ms=1_000,
                   start_at_ms=T0 + 1_000, max_fires=5)

        class Undecided:
            def execute_local_transaction(self, message, arg):
                return LocalTransactionState.UNKNOW

            def check_local_transaction(self, view):
                return LocalTransactionState.UNKNOW

        tx = store.transaction_producer("tx", Undecided())
        ids = [tx.send_in_transaction(Message("paid", b"tx%d" % i)).transaction_id
               for i in range(6)]
    return ids[:COMMIT]


def _run_child(path: str, start: int, arm: str | None) -> subprocess.CompletedProcess:
    script = WORKLOAD.format(root=ROOT, tests=os.path.join(ROOT, "tests"), t0=T0)
    env = {k: v for k, v in os.environ.items() if k != "RMQ_CRASH_AT"}
    if arm:
        env["RMQ_CRASH_AT"] = arm
    return subprocess.run([sys.executable, "-c", script, path, str(start), str(END), str(STEP)],
                          env=env, capture_output=True, text=True, timeout=300)


def _views(store: MessageStore, topic: str):
    if topic not in store.topics():
        return []
    return [v for q in store.queue_ids(topic)
            for v in store.pull(topic, q, 0, store.max_offset(topic, q) + 1)]


def _due(view) -> int | None:
    body = view.body
    if view.topic == "timer":
        return T0 + {**SHORT, **LONG}[body]
    if view.topic == "levels":
        return T0 + (1_000 if LEVELS[body] == 1 else 5_000)
    if view.topic == "keyed":
        return T0 + 4_000
    return None


def _check_none_early(store: MessageStore, now: int) -> None:
    for topic in ("timer", "levels", "keyed"):
        for v in _views(store, topic):
            due = _due(v) if v.body in {**SHORT, **LONG, **LEVELS} or topic == "keyed" else None
            assert due is None or due <= now, f"{topic} {v.body!r} due T0+{due - T0} " \
                f"visible at T0+{now - T0}"


def _check_all_once(store: MessageStore, committed: list[str]) -> None:
    for topic, want in (("timer", {**SHORT, **LONG}), ("levels", LEVELS)):
        seen = collections.Counter(v.body for v in _views(store, topic))
        assert seen == collections.Counter(list(want)), (topic, {b: n for b, n in seen.items()
                                                           if n != 1})
        for v in _views(store, topic):
            assert v.store_timestamp_ms >= _due(v), (topic, v.body)
    keyed = collections.Counter(v.body for v in _views(store, "keyed"))
    assert keyed == collections.Counter(b"new-" + k.encode() for k in KEYS), keyed
    assert collections.Counter(v.body for v in _views(store, "every")) == {b"tick": 5}
    paid = collections.Counter(v.transaction_id for v in _views(store, "paid"))
    assert paid == collections.Counter(committed), paid  # each commit once, nothing else


def _crash_and_check(tmp_path, small_config, arm: str | None) -> bool:
    """Run the workload with ``arm``; returns whether the child was killed there."""
    path = str(tmp_path / "store")
    committed = _prepare(path, small_config)
    (tmp_path / "commit").write_text(" ".join(committed))
    done = _run_child(path, T0, arm)
    killed = done.returncode == -9
    assert killed or done.returncode == 0, done.stderr[-3000:]
    now = int((tmp_path / "clock").read_text())
    with MessageStore.open(path, small_config, clock=lambda: now) as store:
        store.deliver_due()
        _check_none_early(store, now)
    if killed:  # the rest of the workload, from the step the child died in
        done = _run_child(path, now, None)
        assert done.returncode == 0, done.stderr[-3000:]
    with MessageStore.open(path, small_config, clock=lambda: END) as store:
        if now < T0 + 10_000 or killed:  # commits the child may not have made: idempotent
            store.end_transactions([(i, LocalTransactionState.COMMIT_MESSAGE)
                                    for i in committed])
        _check_all_once(store, committed)
    return killed


def test_the_workload_without_a_crash(tmp_path, small_config):
    assert not _crash_and_check(tmp_path, small_config, None)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("point", sorted(POINTS))
def test_a_kill_at_every_crash_point(tmp_path, small_config, point, when):
    killed = _crash_and_check(tmp_path, small_config, f"{point}:{when}:1")
    assert killed, f"the workload never reached {point} ({when}): add it to the workload"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["delivery.append", "timer.checkpoint", "timer.log_append",
                                   "delay_levels.offset_save", "schedules.fire_append"])
def test_a_kill_at_a_later_pass_of_a_busy_point(tmp_path, small_config, point):
    assert _crash_and_check(tmp_path, small_config, f"{point}:after:3")


BOUNDED_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from conftest import SMALL
    from store import MessageStore

    store = MessageStore.open(sys.argv[1], SMALL, clock=lambda: int(sys.argv[2]))
    store.deliver_due()
""")


@pytest.mark.parametrize("topic", ["timer", "levels"])
def test_a_run_left_by_a_kill_redone_in_bounded_steps_delivers_each_once(tmp_path, small_config,
                                                                         topic):
    """A run killed after its deliveries were appended, before its progress was saved, is
    redone by bounded calls (as a restarted server's first ones, before its compiled loops
    are in): the messages the dead run delivered past the first step's reach are skipped by
    every later step too, not only by the first."""
    path = str(tmp_path / "store")
    with MessageStore.open(path, small_config, clock=lambda: T0) as store:
        p = store.producer("g")
        for i in range(20):
            if topic == "timer":  # the dead run delivers the even ones, placed the odd ones
                p.send(Message(topic, b"m%02d" % i), delay_ms=1_000 if i % 2 == 0 else 10_000)
            else:
                p.send(Message(topic, b"m%02d" % i), delay_level=1)
    script = BOUNDED_CHILD.format(root=ROOT, tests=os.path.join(ROOT, "tests"))
    env = dict(os.environ, RMQ_CRASH_AT="delivery.append:after:1")
    done = subprocess.run([sys.executable, "-c", script, path, str(T0 + 2_000)], env=env,
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-3000:]
    with MessageStore.open(path, small_config, clock=lambda: T0 + 20_000) as store:
        assert len(_views(store, topic)) == (10 if topic == "timer" else 20)  # kept
        for _ in range(20):
            store.deliver_due(max_messages=3)
        store.deliver_due()
        seen = collections.Counter(v.body for v in _views(store, topic))
    assert seen == collections.Counter(b"m%02d" % i for i in range(20)), \
        {b: n for b, n in seen.items() if n != 1}
