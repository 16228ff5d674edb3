"""The placement a large append's chunks presume while they are encoded
(:mod:`store.core.placement_chain`): the fields it writes are those the append would write,
and the append writes them itself whenever the presumption fails."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from store import MessageStore, StoreConfig
from store.core import appender as appender_module
from store.core.placement_chain import PlacementChain
from store.produce.table_producer import CHUNK_ROWS

#: small segments: chunks of CHUNK_ROWS records cross them (blanks, the next segment)
CONFIG = StoreConfig(commitlog_file_size_bytes=1 << 20, default_queue_count=3)
N = 3 * CHUNK_ROWS + 123


@pytest.fixture
def patches(monkeypatch):
    """How many appends wrote the placement fields themselves."""
    calls = []
    real = appender_module.patch_placed

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(appender_module, "patch_placed", counted)
    return calls


def _check_every_queue(store) -> int:
    """Every queue entry of every topic (system topics too) points at a record whose own
    queue id, queue offset and physical offset are the entry's; returns how many."""
    seen = 0
    for topic in store.topics(include_system=True):
        for q in store.queue_ids(topic):
            for v in store.pull(topic, q, store.min_offset(topic, q), 1_000_000):
                record = store.read_record(v.commitlog_offset)
                assert (record.topic, record.queue_id, record.queue_offset,
                        record.physical_offset) == (topic, q, v.queue_offset,
                                                    v.commitlog_offset)
                seen += 1
    return seen


def _table(n: int, **columns) -> pa.Table:
    return pa.table({"topic": ["orders"] * n, "body": [b"%d" % i for i in range(n)],
                     **columns})


def test_chunks_land_as_presumed_and_need_no_patch(tmp_path, clock, patches):
    with MessageStore.open(str(tmp_path / "s"), CONFIG, clock=clock) as s:
        p = s.producer("g")
        p.send_table(_table(1))
        patches.clear()
        out = p.send_table(_table(N))
        assert patches == []  # every chunk's fields were written as it was encoded
        assert _check_every_queue(s) == N + 1
        for i in (0, CHUNK_ROWS - 1, CHUNK_ROWS, N - 1):
            record = s.read_record(out.column("commitlog_offset")[i].as_py())
            assert record.body == b"%d" % i and record.store_timestamp_ms == clock()


def test_a_writer_between_chunks_makes_the_append_write_the_fields(tmp_path, clock, patches):
    """Another handle appends before every chunk: no chunk lands where it was presumed, and
    each append writes the fields itself; every record and queue entry agrees."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, CONFIG, clock=clock) as s, \
            MessageStore.open(path, CONFIG, clock=clock) as other:
        p, q = s.producer("g"), other.producer("h")
        p.send_table(_table(1))
        core = s  # (a MessageStore is its StoreCore)
        real = core.append_assembled

        def interleaved(records):
            q.send_table(_table(3))  # the same topic: its queues move on too
            return real(records)

        core.append_assembled = interleaved
        try:
            patches.clear()
            out = p.send_table(_table(N))
        finally:
            del core.append_assembled
        chunks = -(-N // CHUNK_ROWS)
        assert len(patches) >= chunks  # (the other handle's one-chunk tables add theirs)
        assert _check_every_queue(s) == N + 1 + 3 * chunks
        log = out.column("commitlog_offset").to_numpy()
        assert [s.read_record(int(o)).body for o in log[::997]] == [
            b"%d" % i for i in range(0, N, 997)]


def test_delayed_chunks_are_presumed_in_their_delay_queue(tmp_path, clock, patches):
    with MessageStore.open(str(tmp_path / "s"), CONFIG, clock=clock) as s:
        p = s.producer("g")
        p.send_table(_table(1))
        patches.clear()
        p.send_table(_table(N, delay_ms=pa.array([60_000] * N, pa.int64())))
        p.send_table(_table(N, delay_level=pa.array([3] * N, pa.int32())))
        assert patches == []
        assert _check_every_queue(s) == 2 * N + 1


def test_a_chunk_that_fails_releases_the_chunks_after_it(tmp_path, clock, monkeypatch):
    """An error while chunk 1 is encoded, before it is placed, is raised, and the chunks
    after it (claimed by the other thread meanwhile) do not wait for its placement for ever."""
    real = PlacementChain.presume

    def failing(self, k, records, sizes):
        if k == 1:
            time.sleep(0.5)  # the other thread claims chunk 2 meanwhile: it waits for this
            raise OSError("chunk 1 failed")  # (the chain's own release not reached)
        return real(self, k, records, sizes)

    monkeypatch.setattr(PlacementChain, "presume", failing)
    outcome = []

    def run():
        with MessageStore.open(str(tmp_path / "s"), CONFIG, clock=clock) as s:
            try:
                s.producer("g").send_table(_table(N))
            except OSError as exc:
                outcome.append(str(exc))

    t = threading.Thread(target=run, daemon=True)  # (a hung one must not keep pytest)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the append hangs"
    assert outcome == ["chunk 1 failed"]


def test_chunk_k_waits_for_chunk_k_minus_1(tmp_path, clock):
    """Chunks presumed out of order: chunk 1 waits until chunk 0 is placed and lands after
    it; a chunk whose queue end is unknown is not presumed, and neither is a later chunk
    after a chunk that was released unplaced."""
    with MessageStore.open(str(tmp_path / "s"), CONFIG, clock=clock) as s:
        s.producer("g").send_table(_table(1))
        core = s  # (a MessageStore is its StoreCore)
        chain = core.placement_chain(4, [("orders", 0)])
        from store.produce.table_rows import prepare_rows
        from store.produce.table_producer import _encode_chunk

        rows = prepare_rows(core, _table(20))
        zeros = np.zeros(10, np.int64)
        got = {}

        def encode(k, lo):
            got[k] = _encode_chunk(core, rows.slice(lo, lo + 10), zeros, 0, None,
                                   presume=lambda r, sizes: chain.presume(k, r, sizes))[0]

        later = threading.Thread(target=encode, args=(1, 10))
        later.start()
        later.join(0.3)
        assert later.is_alive()  # waiting for chunk 0
        encode(0, 0)
        later.join(10)
        first, second = got[0].presumed, got[1].presumed
        assert first.key == second.key == ("orders", 0)
        assert second.queue_first == first.queue_first + 10
        assert second.log_end == first.log_end + int(got[0].sizes.sum())
        chain.release(2)  # chunk 2 failed
        encode(3, 0)
        assert got[3].presumed is None


def test_a_sink_commit_copies_its_records_as_presumed(tmp_path, clock, patches):
    """The exactly-once sink's commit copies staged records into the topic in chunks whose
    placement is presumed as they are copied: no append writes the fields, every queue
    entry and record agrees, and the records read back as staged."""
    with MessageStore.open(str(tmp_path / "s"), CONFIG, clock=clock) as s:
        s.producer("g").send_table(_table(1))
        sink = s.sink("job", commit="copy")  # (the copying commit: its copies are presumed)
        staged = sink.stage(_table(N))
        clock.advance(5)
        patches.clear()
        assert sink.commit(0, staged).rows == N
        assert patches == []
        assert _check_every_queue(s) > N + 1  # (also the sink's marker, the ops)
        bodies = [v.body for q in s.queue_ids("orders")
                  for v in s.pull("orders", q, 0, 1_000_000)]
        assert sorted(bodies) == sorted([b"0", *(b"%d" % i for i in range(N))])
        first = s.pull("orders", s.queue_ids("orders")[1], 0, 1)[0]
        assert s.read_record(first.commitlog_offset).store_timestamp_ms == clock()
