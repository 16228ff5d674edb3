"""Stage notes carry the staged records' columns: the index commit does not read the records.

:mod:`store.core.placed_commit` writes a commit's ConsumeQueue entries from the columns the
stager kept (:mod:`store.sink.staged_format`'s notes), checking them against the CommitLog
only at each range's first and last record.  These tests hold the entries it writes to
those a queue rebuild finds by reading every record, show that it reads no more than two
records a range, and that a note whose columns disagree with the log is refused with
nothing made visible.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from store import CorruptRecordError, MessageStore
from store.core import index_commit, placed_commit
from store.core.placed_commit import StagedRuns
from store.formats.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_SINK,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    TRANS_HALF_TOPIC,
)
from store.formats.record_codec import RecordSpec
from store.kernels import staged_walk
from store.sink.staged_format import (
    OLD_NOTE_MAGIC,
    OLD_NOTE_PREFIX,
    PROPERTY_SINK_ROWS,
    decode_note,
    encode_note,
    is_note,
    new_transaction_id,
)
from store.sink.staging import half_view
from store.transaction.half import HALF_QUEUE_ID

USER_TOPICS = ("orders", "payments")


def _table(clock, n, start=0):
    """Rows of two topics, some delayed, tags varying, some with a queue asked for."""
    kinds = [("delay_ms", 1_234), ("delay_level", 3), (None, None), (None, None)]
    delays = [kinds[i % 4] for i in range(n)]
    return pa.table({
        "topic": [USER_TOPICS[(i // 7) % 2] for i in range(n)],
        "body": [b"m%05d" % (start + i) for i in range(n)],
        "tags": [("a", None, "b")[(i // 5) % 3] for i in range(n)],
        "keys": [f"k{start + i}" for i in range(n)],
        **{kind: pa.array([v if k == kind else None for k, v in delays], pa.int64())
           for kind in ("delay_ms", "delay_level")}})


def _entries(store):
    """Every ConsumeQueue's entries (offset, size, tagsCode), queue by queue."""
    out = {}
    for topic, q in store.all_consume_queues():
        e = store.queue_entries(topic, q, 0, store.max_offset(topic, q))
        out[(topic, q)] = [tuple(r) for r in np.stack(
            [e["offset"].astype(np.int64), e["size"].astype(np.int64),
             e["tags_code"].astype(np.int64)], axis=1).tolist()]
    return out


def _note_halves(store):
    """The stage notes in the half queue: (offset, body)."""
    q = store.queue_entries(TRANS_HALF_TOPIC, HALF_QUEUE_ID, 0,
                            store.max_offset(TRANS_HALF_TOPIC, HALF_QUEUE_ID))
    out = []
    for off in q["offset"].tolist():
        body = bytes(half_view(store, int(off))[1])
        if is_note(body):
            out.append((int(off), body))
    return out


def _append_half(store, sink_id, body, rows):
    tx = new_transaction_id(sink_id)
    store.append([RecordSpec(
        topic=TRANS_HALF_TOPIC, body=body, queue_id=HALF_QUEUE_ID,
        born_timestamp_ms=store.now_ms(),
        properties={PROPERTY_TRANSACTION_ID: tx, PROPERTY_TRANSACTION_PREPARED: "true",
                    PROPERTY_PRODUCER_GROUP: "rmq-sink", PROPERTY_SINK: sink_id,
                    PROPERTY_SINK_ROWS: str(rows)})])
    return tx


