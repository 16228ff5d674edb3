"""The timer topic's ConsumeQueue is dispatched as RocketMQ 5 does: tagsCode is the tag hash.

Fire times and cancel marks are read from the records (``TIMER_OUT_MS``,
``TIMER_DEL_UNIQKEY``), so a queue RocketMQ wrote is never misread as due times, and a store
an earlier rmq wrote (fire time as tagsCode) is upgraded in place on a writable open.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from queue_reading import visible  # noqa: E402  (tests/ helper)

from store import Message, MessageStore
from store.files.consume_queue import ENTRY_DTYPE
from store.formats.message import TIMER_TOPIC, java_string_hash
from store.timer.timer_queue import read_timer_entries

P = 100  # the SMALL config's timer precision


def _timer_queue(store):
    end = store.max_offset(TIMER_TOPIC, 0)
    return store.queue_entries(TIMER_TOPIC, 0, 0, end)


def _expected_codes(store, entries):
    codes = []
    for offset in entries["offset"].tolist():
        tags = store.read_record(int(offset)).properties.get("TAGS")
        codes.append(java_string_hash(tags) if tags else 0)
    return codes


def _send_every_way(store, clock):
    p = store.producer("g")
    sent = [p.send(Message("t", b"tagged", tags="TagA"), delay_ms=3_000),
            p.send(Message("t", b"plain"), delay_ms=3_000),
            p.send(Message("t", b"far", tags="Far"), delay_ms=600_000)]  # rolled later
    sent += p.send_batch([Message("t", b"b%d" % i, tags=f"B{i}") for i in range(3)])
    table = pa.table({"topic": ["t"] * 4, "body": [b"c0", b"c1", b"c2", b"c3"],
                      "tags": ["C0", None, "C2", "Zed"],
                      "delay_ms": pa.array([3_000, 3_000, 4_000, 5_000], pa.int64())})
    result = p.send_table(table)
    assert store.timer.cancel("t", result.column("msg_id")[3].as_py())
    return sent, result


def test_timer_queue_entries_hold_the_tag_hash(store, clock):
    _send_every_way(store, clock)
    e = _timer_queue(store)
    assert len(e) == 8  # 3 sends + 4 table rows + 1 cancel marker (the batch is not delayed)
    assert e["tags_code"].tolist() == _expected_codes(store, e)
    assert java_string_hash("_RECALL_TAG_") in e["tags_code"].tolist()
    # a rolled re-put is dispatched the same way
    for _ in range(60):
        clock.advance(20_000)
        store.deliver_due()
    e = _timer_queue(store)
    assert len(e) > 8
    assert e["tags_code"].tolist() == _expected_codes(store, e)


def test_fire_times_come_from_the_records_never_early(store, clock):
    sent, result = _send_every_way(store, clock)
    t0 = clock()
    assert store.deliver_due() == 0  # tag hashes are tiny numbers: read as times, all due
    clock.advance(2_900)
    assert store.deliver_due() == 0
    clock.advance(2_300)
    delivered = store.deliver_due()
    bodies = sorted(v.body for v in visible(store, "t"))
    # the batch was not delayed; c3 was cancelled; "far" waits 600 s
    assert bodies == sorted([b"tagged", b"plain", b"b0", b"b1", b"b2", b"c0", b"c1", b"c2"])
    assert delivered == 5
    for v in visible(store, "t"):
        if v.deliver_timestamp_ms:
            assert v.store_timestamp_ms >= v.deliver_timestamp_ms >= t0
    t = read_timer_entries(store, 0, store.max_offset(TIMER_TOPIC, 0))
    assert t.ok.all() and int(t.marker.sum()) == 1
    assert t.marker_keys == {f"t+{result.column('msg_id')[3].as_py()}"}


def _write_old_layout(store_path, small_config, clock):
    """A store as rmq wrote it before: timer-queue tagsCode = TIMER_OUT_MS, negated for a
    marker.  Returns the message ids and due times."""
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    rs = [p.send(Message("t", b"m%d" % i, tags="Old" if i % 2 else None), delay_ms=2_000 + i)
          for i in range(6)]
    assert s.timer.cancel("t", rs[0].msg_id)
    e = _timer_queue(s)
    old = []
    for offset in e["offset"].tolist():
        props = s.read_record(int(offset)).properties
        out = int(props["TIMER_OUT_MS"])
        old.append(-out if "TIMER_DEL_UNIQKEY" in props else out)
    queue = s.consume_queue(TIMER_TOPIC, 0)
    queue.put(0, e["offset"], e["size"], np.array(old, dtype=np.int64))
    s.close()
    return rs, old


@pytest.mark.parametrize("reopen_before_delivery", [False, True])
def test_an_old_rmq_timer_queue_is_upgraded_in_place(store_path, small_config, clock,
                                                      reopen_before_delivery):
    rs, old = _write_old_layout(store_path, small_config, clock)
    path = f"{store_path}/consumequeue/{TIMER_TOPIC}/0/00000000000000000000"
    raw = np.fromfile(path, dtype=ENTRY_DTYPE, count=len(old))
    assert raw["tags_code"].tolist() == old  # the old layout really is on disk
    s = MessageStore.open(store_path, small_config, clock=clock)
    try:
        e = _timer_queue(s)
        assert e["tags_code"].tolist() == _expected_codes(s, e)
        if reopen_before_delivery:  # the upgrade is idempotent
            s.close()
            s = MessageStore.open(store_path, small_config, clock=clock)
            assert _timer_queue(s)["tags_code"].tolist() == _expected_codes(s, e)
        assert s.deliver_due() == 0
        clock.advance(2_200)
        assert s.deliver_due() == 5  # the cancelled one stays cancelled
        assert sorted(v.msg_id for v in visible(s, "t")) == sorted(r.msg_id for r in rs[1:])
    finally:
        s.close()


def test_a_damaged_timer_queue_entry_is_rebuilt_not_skipped(store, clock):
    """An entry that does not match its record (its size damaged in the queue file) is not
    read as a fire time, and does not cost its message: the queue is compared with the
    CommitLog, rebuilt, and read again (it used to be skipped, and the message lost)."""
    p = store.producer("g")
    good = p.send(Message("t", b"ok"), delay_ms=1_000)
    other = p.send(Message("t", b"other"), delay_ms=1_000)
    e = _timer_queue(store)
    queue = store.consume_queue(TIMER_TOPIC, 0)
    sizes = e["size"].copy()
    sizes[1] += 7
    queue.put(0, e["offset"], sizes, e["tags_code"])
    t = read_timer_entries(store, 0, 2)
    assert t.ok.tolist() == [True, True] and t.fire[1] > 0
    assert _timer_queue(store)["size"].tolist() == e["size"].tolist()  # rebuilt
    clock.advance(1_500)
    assert store.deliver_due() == 2
    assert sorted(v.msg_id for v in visible(store, "t")) == sorted([good.msg_id, other.msg_id])


@pytest.mark.parametrize("crash", [False, True], ids=["closed", "crashed"])
def test_a_store_opened_again_does_not_read_its_timer_queue_for_the_upgrade(
        store_path, small_config, clock, monkeypatch, crash):
    """The checkpoint records how far the timer queue is known to hold tag hashes: an open
    looks only at the entries queued since (the old code read every pending entry)."""
    from store.timer import timer_queue

    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(300):
        p.send(Message("t", b"m%d" % i), delay_ms=60_000 + i)
    s.deliver_due()  # placed in the wheel; the checkpoint saved
    p.send(Message("t", b"after"), delay_ms=60_000)  # queued after the last save
    if crash:
        s.flush()  # (left open: as a killed process leaves it)
    else:
        s.close()
    read = []
    real = timer_queue.read_queue_entries

    def counting(queue, start, end):
        out = real(queue, start, end)
        read.append(len(out))
        return out

    monkeypatch.setattr(timer_queue, "read_queue_entries", counting)
    try:
        with MessageStore.open(store_path, small_config, clock=clock) as again:
            assert sum(read) <= 1  # the entry queued after the last save, at most
            clock.advance(61_000)
            again.deliver_due()
            assert len(visible(again, "t")) == 301
    finally:
        if crash:
            s.close()
