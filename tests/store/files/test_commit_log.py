"""CommitLog segments: roll-over, the end-of-file blank, batches at a file end."""

from __future__ import annotations

import os
import struct

import pytest

from store import Message, MessageStore
from store.formats.record_codec import (BLANK_MAGIC_CODE, RecordCheck, RecordSpec, check_record,
                                        decode_record, encode_record)

SEG = 64 * 1024  # the test stores' segment size


def records(store):
    """Every (offset, size) the CommitLog holds, following blanks."""
    return list(store.commit_log.scan(store.commit_log.min_offset()))


def blank_at(store, offset):
    f = store.commit_log.files.find(offset)
    buf = f.buffer()
    pos = offset - f.start
    size, magic = struct.unpack_from(">ii", buf, pos)
    return size if magic == BLANK_MAGIC_CODE else None


def spec(body_len, **kw):
    # topic "t", no properties: record size = 91 + 1 + body_len
    return RecordSpec("t", b"b" * body_len, {}, queue_id=0, **kw)


def fill_to_remaining(store, remaining):
    """Append records until exactly ``remaining`` bytes are left in the current segment."""
    while True:
        left = SEG - store.confirmed_offset() % SEG
        need = left - remaining
        assert need >= 0
        if need == 0:
            return
        size = min(need, 30_000)
        if need - size and need - size < 93:  # leave room for one more minimal record
            size = need - 93
        store.append([spec(size - 92)])


def segment_names(store):
    return sorted(os.listdir(os.path.join(store.root, "commitlog")))


def test_segments_are_named_by_their_start_offset(store):
    p = store.producer("g")
    for _ in range(900):
        p.send(Message("roll", b"x" * 200))
    names = segment_names(store)
    assert len(names) >= 3
    assert names == [f"{i * SEG:020d}" for i in range(len(names))]
    assert all(os.path.getsize(os.path.join(store.root, "commitlog", n)) == SEG for n in names)


