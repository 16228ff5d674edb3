"""A record whose header fields outside the body CRC are damaged (QUEUEOFFSET,
PHYSICALOFFSET) costs that record only: every other message of its queue is served, before
and after it, whether the queue was written before the damage, rescanned or rebuilt."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import CorruptRecordError, Message, MessageStore, StoreConfig
from store.files.abort_marker import MARKER_FILE, write_marker
from store.core.recovery import _queue_groups, plausible_queue_offsets
from store.formats.record_codec import FIELD_OFFSET, FIXED_SIZE

CONFIG = StoreConfig(commitlog_file_size_bytes=1 << 20)
DAMAGED = 600


#: Eight bytes written over a header field (a queue offset or a physical offset far off).
_DAMAGE = b"\x64\x04\x12\x33\x00\x00\x00\x00"


def _damaged_store(path: str, field: str, mode: str, damage: bytes = _DAMAGE) -> None:
    with MessageStore.open(path, CONFIG) as store:
        producer = store.producer("g")
        sent = [producer.send(Message("t", b"m%d" % i), queue_id=0) for i in range(1000)]
    victim = sent[DAMAGED].commitlog_offset
    segment = os.path.join(path, "commitlog", sorted(os.listdir(os.path.join(path, "commitlog")))[0])
    with open(segment, "r+b") as fh:  # eight bytes the body CRC does not cover
        fh.seek(victim + FIELD_OFFSET[field])
        fh.write(damage)
    if mode == "rescan":  # a killed writer: the records past the checkpoint rescanned
        write_marker(os.path.join(path, MARKER_FILE))
        os.remove(os.path.join(path, "checkpoint"))
    elif mode == "rebuild":  # the queue lost: rebuilt from the CommitLog
        shutil.rmtree(os.path.join(path, "consumequeue"))


@pytest.mark.parametrize("mode", ["as written", "rescan", "rebuild"])
@pytest.mark.parametrize("field", ["queue_offset", "physical_offset"])
def test_a_damaged_header_costs_that_record_only(tmp_path, field, mode):
    path = str(tmp_path / "s")
    _damaged_store(path, field, mode)
    with MessageStore.open(path, CONFIG) as store:
        before = store.pull("t", 0, 0, 2000)
        assert [v.body for v in before] == [b"m%d" % i for i in range(DAMAGED)]
        with pytest.raises(CorruptRecordError):
            store.pull("t", 0, DAMAGED, 10)
        after = store.pull("t", 0, DAMAGED + 1, 2000)
        assert [v.body for v in after] == [b"m%d" % i for i in range(DAMAGED + 1, 1000)]
        batch = store.read_arrow("t", 0, 0, store.max_offset("t", 0), skip_corrupt=True)
        assert batch.num_rows == 999
        with pytest.raises(CorruptRecordError):  # strict: the loss is not passed over
            store.read_arrow("t", 0, 0, store.max_offset("t", 0))
        assert store.read_arrow("t", 0, 0, DAMAGED).num_rows == DAMAGED


@pytest.mark.parametrize("mode", ["rescan", "rebuild"])
@pytest.mark.parametrize("queue_id", [-5, 70000])
def test_a_damaged_queue_id_costs_that_record_only(tmp_path, mode, queue_id):
    """A queue id no queue can have (negative, or past every queue) is not indexed anywhere
    when the queues are rescanned or rebuilt; the queue's other messages are all served."""
    path = str(tmp_path / "s")
    _damaged_store(path, "queue_id", mode, queue_id.to_bytes(4, "big", signed=True))
    with MessageStore.open(path, CONFIG) as store:
        assert os.listdir(os.path.join(path, "consumequeue", "t")) == ["0"]
        batch = store.read_arrow("t", 0, 0, store.max_offset("t", 0), skip_corrupt=True)
        assert batch.num_rows == 999
        assert b"m%d" % DAMAGED not in batch.column("body").to_pylist()
        assert sum(store.max_offset("t", q) for q in store.queue_ids("t")) == 1000


def _flip_queue_entries(path: str, first: int, count: int) -> None:
    """Flip bits inside entries ``[first, first + count)`` of queue t/0 (below its end)."""
    qdir = os.path.join(path, "consumequeue", "t", "0")
    name = sorted(n for n in os.listdir(qdir) if n.isdigit())[0]
    with open(os.path.join(qdir, name), "r+b") as fh:
        fh.seek(first * 20)
        raw = bytearray(fh.read(count * 20))
        fh.seek(first * 20)
        fh.write(bytes(b ^ 0x5A for b in raw))