def test_entries_from_the_notes_are_those_a_rebuild_reads(tmp_path, small_config, clock):
    """Two stagers interleaved (their ranges alternate), delayed rows, several notes each:
    the commit's entries are byte for byte those a rebuild finds in the records."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, small_config, clock=clock) as store:
        a, b = store.sink("a"), store.sink("b")
        staged_a = a.stage(_table(clock, 4000))
        assert len(staged_a) > 1  # small segments: a stage writes several notes
        staged_b = b.stage(_table(clock, 300, start=4000))
        staged_a += a.stage(_table(clock, 700, start=5000))
        staged_b += b.stage(_table(clock, 300, start=6000))
        store.producer("p").send_table(pa.table({"topic": ["orders"] * 5,
                                                 "body": [b"x%d" % i for i in range(5)]}))
        assert a.commit(0, staged_a[::-1]).rows == 4700  # (the notes in any order)
        assert b.commit(0, staged_b).rows == 600
        before = _entries(store)
        store.rebuild_queues()
        assert _entries(store) == before
        bodies = set()
        for topic in USER_TOPICS:
            for q in store.queue_ids(topic):
                bodies.update(v.body for v in store.pull(topic, q, 0, 100_000))
        # every undelayed row is visible (the delayed ones wait in their delay topics)
        assert len([x for x in bodies if x.startswith(b"m")]) == 2650


def test_many_runs_are_grouped_by_a_sort(tmp_path, small_config, clock, monkeypatch):
    """Rows that asked for queues in turn make a run a record: past MAX_RUNS the commit
    groups them by a sort, with the same entries."""
    monkeypatch.setattr(placed_commit, "MAX_RUNS", 16)
    path = str(tmp_path / "s")
    with MessageStore.open(path, small_config, clock=clock) as store:
        store.ensure_topic("orders")
        sink = store.sink("a")
        table = pa.table({"topic": ["orders"] * 400,
                          "body": [b"m%d" % i for i in range(400)],
                          "queue_id": pa.array([i % 3 for i in range(400)], pa.int32())})
        assert sink.commit(0, sink.stage(table)).rows == 400
        before = _entries(store)
        assert [len(before[("orders", q)]) for q in range(3)] == [134, 133, 133]
        store.rebuild_queues()
        assert _entries(store) == before


def test_the_commit_reads_two_records_a_range_at_most(tmp_path, small_config, clock,
                                                      monkeypatch):
    walked = []
    real = staged_walk.staged_records

    def counting(buf, starts, ends):
        out = real(buf, starts, ends)
        walked.append(out[0].shape[1])
        return out

    monkeypatch.setattr(index_commit, "staged_records", counting)
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("a")
        staged = sink.stage(pa.table({"topic": ["orders"] * 3000,
                                      "body": [b"m%d" % i for i in range(3000)]}))
        ranges = sum(len(decode_note(body, "t", 0)[1]) for _, body in _note_halves(store))
        assert walked == []  # staging reads nothing back
        assert sink.commit(0, staged).rows == 3000
        assert 0 < sum(walked) <= 2 * ranges < 3000
        seen = [v.body for q in store.queue_ids("orders")
                for v in store.pull("orders", q, 0, 10_000)]
        assert sorted(seen) == sorted(b"m%d" % i for i in range(3000))


def _damaged(staged: StagedRuns, damage: str) -> StagedRuns:
    sizes, queues, codes = staged.sizes.copy(), staged.run_queues.copy(), \
        staged.code_values.copy()
    ranges = staged.ranges.copy()
    if damage == "middle size":
        sizes[len(sizes) // 2] += 1
    elif damage == "last queue":
        queues[-1] = (queues[-1] + 1) % 4
    elif damage == "first tagsCode":
        codes[0] += 1
    elif damage == "range start":
        ranges[0, 0] += int(sizes[0])
    elif damage == "range past the log":
        ranges[-1, 1] += 1 << 30
    return StagedRuns(ranges, staged.range_runs, staged.topics, staged.run_topics, queues,
                      staged.run_first, staged.run_counts, sizes, codes, staged.code_ends)


@pytest.mark.parametrize("damage", ["middle size", "last queue", "first tagsCode",
                                    "range start", "range past the log", "twice"])
def test_a_note_whose_columns_disagree_with_the_log_is_refused(tmp_path, small_config, clock,
                                                               damage):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.ensure_topic("orders")  # (a 4-queue topic: the damaged queue exists)
        rows = pa.table({"topic": ["orders"] * 40, "body": [b"m%d" % i for i in range(40)],
                         "tags": ["a"] * 20 + ["b"] * 20})
        store.sink("x").stage(rows)
        [(_, body)] = _note_halves(store)
        staged, _, topics = decode_note(body, "t", 0)
        forged = body if damage == "twice" else encode_note(_damaged(staged, damage), topics)
        txs = [_append_half(store, "y", forged, 40)]
        if damage == "twice":  # two notes naming the same records
            txs.append(_append_half(store, "y", forged, 40))
        end = store.confirmed_offset()
        with pytest.raises(CorruptRecordError):
            store.sink("y").commit(0, txs)
        assert store.confirmed_offset() == end  # nothing of the batch
        assert all(store.max_offset("orders", q) == 0 for q in store.queue_ids("orders"))
        assert store.sink("y").open_halves()  # still open: a later commit or abort ends them


def test_a_stage_note_of_an_earlier_version_still_commits(tmp_path, small_config, clock):
    """A note listing only ranges (``RMQR``): its records are read."""
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.sink("x").stage(pa.table({"topic": ["orders"] * 500,
                                        "body": [b"m%d" % i for i in range(500)]}))
        ranges = [r for _, body in _note_halves(store) for r in decode_note(body, "t", 0)[1]]
        old = OLD_NOTE_PREFIX.pack(OLD_NOTE_MAGIC, len(ranges)) + np.asarray(
            ranges, ">i8").tobytes() + b"orders\n"
        tx = _append_half(store, "y", old, 500)
        assert store.sink("y").commit(0, [tx]).rows == 500
        seen = [v.body for q in store.queue_ids("orders")
                for v in store.pull("orders", q, 0, 10_000)]
        assert sorted(seen) == sorted(b"m%d" % i for i in range(500))


def test_notes_fit_in_a_half_and_round_trip(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.sink("x").stage(_table(clock, 9000))
        notes = _note_halves(store)
        assert len(notes) > 1
        budget = small_config.commitlog_file_size_bytes // 2
        assert all(len(body) <= budget for _, body in notes)
        rows = 0
        for _, body in notes:
            staged, _, topics = decode_note(body, "t", 0)
            assert set(USER_TOPICS) <= set(topics)
            assert encode_note(staged, topics) == body
            assert int(staged.run_counts.sum()) == len(staged.sizes)
            rows += len(staged.sizes)
        assert rows == 9000
        with pytest.raises(CorruptRecordError):
            decode_note(notes[0][1][:-1], "t", 0)


@pytest.mark.parametrize("field", ["range runs", "run counts", "run topic", "code counts"])
def test_a_note_that_does_not_add_up_is_refused_when_decoded(field):
    staged = StagedRuns(np.array([[0, 300]]), np.array([2]), ["orders"], np.array([0, 0]),
                        np.array([1, 2]), np.array([0, 1]), np.array([1, 2]),
                        np.array([100, 100, 100]), np.array([7]), np.array([3]))
    body = encode_note(staged, ["orders"])
    back, ranges, topics = decode_note(body, "t", 0)
    assert ranges == [(0, 300)] and topics == ["orders"]
    assert back.run_first.tolist() == [0, 1] and back.code_ends.tolist() == [3]
    bad = {"range runs": dict(range_runs=np.array([3])),
           "run counts": dict(run_counts=np.array([1, 1])),
           "run topic": dict(run_topics=np.array([0, 1])),
           "code counts": dict(code_ends=np.array([2]))}[field]
    fields = {name: getattr(staged, name) for name in StagedRuns.__slots__}
    with pytest.raises(CorruptRecordError):
        decode_note(encode_note(StagedRuns(**{**fields, **bad}), ["orders"]), "t", 0)