@pytest.mark.parametrize("slack, blank_expected", [(0, False), (1, True), (-1, False)])
def test_blank_rule_needs_eight_bytes_to_spare(store, slack, blank_expected):
    """A record of length L fits only when L + 8 <= bytes left (RocketMQ's END_FILE_MIN_BLANK)."""
    fill_to_remaining(store, 1000)
    start = store.confirmed_offset()
    size = 1000 - 8 + slack
    r = store.append([spec(size - 92)])[0]
    if blank_expected:
        assert blank_at(store, start) == 1000  # sized exactly: the rest of the segment
        assert r.commitlog_offset == start + 1000 == (start // SEG + 1) * SEG
    else:
        assert r.commitlog_offset == start
        # the next record cannot fit the few bytes left: a blank of exactly that size
        nxt = store.append([spec(10)])[0]
        assert nxt.commitlog_offset == (start // SEG + 1) * SEG
        assert blank_at(store, start + size) == 1000 - size
    assert r.size == size
    expected = [r.commitlog_offset] + ([] if blank_expected else [nxt.commitlog_offset])
    assert [o for o, _ in records(store)][-len(expected):] == expected


def test_blank_leaves_the_rest_of_the_segment_zero_and_readers_skip_it(store):
    fill_to_remaining(store, 500)
    start = store.confirmed_offset()
    r = store.append([spec(600)])[0]
    f = store.commit_log.files.find(start)
    assert bytes(f.buffer()[start - f.start + 8:]) == bytes(500 - 8)
    assert check_record(f.buffer(), start - f.start, f.size) == RecordCheck.BLANK
    assert records(store)[-1] == (r.commitlog_offset, 692)
    assert store.read_record(r.commitlog_offset).body == b"b" * 600


def test_batch_at_the_file_end_moves_to_the_next_file_whole(store):
    fill_to_remaining(store, 2000)
    start = store.confirmed_offset()
    # three 700-byte records: the first would fit, the batch does not
    rs = store.append([spec(700 - 92), spec(700 - 92), spec(700 - 92)], batch=True)
    nxt = (start // SEG + 1) * SEG
    assert [r.commitlog_offset for r in rs] == [nxt, nxt + 700, nxt + 1400]
    assert blank_at(store, start) == 2000
    assert [r.queue_offset for r in rs] == list(range(rs[0].queue_offset, rs[0].queue_offset + 3))


def test_send_batch_at_the_file_end_moves_whole(store):
    fill_to_remaining(store, 3000)
    start = store.confirmed_offset()
    results = store.producer("g").send_batch([Message("t", b"m" * 300) for _ in range(10)])
    nxt = (start // SEG + 1) * SEG
    assert results[0].commitlog_offset == nxt
    assert blank_at(store, start) == 3000
    offsets = [r.commitlog_offset for r in results]
    sizes = [store.read_record(o).total_size for o in offsets]
    assert offsets == [nxt + sum(sizes[:i]) for i in range(10)]


def test_a_batch_larger_than_a_segment_is_split_across_segments(store):
    msgs = [Message("big", f"{i:06d}".encode() * 50, tags="T", keys=f"k{i}") for i in range(700)]
    results = store.producer("g").send_batch(msgs)  # ~260 KB: five segments
    assert len({r.queue_id for r in results}) == 1
    qid = results[0].queue_id
    assert [r.queue_offset for r in results] == list(range(results[0].queue_offset,
                                                         results[0].queue_offset + 700))
    offsets = [r.commitlog_offset for r in results]
    assert offsets == sorted(offsets)
    for r, m in zip(results, msgs):
        rec = store.read_record(r.commitlog_offset)
        # never across a boundary, and with 8 bytes to spare
        assert r.commitlog_offset // SEG == (r.commitlog_offset + rec.total_size + 8 - 1) // SEG
        assert rec.body == m.body and rec.properties["UNIQ_KEY"] == r.msg_id
    scanned = [o for o, _ in records(store) if o >= offsets[0]]
    assert scanned == offsets
    views = store.pull("big", qid, results[0].queue_offset, 1000)
    assert [v.body for v in views] == [m.body for m in msgs]
    assert len(set(r.commitlog_offset // SEG for r in results)) >= 4


def test_batch_records_are_byte_identical_to_the_codec(store):
    """The vectorised batch encoder writes exactly what encode_record writes."""
    msgs = [Message("same", bytes([i]) * (i + 1), tags=["a", None, "ccc"][i % 3],
                    keys=[None, "k1", ["k2", "k3"]][i % 3], properties={"p": str(i)} if i % 2
                    else {}, flag=i - 5) for i in range(40)]
    results = store.producer("g").send_batch(msgs)
    for r in results:
        rec = store.read_record(r.commitlog_offset)
        f = store.commit_log.files.find(r.commitlog_offset)
        pos = r.commitlog_offset - f.start
        stored = bytes(f.buffer()[pos:pos + rec.total_size])
        again = encode_record(rec.to_spec(), queue_id=rec.queue_id, queue_offset=rec.queue_offset,
                              physical_offset=rec.physical_offset,
                              store_timestamp_ms=rec.store_timestamp_ms)
        assert stored == again


def test_send_and_send_batch_store_the_same_fields(store, clock):
    m = Message("same", b"payload", tags="TagA", keys=["k1", "k2"], properties={"a": "1"},
                flag=7)
    single = store.read_record(store.producer("g").send(m).commitlog_offset)
    batch = store.read_record(store.producer("g").send_batch([m])[0].commitlog_offset)
    for rec in (single, batch):
        assert rec.body == b"payload" and rec.flag == 7 and rec.topic == "same"
        assert rec.born_timestamp_ms == rec.store_timestamp_ms == clock()
        assert list(rec.properties) == ["a", "TAGS", "KEYS", "UNIQ_KEY"]
        assert rec.properties["TAGS"] == "TagA" and rec.properties["KEYS"] == "k1 k2"
    assert single.properties["UNIQ_KEY"] != batch.properties["UNIQ_KEY"]


def test_batch_shares_one_store_time_and_queue(store, clock):
    results = store.producer("g").send_batch([Message("t", b"x")] * 5)
    recs = [store.read_record(r.commitlog_offset) for r in results]
    assert {r.store_timestamp_ms for r in recs} == {clock()}
    assert {r.queue_id for r in recs} == {results[0].queue_id}
    assert len({r.msg_id for r in results}) == 5


def test_decoded_physical_offset_is_the_records_own(store):
    p = store.producer("g")
    for i in range(300):
        r = p.send(Message("po", b"y" * (i % 50 + 1)))
        rec = store.read_record(r.commitlog_offset)
        assert rec.physical_offset == r.commitlog_offset
        assert decode_record(*store.commit_log.buffer_at(r.commitlog_offset)[:2]).body == rec.body


def test_reopen_continues_after_a_full_segment(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        fill_to_remaining(s, 100)
        end = s.confirmed_offset()
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        assert s.confirmed_offset() == end
        r = s.append([spec(50)])[0]
        assert r.commitlog_offset == (end // SEG + 1) * SEG
        assert blank_at(s, end) == 100
