"""The sink stages records, not rows: what its commit writes, and what it refuses to write.

A half's body holds the records its commit writes (:mod:`store.sink.staging`), already
encoded at stage time, with a zero magic code.  These tests hold the committed records to
``send_table``'s for the same rows, field by field; show that a half damaged after staging
never commits and that its staged records are never taken for records by a scan of the
CommitLog; and that halves staged by older versions (rows, not records) still commit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from store import CorruptRecordError, MessageStore, SinkCommitError
from store.formats.record_codec import (HEADER_SIZE, TRANSACTION_COMMIT_TYPE,
                                       TRANSACTION_PREPARED_TYPE, RecordSpec)
from store.formats.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    TRANS_HALF_TOPIC,
)
from store.formats.message import PROPERTY_SINK
from store.sink.staged_format import (PROPERTY_SINK_ROWS, decode_staged, framed_head,
                                      new_transaction_id)
from store.sink.staging import assemble_half, half_view
from store.transaction.half import HALF_QUEUE_ID

PROPS = pa.map_(pa.string(), pa.string())
USER_TOPICS = ("orders", "payments")


def _table(clock, n=24):
    kinds = [("delay_ms", 1_234), ("delay_level", 3), ("deliver_at", clock() + 99_999),
             (None, None)]
    delays = [kinds[i % 4] for i in range(n)]
    return pa.table({
        "topic": [USER_TOPICS[i % 2] for i in range(n)],
        "body": [b"m%03d" % i for i in range(n)],
        "tags": [("a", None, "b")[i % 3] for i in range(n)],
        "keys": pa.array([(None, ["k1"], ["k2", "k3"])[i % 3] for i in range(n)],
                         pa.list_(pa.string())),
        "properties": pa.array([[("x", str(i))] if i % 2 else [] for i in range(n)], PROPS),
        **{kind: pa.array([v if k == kind else None for k, v in delays], pa.int64())
           for kind in ("delay_ms", "delay_level", "deliver_at")}})


def _records(store):
    """Every indexed record of the user topics and the delay topics, by body."""
    out = {}
    for topic, q in store.all_consume_queues():
        if topic not in USER_TOPICS + ("SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"):
            continue
        entries = store.queue_entries(topic, q, store.min_offset(topic, q),
                                      store.max_offset(topic, q))
        for off in entries["offset"].tolist():
            rec = store.read_record(int(off))
            out[rec.body] = rec
    return out


def _all_fields(store):
    got = []
    for topic, q in store.all_consume_queues():
        if topic in USER_TOPICS + ("SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"):
            e = store.queue_entries(topic, q, 0, store.max_offset(topic, q))
            got += [_fields(store.read_record(int(o))) for o in e["offset"].tolist()]
    return sorted(got, key=repr)


def _fields(rec):
    props = dict(rec.properties)
    props.pop("UNIQ_KEY")
    props.pop(PROPERTY_REAL_QUEUE_ID, None)  # the round robin's choice
    return (rec.topic, rec.body, rec.body_crc, rec.flag, rec.born_timestamp_ms,
            rec.born_host, rec.reconsume_times, rec.total_size, props)


def _halves(store):
    entries = store.queue_entries(TRANS_HALF_TOPIC, HALF_QUEUE_ID, 0,
                                  store.max_offset(TRANS_HALF_TOPIC, HALF_QUEUE_ID))
    return entries["offset"].tolist()


@pytest.mark.parametrize("commit", ["index", "copy"])
def test_committed_records_are_send_tables_records_field_by_field(tmp_path, small_config,
                                                                  clock, commit):
    with MessageStore.open(str(tmp_path / "t"), small_config, clock=clock) as store:
        store.producer().send_table(_table(clock))
        expected = {b: _fields(r) for b, r in _records(store).items()}
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.producer().send_table(pa.table({"topic": ["other"], "body": [b"first"]}))
        sink = store.sink("x", commit=commit)
        sink.commit(0, sink.stage(_table(clock)))
        records = _records(store)
        assert {b: _fields(r) for b, r in records.items()} == expected
        if commit == "copy":  # copies of the halves' records, stored at the commit
            assert {r.prepared_transaction_offset for r in records.values()} == set(
                _halves(store))
            for rec in records.values():
                assert rec.sys_flag == TRANSACTION_COMMIT_TYPE
                assert rec.store_timestamp_ms == clock()
        else:  # the staged records themselves, stored when staged
            for rec in records.values():
                assert rec.sys_flag & 0xC == TRANSACTION_PREPARED_TYPE
                assert rec.queue_offset == -1
        delayed = [r for r in records.values() if PROPERTY_REAL_TOPIC in r.properties]
        assert len(delayed) == 18  # three of every four rows
        for rec in delayed:  # a delayed row names the queue it surfaces in, a real one
            assert 0 <= int(rec.properties[PROPERTY_REAL_QUEUE_ID]) < 8


def test_a_half_damaged_after_staging_never_commits(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("x", commit="copy")
        staged = sink.stage(pa.table({"topic": ["orders"] * 50,
                                      "body": [b"m%d" % i for i in range(50)]}))
        end = store.confirmed_offset()
        offset = _halves(store)[0]
        size = len(half_view(store, offset)[1])
        _buf, pos, f = store.commit_log.buffer_at(offset)
        body_at = pos + HEADER_SIZE + size // 2  # a byte amid the staged records
        with open(f.path, "r+b") as fh:
            fh.seek(body_at)
            old = fh.read(1)
            fh.seek(body_at)
            fh.write(bytes([old[0] ^ 0xFF]))
        with pytest.raises((CorruptRecordError, SinkCommitError), match="CRC"):
            sink.commit(0, staged)
        assert store.confirmed_offset() == end  # nothing of the batch
        assert "orders" not in store.topics() or all(
            store.max_offset("orders", q) == 0 for q in store.queue_ids("orders"))


def test_staged_records_are_never_taken_for_records(tmp_path, small_config, clock):
    """A rebuild of the queues from the CommitLog walks past a damaged half by resyncing on
    the next record start: the records staged inside the halves must not be found."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, small_config, clock=clock) as store:
        sink = store.sink("x", commit="copy")
        sink.stage(pa.table({"topic": ["orders"] * 300,
                             "body": [b"m%d" % i for i in range(300)]}))
        halves = _halves(store)
        assert len(halves) > 1
        for offset in halves:  # every half's header broken: the scan must resync
            _buf, pos, f = store.commit_log.buffer_at(offset)
            with open(f.path, "r+b") as fh:
                fh.seek(pos + 4)
                fh.write(b"\0\0\0\0")  # its magic code
        store.rebuild_queues()
        assert "orders" not in store.topics() or all(
            store.max_offset("orders", q) == 0 for q in store.queue_ids("orders"))


