"""The timer wheel at the edges of time: a long wait with the deliverer running, a deliverer
stalled for hours and resumed, a delay longer than the wheel across many restarts.  A fake
clock moves; nothing sleeps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from store import Message, MessageStore
from tests.conftest import SMALL

HOUR = 3_600_000
N = 20_000
#: the timer as RocketMQ's default (a second a slot, a two-day roll window: a delay of hours
#: is placed, not rolled), the other files small
WIDE = dataclasses.replace(SMALL, timer_precision_ms=1000, timer_wheel_slots=2 * 604_800,
                           timer_roll_window_slots=172_800)


def _send_delayed(store, delays_ms: np.ndarray) -> dict[str, int]:
    """Send one message per delay (bodies are the indices); ``{msg_id: due time}``."""
    table = pa.table({"body": [str(i).encode() for i in range(len(delays_ms))],
                      "delay_ms": pa.array(delays_ms, pa.int64())})
    out = store.producer("g").send_table(table, topic="t")
    return dict(zip(out.column("msg_id").to_pylist(), out.column("deliver_at_ms").to_pylist()))


def _delivered(store) -> pa.Table:
    """``msg_id`` and ``store_timestamp`` (ms) of every message of topic ``t``."""
    parts = [store.read_arrow("t", q, 0, store.max_offset("t", q)).select(
        ["msg_id", "store_timestamp"]) for q in store.queue_ids("t")] if "t" in store.topics() \
        else []
    if not parts:
        return pa.table({"msg_id": pa.array([], pa.string()),
                         "store_ms": pa.array([], pa.int64())})
    table = pa.Table.from_batches(parts)
    stamps = table.column("store_timestamp").cast(pa.timestamp("ms")).cast(pa.int64())
    return pa.table({"msg_id": table.column("msg_id"), "store_ms": stamps})


def _lateness(store, due: dict[str, int]) -> tuple[np.ndarray, list[str]]:
    got = _delivered(store)
    ids = got.column("msg_id").to_pylist()
    stored = got.column("store_ms").to_numpy()
    return stored - np.array([due[i] for i in ids], dtype=np.int64), ids


def _step_to(store, clock, until: int, step: int) -> None:
    while clock() < until:
        clock.advance(min(step, until - clock()))
        store.deliver_due()


@pytest.mark.slow
def test_twenty_thousand_delayed_two_hours_arrive_within_the_precision(tmp_path, clock):
    """20,000 messages due two hours on (spread over 20 s), the deliverer running all along
    (a step every 10 s, every 100 ms near the due times): each arrives once, never early,
    at most ``timer_precision_ms`` late."""
    clock.set(clock() - clock() % 1000)
    with MessageStore.open(str(tmp_path / "s"), WIDE, clock=clock) as store:
        due = _send_delayed(store, 2 * HOUR + np.arange(N, dtype=np.int64))
        first = min(due.values())
        _step_to(store, clock, first - 2_000, 10_000)
        assert store.deliver_due() == 0 and store.timer.pending_count() == N
        _step_to(store, clock, max(due.values()) + 2 * WIDE.timer_precision_ms, 100)
        late, ids = _lateness(store, due)
        assert len(ids) == len(set(ids)) == N
        assert late.min() >= 0 and late.max() <= WIDE.timer_precision_ms
        assert store.timer.pending_count() == 0


@pytest.mark.slow
def test_a_stall_of_three_hours_delivers_the_overdue_at_once_and_the_rest_on_time(tmp_path,
                                                                                   clock):
    """20,000 messages due between 2 h 59 min and 3 h 1 min on; the deliverer stalls for
    3 hours: its first step after delivers every overdue one, later steps the rest on time."""
    clock.set(clock() - clock() % 1000)
    with MessageStore.open(str(tmp_path / "s"), WIDE, clock=clock) as store:
        start = clock()
        delays = 3 * HOUR - 60_000 + np.arange(N, dtype=np.int64) * 6  # 2 min of due times
        due = _send_delayed(store, delays)
        store.deliver_due()
        clock.set(start + 3 * HOUR)  # nothing delivered meanwhile
        overdue = sum(d <= clock() for d in due.values())
        assert 0 < overdue < N
        assert store.deliver_due() == overdue  # the first step delivers every overdue one
        late, ids = _lateness(store, due)
        assert sorted(ids) == sorted(i for i, d in due.items() if d <= clock())
        _step_to(store, clock, max(due.values()) + 2 * WIDE.timer_precision_ms, 250)
        late, ids = _lateness(store, due)
        assert len(ids) == len(set(ids)) == N
        on_time = np.array([due[i] > start + 3 * HOUR for i in ids])
        assert late.min() >= 0 and late[on_time].max() <= WIDE.timer_precision_ms


def test_a_delay_longer_than_the_wheel_arrives_once_on_time_across_ten_restarts(tmp_path,
                                                                               clock):
    """Delays of one to three wheel spans (rolled again and again), the store closed and
    reopened ten times on the way (the clock going on while it is closed): each message
    arrives once, never early, at most a precision late."""
    precision = SMALL.timer_precision_ms
    span = SMALL.timer_wheel_slots * precision  # 409.6 s
    clock.set(clock() - clock() % precision)
    path = str(tmp_path / "s")
    store = MessageStore.open(path, SMALL, clock=clock)
    try:
        delays = [span + 5_037, 2 * span + 13, 3 * span - 1, 3 * span + 777]
        due = {}
        for d in delays:
            r = store.producer("g").send(Message("t", str(d).encode()), delay_ms=d)
            due[r.msg_id] = r.deliver_at_ms
        end = max(due.values()) + 2 * precision
        # near each due time a step every 50 ms, elsewhere every 5 s; the restarts between
        windows = [(d - 1_000, d + 2 * precision) for d in due.values()]
        restarts = [int(t) for t in np.linspace(clock() + 60_000, end - 10_000, 10)
                    if not any(lo - 2_000 <= t <= hi for lo, hi in windows)]
        restarts = (restarts + [end - 5_000] * 10)[:10]
        while clock() < end:
            now = clock()
            near = any(lo <= now < hi for lo, hi in windows)
            step = 50 if near else min([5_000] + [lo - now for lo, _ in windows if lo > now])
            clock.advance(step)
            store.deliver_due()
            while restarts and clock() >= restarts[0]:
                restarts.pop(0)
                store.close()
                if not near:
                    clock.advance(1_234)  # closed for a while
                store = MessageStore.open(path, SMALL, clock=clock)
        assert not restarts
        late, ids = _lateness(store, due)
        assert sorted(ids) == sorted(due)  # each once
        assert late.min() >= 0 and late.max() <= precision
        assert store.timer.pending_count() == 0
    finally:
        store.close()
