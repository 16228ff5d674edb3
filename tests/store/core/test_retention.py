"""Retention: CommitLog segments past file_reserved_time_hours go, and what pointed at them."""

from __future__ import annotations

import os
import shutil
import struct

import pytest

from store import Message, MessageStore, OffsetOutOfRangeError
from store.formats.record_codec import FIELD_OFFSET

HOUR = 3_600_000


@pytest.fixture
def aged(store_path, small_config, clock):
    """A one-queue store written over 10 fake hours, 400 messages an hour (~14 segments)."""
    s = MessageStore.open(store_path, small_config.replace(default_queue_count=1), clock=clock)
    p = s.producer("g")
    start = clock()
    for hour in range(10):
        p.send_batch([Message("t", f"{hour}:{i}".encode() * 20, tags="a") for i in range(200)])
        for i in range(200):
            p.send(Message("t", b"s" * 100, keys=f"h{hour}-{i}"))
        clock.advance(HOUR)
    s.start_ms = start
    yield s
    s.close()


def first_store_times(store):
    """Store time of the first record of each segment, oldest first."""
    out = []
    for f in store.commit_log.files.refresh():
        out.append(struct.unpack_from(">q", f.buffer(), FIELD_OFFSET["store_timestamp"])[0])
    return out


def cq_files(store, topic="t"):
    return sorted(os.listdir(os.path.join(store.root, "consumequeue", topic, "0")))


def test_nothing_is_deleted_before_its_time(aged, clock):
    n = len(aged.commit_log.files.refresh())
    clock.set(aged.start_ms + 72 * HOUR - 1)
    assert aged.clean_expired_files() == 0
    assert len(aged.commit_log.files.refresh()) == n
    assert aged.min_offset("t", 0) == 0


def test_expired_segments_go_and_min_offsets_advance(aged, clock):
    files = aged.commit_log.files.refresh()
    starts = [f.start for f in files]
    times = first_store_times(aged)
    now = aged.start_ms + 72 * HOUR + 3 * HOUR + HOUR // 2
    clock.set(now)
    # a segment may go when the next one began at least 72 h ago (so all its records did)
    expected = 0
    while expected < len(files) - 1 and times[expected + 1] + 72 * HOUR <= now:
        expected += 1
    assert 0 < expected < len(files) - 1
    max_before = aged.max_offset("t", 0)
    cq_before = cq_files(aged)
    assert aged.clean_expired_files() == expected
    cl_min = starts[expected]
    assert aged.commit_log.min_offset() == cl_min
    assert [f.start for f in aged.commit_log.files.refresh()] == starts[expected:]
    # the queue's min is its first entry whose record still exists
    cq = aged.consume_queue("t", 0)
    base = cq.first_index()
    entries = cq.entries(base, max_before)
    mino = aged.min_offset("t", 0)
    assert mino > base > 0 and aged.max_offset("t", 0) == max_before
    assert int(entries["offset"][mino - base]) >= cl_min
    assert int(entries["offset"][mino - base - 1]) < cl_min
    # ConsumeQueue files whose records are all gone were removed (never the last)
    after = cq_files(aged)
    assert after == cq_before[len(cq_before) - len(after):]
    assert len(after) < len(cq_before)
    # reading below the min is a clear typed error; at the min it works
    with pytest.raises(OffsetOutOfRangeError) as info:
        aged.pull("t", 0, mino - 1)
    msg = str(info.value)
    assert f"{mino - 1}" in msg and f"{mino} to {max_before}" in msg and "retention" in msg
    with pytest.raises(OffsetOutOfRangeError):
        aged.pull("t", 0, 0)
    views = aged.pull("t", 0, mino, 5)
    assert [v.queue_offset for v in views] == list(range(mino, mino + 5))
    assert aged.offset_for_timestamp("t", 0, 0) == mino


def test_the_newest_segment_always_stays(aged, clock):
    clock.advance(1000 * HOUR)
    n = len(aged.commit_log.files.refresh())
    newest = aged.commit_log.files.last_file().start
    assert aged.clean_expired_files() == n - 1
    assert [f.start for f in aged.commit_log.files.refresh()] == [newest]
    assert aged.clean_expired_files() == 0
    assert aged.clean_expired_files(force=True) == 0
    # every message of the deleted segments is out of range; the rest still reads
    mino, maxo = aged.min_offset("t", 0), aged.max_offset("t", 0)
    assert 0 < mino < maxo
    assert len(aged.pull("t", 0, mino, 10_000)) == maxo - mino


def test_force_deletes_all_but_the_newest_regardless_of_age(aged):
    n = len(aged.commit_log.files.refresh())
    assert aged.clean_expired_files(force=True) == n - 1


def test_after_retention_appends_reopen_and_crash_recovery_work(aged, clock, store_path,
                                                                small_config, tmp_path):
    clock.advance(1000 * HOUR)
    aged.clean_expired_files()
    r = aged.producer("g").send(Message("t", b"after"))
    maxo = aged.max_offset("t", 0)
    assert r.queue_offset == maxo - 1
    aged.flush()
    # a crash copy: abort marker present, recovery starts from a flushed offset that may
    # lie in a deleted segment
    crash = str(tmp_path / "crash")
    shutil.copytree(store_path, crash)
    assert os.path.exists(os.path.join(crash, "abort"))
    cfg = small_config.replace(default_queue_count=1)
    with MessageStore.open(crash, cfg, clock=clock) as s:
        assert s.recovered
        assert s.max_offset("t", 0) == maxo
        assert s.pull("t", 0, maxo - 1)[0].body == b"after"
        assert s.min_offset("t", 0) == aged.min_offset("t", 0)
    aged.close()
    with MessageStore.open(store_path, cfg, clock=clock) as s:
        assert s.max_offset("t", 0) == maxo
        assert s.producer("g").send(Message("t", b"more")).queue_offset == maxo


def test_pending_delayed_messages_and_open_halves_keep_their_segments(store_path, small_config,
                                                                      clock):
    """RocketMQ's bug #9006: retention must not delete a delayed message before it is
    delivered, nor an open half message; once delivered / ended, the segments may go."""
    from store import LocalTransactionState

    class Unknown:
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, view):
            return LocalTransactionState.UNKNOW

    cfg = small_config.replace(default_queue_count=1, file_reserved_time_hours=1)
    s = MessageStore.open(store_path, cfg, clock=clock)
    p = s.producer("g")
    start = clock()
    p.send(Message("late", b"timer"), delay_ms=5 * HOUR)
    p.send(Message("late", b"level"), delay_level=18)  # 2 h
    tx = s.transaction_producer("tx", Unknown()).send_in_transaction(Message("late", b"half"))
    for hour in range(4):  # ~12 segments of filler over 4 hours
        for i in range(400):
            p.send(Message("filler", b"f" * 100))
        clock.advance(HOUR)
    first_segment = s.commit_log.min_offset()
    s.clean_expired_files()
    s.clean_expired_files(force=True)
    assert s.commit_log.min_offset() == first_segment  # the pending ones hold the first one
    clock.set(start + 5 * HOUR + 1_000)
    assert s.deliver_due() == 2
    assert s.end_transaction(tx.transaction_id, "COMMIT")
    bodies = sorted(v.body for v in s.pull("late", 0, 0, 10))
    assert bodies == [b"half", b"level", b"timer"]
    assert s.clean_expired_files() > 0  # nothing pending any more: old segments go
    assert s.commit_log.min_offset() > first_segment
    s.close()