def test_a_half_written_wrongly_never_commits(tmp_path, small_config, clock):
    """A half whose CRC holds but whose staged records do not (a size field that lies, or a
    real magic code): the commit refuses it and writes nothing."""
    for damage in ("size", "magic"):
        with MessageStore.open(str(tmp_path / damage), small_config, clock=clock) as store:
            sink = store.sink("x", commit="copy")
            sink.stage(pa.table({"topic": ["orders"] * 5, "body": [b"m%d" % i for i in range(5)]}))
            half = store.read_record(_halves(store)[0])
            table = decode_staged(half.body, "test", 0)
            records = [bytearray(r) for r in table.column("record").to_pylist()]
            if damage == "size":
                records[3][3] ^= 1
            else:
                records[3][4:8] = (-626843481).to_bytes(4, "big", signed=True)
            topics = table.column("topic").combine_chunks()
            head, _ = framed_head(topics.dictionary.to_pylist(), topics.indices.to_numpy(),
                                  table.column("queue_id").to_numpy(),
                                  table.column("tags_code").to_numpy(),
                                  np.array([len(r) for r in records]))
            tx = new_transaction_id("y")
            spec = RecordSpec(
                topic=TRANS_HALF_TOPIC, body=head + b"".join(map(bytes, records)),
                properties={PROPERTY_TRANSACTION_ID: tx, PROPERTY_TRANSACTION_PREPARED: "true",
                            PROPERTY_PRODUCER_GROUP: "rmq-sink", PROPERTY_SINK: "y",
                            PROPERTY_SINK_ROWS: "5"},
                queue_id=HALF_QUEUE_ID, born_timestamp_ms=half.born_timestamp_ms)
            store.append_assembled(assemble_half(store, spec))
            end = store.confirmed_offset()
            with pytest.raises(CorruptRecordError, match="wrong size field or magic code"):
                store.sink("y").commit(0, [tx])
            assert store.confirmed_offset() == end
            assert "orders" not in store.topics()  # the commit creates it: it never ran


def test_commits_of_small_batches_spread_over_the_queues(tmp_path, small_config, clock,
                                                         monkeypatch):
    """Each commit opens the store anew (as the Spark driver does per micro-batch): the
    round robin starts at a random queue, so small batches do not all fill queue 0."""
    monkeypatch.undo()  # the real, random start
    path = str(tmp_path / "s")
    for batch in range(16):
        with MessageStore.open(path, small_config, clock=clock) as store:
            sink = store.sink("x")
            sink.commit(batch, sink.stage(pa.table({"topic": ["orders"] * 3,
                                                    "body": [b"b%d" % batch] * 3})))
    with MessageStore.open(path, small_config, clock=clock) as store:
        filled = [q for q in store.queue_ids("orders") if store.max_offset("orders", q) > 0]
        assert len(filled) >= 2  # 16 batches into one queue: chance 4 ** -15


