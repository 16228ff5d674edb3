"""``queue_bounds``: a reader kept open (a streaming query's driver) answers what a fresh
reader answers, across appends in another store object and retention, against a model: a
fresh ``StoreReader``'s ``min_offset`` / ``max_offset`` of every queue."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SMALL, FakeClock
from store import Message, MessageStore, StoreReader, UnknownTopicError

OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(0, 5), st.integers(1, 200)),
    st.tuples(st.just("retention"), st.just(0), st.just(0)),
), min_size=1, max_size=25)


def _fresh(path, config, clock, queues):
    with StoreReader.open(path, config, clock=clock) as fresh:
        return {k: (fresh.min_offset(*k), fresh.max_offset(*k)) for k in queues}


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_kept_open_reader_matches_a_fresh_one(fresh_dir, ops):
    path = str(fresh_dir("bounds") / "s")
    clock = FakeClock()
    config = SMALL.replace(default_queue_count=3, file_reserved_time_hours=1)
    store = MessageStore.open(path, config, clock=clock)
    p = store.producer()
    p.send(Message("a", b"first"))
    p.send(Message("b", b"first"))
    kept = StoreReader.open(path, config, clock=clock)
    queues = [(t, q) for t in ("a", "b") for q in range(3)]
    try:
        for op, x, n in ops:
            if op == "send":
                topic = "ab"[x % 2]
                for i in range(n):
                    p.send(Message(topic, bytes(200 + i)), queue_id=x % 3)
            elif op == "retention":
                clock.advance(2 * 3600_000)
                store.clean_expired_files(force=True)
            assert kept.queue_bounds(queues) == _fresh(path, config, clock, queues)
    finally:
        kept.close()
        store.close()


def test_kept_open_reader_sees_retention_in_another_process_store(tmp_path):
    clock = FakeClock()
    config = SMALL.replace(default_queue_count=1, file_reserved_time_hours=1)
    store = MessageStore.open(str(tmp_path / "s"), config, clock=clock)
    p = store.producer()
    for _ in range(600):
        p.send(Message("a", bytes(300)))
    kept = StoreReader.open(str(tmp_path / "s"), config, clock=clock)
    try:
        assert kept.queue_bounds([("a", 0)]) == {("a", 0): (0, 600)}
        clock.advance(2 * 3600_000)
        assert store.clean_expired_files(force=True) > 0
        low = store.min_offset("a", 0)
        assert low > 0
        assert kept.queue_bounds([("a", 0)]) == {("a", 0): (low, 600)}
    finally:
        kept.close()
        store.close()


def test_queue_bounds_names_a_missing_queue(store):
    store.producer().send(Message("t", b"x"))
    with pytest.raises(UnknownTopicError, match="queue_id 9"):
        store.queue_bounds([("t", 9)])
    with pytest.raises(UnknownTopicError, match="'nope'"):
        store.queue_bounds([("nope", 0)])
    assert store.queue_bounds([("t", q) for q in store.queue_ids("t")])
