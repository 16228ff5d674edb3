"""The CommitLog copied between replicas (``store.core.replica_log``), without a network:
chunks of whole records, blanks across segments, every check a follower runs before it
appends, and the divergence checks of a leader."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pytest

from store import Message, MessageStore
from store.base.errors import ReplicaDivergedError, ReplicationError
from store.core.replica_log import append_chunk, read_chunk, tail_crc
from store.formats.record_codec import FIELD_OFFSET, HEADER_SIZE
from store.remote.replication_stream import chunk_batch

SMALL = {"commitlog_file_size_bytes": 64 * 1024}


@pytest.fixture
def leader(tmp_path):
    with MessageStore.open(str(tmp_path / "a"), SMALL) as s:
        p = s.producer("g")
        for i in range(50):
            p.send(Message("orders", b"m-%d" % i * 40, tags="t"))
        p.send_table(pa.table({"body": [b"r%d" % i * 30 for i in range(4000)]}), topic="bulk")
        p.send(Message("orders", b"later"), delay_ms=60_000)
        yield s


def copy_all(leader, follower, max_bytes: int, as_batches: bool = False) -> int:
    """Copy the leader's log in chunks of at most ``max_bytes``; returns how many.
    ``as_batches``: each chunk goes through the replication stream's Arrow batch, and its
    Arrow buffer is appended as the follower appends it (not copied to bytes)."""
    n = 0
    while follower.confirmed_offset() < leader.confirmed_offset():
        offset = follower.confirmed_offset()
        chunk = read_chunk(leader, offset, max_bytes, follower_crc=tail_crc(follower, offset),
                           file_size=SMALL["commitlog_file_size_bytes"])
        data = chunk.data
        if as_batches:
            batch = chunk_batch(chunk, (7, 3))
            batch.validate(full=True)
            assert batch.to_pylist() == [{"offset": chunk.offset, "end": chunk.end,
                                          "leader_end": chunk.leader_end, "data": chunk.data,
                                          "high_watermark": 7, "leader_min": 3}]
            data = batch.column("data")[0].as_buffer()
        done = append_chunk(follower, chunk.offset, data)
        assert done.end == chunk.end
        n += 1
    return n


@pytest.mark.parametrize("as_batches", [False, True], ids=["bytes", "arrow-buffers"])
def test_chunks_of_whole_records_rebuild_the_same_log_and_queues(leader, tmp_path, as_batches):
    with MessageStore.open(str(tmp_path / "b"), SMALL) as follower:
        chunks = copy_all(leader, follower, 5000, as_batches)
        end = leader.confirmed_offset()
        assert chunks > end // 5000 and end > 5 * SMALL["commitlog_file_size_bytes"]
        for offset in range(0, end, SMALL["commitlog_file_size_bytes"]):
            a = leader.commit_log.files.find(offset).buffer()
            b = follower.commit_log.files.find(offset).buffer()
            size = min(len(a), end - offset)
            assert bytes(a[:size]) == bytes(b[:size])
        for topic in ("orders", "bulk", "rmq_sys_wheel_timer"):
            for q in leader.queue_ids(topic):
                hi = leader.max_offset(topic, q)
                assert follower.max_offset(topic, q) == hi
                assert (follower.queue_entries(topic, q, 0, hi).tolist()
                        == leader.queue_entries(topic, q, 0, hi).tolist())
        assert copy_all(leader, follower, 5000) == 0
        assert read_chunk(leader, end, 5000).data == b""


def test_a_record_larger_than_the_bound_travels_alone(leader):
    chunk = read_chunk(leader, 0, 10)
    assert len(chunk.data) == leader.read_record(0).total_size == chunk.end


def test_a_follower_checks_every_chunk_before_it_writes(leader, tmp_path):
    good = read_chunk(leader, 0, 4000)
    size = SMALL["commitlog_file_size_bytes"]
    raw = bytearray(good.data)
    flipped = bytearray(raw)
    flipped[HEADER_SIZE + 2] ^= 0xFF  # a body byte: its CRC fails
    moved = bytearray(raw)
    moved[FIELD_OFFSET["physical_offset"] + 7] ^= 1  # names another offset
    with MessageStore.open(str(tmp_path / "b"), SMALL) as follower:
        for data, why in ((bytes(flipped), "record checks"), (bytes(moved), "physical offset"),
                          (bytes(raw[:-3]), "record checks"), (b"", "inside one"),
                          (bytes(raw) * 40, "inside one")):
            with pytest.raises(ReplicationError, match=why):
                append_chunk(follower, 0, data)
        with pytest.raises(ReplicaDivergedError, match="ends at 0"):
            append_chunk(follower, good.end, read_chunk(leader, good.end, 4000).data)
        assert follower.confirmed_offset() == 0
        assert follower.commit_log.files.find(0) is None or not any(
            np.frombuffer(follower.commit_log.files.find(0).buffer()[:size], np.uint8))
        append_chunk(follower, 0, good.data)
        assert follower.confirmed_offset() == good.end


def test_a_leader_refuses_a_follower_that_is_no_prefix(leader, tmp_path):
    end = leader.confirmed_offset()
    size = SMALL["commitlog_file_size_bytes"]
    with pytest.raises(ReplicaDivergedError, match="past the leader"):
        read_chunk(leader, end + 100, 4000)
    with pytest.raises(ReplicaDivergedError, match="no record's start"):
        read_chunk(leader, 3, 4000)
    first = read_chunk(leader, 0, 4000)
    with pytest.raises(ReplicaDivergedError, match="differs"):
        read_chunk(leader, first.end, 4000, follower_crc=zlib.crc32(b"other bytes"))
    assert read_chunk(leader, first.end, 4000,
                      follower_crc=tail_crc(leader, first.end)).offset == first.end
    with pytest.raises(ReplicationError, match="commitlog_file_size_bytes"):
        read_chunk(leader, 0, 4000, file_size=size * 2)


def test_a_one_record_chunk_needs_no_topic_table_and_keeps_the_flock_leased(tmp_path):
    """A synchronous single send's chunk is cheap on the follower: the queue-id check asks
    the topic table only past MAX_QUEUE_ID (no ``topics.json`` look per chunk), and a small
    chunk takes a lease on the ``flock`` as a single send does; every record check stays."""
    config = dict(SMALL, append_lock_lease_ms=1000)
    with MessageStore.open(str(tmp_path / "a"), SMALL) as leader, \
            MessageStore.open(str(tmp_path / "b"), config) as follower:
        p = leader.producer("g")
        for i in range(4):
            p.send(Message("orders", b"one-%d" % i, tags="t"))
        first = read_chunk(leader, 0, 1)
        append_chunk(follower, 0, first.data)  # (the topic is created here)
        follower._lease.release()

        def no_table(topic):
            raise AssertionError(f"the topic table was asked for {topic!r}")

        follower.topic_table.queue_count = no_table
        offset = first.end
        while offset < leader.confirmed_offset():
            chunk = read_chunk(leader, offset, 1)
            assert append_chunk(follower, offset, chunk.data).records == 1
            assert follower._lease.held  # (kept for the next chunk)
            offset = chunk.end
        for q in leader.queue_ids("orders"):
            hi = leader.max_offset("orders", q)
            assert (follower.queue_entries("orders", q, 0, hi).tolist()
                    == leader.queue_entries("orders", q, 0, hi).tolist())
        moved = bytearray(read_chunk(leader, 0, 1).data)
        moved[FIELD_OFFSET["physical_offset"] + 7] ^= 1
        with pytest.raises(ReplicationError, match="physical offset"):
            append_chunk(follower, offset, bytes(moved))