@pytest.mark.parametrize("commit", ["index", "copy"])
def test_topics_are_created_by_the_commit_not_by_staging(tmp_path, small_config, clock, commit):
    """Staging creates no topic (a batch that never commits leaves none behind); the
    commit creates the rows' topics, also of rows that are only delayed so far."""
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("x", commit=commit)
        staged = sink.stage(pa.table({"topic": ["later", "now"], "body": [b"a", b"b"],
                                      "delay_ms": pa.array([60_000, None], pa.int64())}))
        assert "later" not in store.topics() and "now" not in store.topics()
        sink.commit(0, staged)
        assert {"later", "now"} <= set(store.topics())
        assert all(store.max_offset("later", q) == 0 for q in store.queue_ids("later"))


def _raw(store, offset):
    """The record's bytes with the fields its placement decides zeroed."""
    from store.formats.record_codec import FIELD_OFFSET

    buf, pos, _ = store.commit_log.buffer_at(offset)
    size = int.from_bytes(bytes(buf[pos:pos + 4]), "big")
    raw = bytearray(buf[pos:pos + size])
    for name in ("queue_offset", "physical_offset", "store_timestamp"):
        raw[FIELD_OFFSET[name]:FIELD_OFFSET[name] + 8] = bytes(8)
    return bytes(raw)


def test_a_framed_half_is_the_half_a_record_spec_makes(tmp_path, small_config, clock):
    """Halves are written straight into their buffer (the records assembled in place); the
    record is the one the core's own encoder makes of the same body and properties."""
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.sink("x", commit="copy").stage(_table(clock))
        halves = [store.read_record(o) for o in _halves(store)]
        raws = [_raw(store, o) for o in _halves(store)]
        assert store.verify_commitlog().ok
    assert halves and all(h.body[:4] == b"RMQF" for h in halves)
    with MessageStore.open(str(tmp_path / "t"), small_config, clock=clock) as store:
        for half, raw in zip(halves, raws):
            spec = RecordSpec(topic=TRANS_HALF_TOPIC, body=half.body,
                              properties=dict(half.properties), queue_id=HALF_QUEUE_ID,
                              born_timestamp_ms=half.born_timestamp_ms)
            placed = store.append_assembled(assemble_half(store, spec))
            assert _raw(store, int(placed.commitlog_offsets[0])) == raw


def _framed(records: list[bytes], topics=("orders", "pay")):
    from store.sink.staged_format import framed_head

    n = len(records)
    prefix, at = framed_head(list(topics), np.arange(n) % len(topics), np.full(n, -1),
                             np.arange(n), np.array([len(r) for r in records]))
    assert len(prefix) == at and at % 8 == 0
    return prefix + b"".join(records)


def test_a_body_that_is_not_framed_is_refused():
    """Only framed halves commit (an Arrow stream, say, is not one)."""
    with pytest.raises(CorruptRecordError, match="not framed") as info:
        decode_staged(b"\xff\xff\xff\xff" + bytes(60), "seg", 7)
    assert "seg" in str(info.value)


def test_framed_bodies_decode_to_views_of_their_records():
    records = [b"a" * 40, b"bb" * 33, b"c" * 91]
    table = decode_staged(memoryview(_framed(records)), "seg", 7)
    assert table.column("record").to_pylist() == records
    assert table.column("tags_code").to_pylist() == [0, 1, 2]
    assert table.column("topic").to_pylist() == ["orders", "pay", "orders"]


@pytest.mark.parametrize("damage, needle", [
    (lambda b: b[:-1], "add up"), (lambda b: b + b"x", "add up"),
    (lambda b: b[:4] + (10 ** 6).to_bytes(4, "big") + b[8:], "more than"),
    (lambda b: b[:8] + (-1).to_bytes(4, "big", signed=True) + b[12:], "more than"),
    (lambda b: b[:8] + (1).to_bytes(4, "big") + b[12:], "past its 1 topics|do not add up"),
    (lambda b: b[:12] + (3).to_bytes(4, "big") + b[16:], "do not add up"),
    (lambda b: b[:10], "shorter"),
], ids=["short", "long", "too-many-records", "negative-topics", "fewer-topics", "names-length",
        "truncated"])
def test_framed_bodies_that_do_not_add_up_are_refused(damage, needle):
    body = damage(_framed([b"a" * 40, b"b" * 60]))
    with pytest.raises(CorruptRecordError, match=needle) as info:
        decode_staged(body, "seg", 7)
    assert "seg" in str(info.value)