@pytest.mark.parametrize("read_only", [False, True])
def test_a_damaged_queue_file_is_rebuilt_by_the_read_that_finds_it(tmp_path, read_only):
    """Entries flipped below the queue's end: the read that meets them rebuilds the queue
    from the CommitLog (a writable store sets the file aside and writes it anew; a reader
    serves an in-memory rebuild) and serves every message; no `rmq repair` needed."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, CONFIG) as store:
        producer = store.producer("g")
        for i in range(1000):
            producer.send(Message("t", b"m%d" % i), queue_id=0)
    before = {n: os.path.getsize(os.path.join(path, "commitlog", n))
              for n in os.listdir(os.path.join(path, "commitlog"))}
    _flip_queue_entries(path, 300, 5)
    with MessageStore.open(path, CONFIG, read_only=read_only) as store:
        views = store.pull("t", 0, 0, 2000)
        assert [v.body for v in views] == [b"m%d" % i for i in range(1000)]
        batch = store.read_arrow("t", 0, 0, 1000)
        assert batch.column("body").to_pylist() == [b"m%d" % i for i in range(1000)]
    qdir = os.path.join(path, "consumequeue", "t", "0")
    damaged = [n for n in os.listdir(qdir) if ".damaged" in n]
    assert (len(damaged) == 1) != read_only  # set aside by a writable store only
    assert before == {n: os.path.getsize(os.path.join(path, "commitlog", n))
                      for n in os.listdir(os.path.join(path, "commitlog"))}
    with MessageStore.open(path, CONFIG, read_only=True) as reader:  # (the file repaired, or
        assert len(reader.pull("t", 0, 0, 2000)) == 1000             # rebuilt in memory again)


@pytest.mark.parametrize("repaired", [False, True], ids=["file still damaged", "repaired"])
def test_a_reader_serving_a_rebuilt_queue_sees_its_end_move(tmp_path, repaired):
    """A reader that rebuilt a damaged queue in memory reads the entries a writer appends
    after it (to the damaged file, or to the file a writable open wrote anew)."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, CONFIG) as store:
        producer = store.producer("g")
        for i in range(1000):
            producer.send(Message("t", b"m%d" % i), queue_id=0)
    _flip_queue_entries(path, 300, 5)
    with MessageStore.open(path, CONFIG, read_only=True) as reader:
        assert len(reader.pull("t", 0, 0, 2000)) == 1000  # served from the rebuild
        with MessageStore.open(path, CONFIG) as writer:
            if repaired:  # the writer meets the damage too: the file is set aside, rewritten
                assert len(writer.pull("t", 0, 0, 2000)) == 1000
            producer = writer.producer("g")
            for i in range(1000, 1200):
                producer.send(Message("t", b"m%d" % i), queue_id=0)
            writer.flush()
            assert reader.max_offset("t", 0) == 1200
            views = reader.pull("t", 0, 990, 500)
            assert [v.body for v in views] == [b"m%d" % i for i in range(990, 1200)]
            assert [v.body for v in reader.pull("t", 0, 0, 2000)] == [
                b"m%d" % i for i in range(1200)]
    qdir = os.path.join(path, "consumequeue", "t", "0")
    assert bool([n for n in os.listdir(qdir) if ".damaged" in n]) == repaired


def _plain_checks(q: np.ndarray, phys: np.ndarray) -> np.ndarray:
    """The offset checks spelled out one entry at a time (the model)."""
    n = len(q)
    ok = [0 <= q[i] <= phys[i] // FIXED_SIZE for i in range(n)]
    for i in range(1, n - 1):  # a break its successor does not follow
        if q[i] != q[i - 1] + 1 and q[i + 1] == q[i - 1] + 2:
            ok[i] = False
    best = None
    for i in range(n):  # never back
        if ok[i]:
            if best is not None and q[i] <= best:
                ok[i] = False
            best = q[i] if best is None else max(best, q[i])
    return np.array(ok, dtype=bool)


@settings(max_examples=300, deadline=None)
@given(st.integers(-1, 50), st.integers(0, 60 * FIXED_SIZE),
       st.lists(st.tuples(st.integers(-2, 3), st.integers(0, 200)), min_size=1, max_size=40),
       st.booleans())
def test_the_run_fast_path_agrees_with_the_plain_checks(first, at, steps, unbroken):
    """One unbroken run is recognised without the checks; any other offsets get them."""
    q = [first]
    phys = [at]
    for step, gap in steps[1:]:
        q.append(q[-1] + (1 if unbroken else step))
        phys.append(phys[-1] + FIXED_SIZE + gap)
    q, phys = np.array(q, np.int64), np.array(phys, np.int64)
    got = plausible_queue_offsets(q, phys)
    expected = _plain_checks(q, phys)
    if got is None:
        assert expected.all()
    else:
        assert got.tolist() == expected.tolist()
    if unbroken and 0 <= first <= at // FIXED_SIZE:
        assert got is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 1, 2, 7, 1023, 70000, -5]),
                          st.booleans()), min_size=1, max_size=60))
def test_rows_are_grouped_by_queue_in_their_order(rows):
    """Both ways of grouping (small queue numbers, any others) keep each queue's rows in
    order and leave the unreadable ones out."""
    topic_ids = np.array([t for t, _, _ in rows], np.int32)
    queue_ids = np.array([q for _, q, _ in rows], np.int32)
    unreadable = np.array([u for _, _, u in rows], bool)
    expected: dict = {}
    for i, (t, q, u) in enumerate(rows):
        if not u:
            expected.setdefault((t, q), []).append(i)
    groups, order = _queue_groups(topic_ids, queue_ids,
                                  unreadable if unreadable.any() else None)
    got = {(t, q): order[a:b].tolist() for t, q, a, b in groups}
    assert got == expected
    assert all(b > a for _, _, a, b in groups)
