"""The recovery scan's two-thread walk against the one-thread checking walk.

:func:`store.core.recovery.checked_walk` walks the two halves of a window on two threads: the
second from the first record found at or after the middle.  A body may hold a whole valid
record (a message whose body is another record's bytes), so the record found there can be a
false start; damage can stop the first half early.  Whatever the bytes, the walk must keep
exactly the records the plain walk (:func:`~store.kernels.segment_walk.walk_records`, CRCs checked)
keeps and stop where it stops, and the columns it reads must be those of the records.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import Message, MessageStore
from store.formats.record_codec import decode_record
from store.core import recovery
from store.kernels.recovery_scan import TABLE_SIZE, index_records
from store.kernels.segment_walk import STOP_FULL, walk_records


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of a few records, every one of them split in two."""
    monkeypatch.setattr(recovery, "WALK_WINDOW", 2048)
    monkeypatch.setattr(recovery, "MIN_SPLIT_BYTES", 256)
    kept = []
    real = recovery._record_start

    def counting(*args):
        found = real(*args)
        kept.append(found)
        return found

    monkeypatch.setattr(recovery, "_record_start", counting)
    return kept


def _plain(buf: np.ndarray, limit: int):
    seen, pos = [], 0
    while True:
        positions, _, pos, stop = walk_records(buf, pos, limit, max_records=5)
        seen += positions.tolist()
        if stop != STOP_FULL:
            return seen, pos, stop


def _checked(buf: np.ndarray, limit: int):
    seen, runs, pos = [], [], 0
    while True:
        parts, count, pos, stop = recovery.checked_walk(buf, pos, limit)
        assert count == sum(map(len, parts))
        for index in parts:
            seen += index.positions.tolist()
            runs.append(index)
        if stop != STOP_FULL:
            return seen, pos, stop, runs


def _messages(n: int, tag_count: int = 4):
    """Messages of three topics, most with a tag, a key and a property."""
    out = []
    for i in range(n):
        body = bytes([i % 251 + 1]) * (i * 37 % 300 + 1)
        out.append(Message(f"t{i % 3}", body, tags=f"tag{i % tag_count}" if i % 5 else None,
                           keys=f"k{i}", properties={"p": "v" * (i % 4 + 1)}))
    return out


def _store_bytes(path, messages, embed_every: int = 0) -> tuple[bytes, list[int]]:
    """The segment bytes after sending ``messages`` (every ``embed_every``-th one's body
    replaced by the previous record's bytes) and the records' positions."""
    with MessageStore.open(path) as store:
        p = store.producer("g")
        offsets = []
        for i, m in enumerate(messages):
            if embed_every and i % embed_every == embed_every - 1 and offsets:
                f = store.commit_log.files.files[0]
                prev = offsets[-1] - f.start
                size = int.from_bytes(bytes(f.buffer()[prev:prev + 4]), "big")
                # a body holding a whole valid record: a false record start inside a record
                m = Message(m.topic, bytes(7) + bytes(f.buffer()[prev:prev + size]) + b"x",
                            tags=m.tags)
            offsets.append(p.send(m).commitlog_offset)
        f = store.commit_log.files.files[0]
        end = store.confirmed_offset() - f.start
        return bytes(f.buffer()[:end]), [o - f.start for o in offsets]


def test_the_split_walk_keeps_every_record_and_reads_its_columns(tmp_path, small_windows):
    raw, offsets = _store_bytes(str(tmp_path / "s"), _messages(90, tag_count=TABLE_SIZE + 9))
    buf = np.frombuffer(raw + bytes(64), dtype=np.uint8)
    seen, end, stop, runs = _checked(buf, len(buf))
    assert (seen, end, stop) == _plain(buf, len(buf))
    assert seen == offsets
    assert any(found is not None for found in small_windows)  # windows were split
    whole = index_records(buf, 0, len(buf), max_records=len(offsets) + 1)[0]
    assert len(set(whole.tag_ids.tolist())) > TABLE_SIZE + 1  # past the table: hashed too
    for index in runs + [whole]:
        for row, pos in enumerate(index.positions.tolist()):
            rec = decode_record(raw, pos)
            assert index.sizes[row] == rec.total_size
            assert index.body_crcs[row] == rec.body_crc
            assert index.body_lengths[row] == len(rec.body)
            assert index.queue_ids[row] == rec.queue_id
            assert index.queue_offsets[row] == rec.queue_offset
            assert index.sys_flags[row] == rec.sys_flag
            assert index.store_timestamps[row] == rec.store_timestamp_ms
            assert index.topics[index.topic_ids[row]].decode() == rec.topic
            tag = rec.properties.get("TAGS")
            if tag:
                assert index.tags[index.tag_ids[row]].decode() == tag
                assert raw[index.tag_starts[row]:index.tag_ends[row]].decode() == tag
            else:
                assert index.tag_ids[row] == -1


def test_a_record_inside_a_body_is_not_taken_for_the_next_record(tmp_path, monkeypatch):
    raw, offsets = _store_bytes(str(tmp_path / "s"), _messages(12), embed_every=3)
    buf = np.frombuffer(raw + bytes(64), dtype=np.uint8)
    # a window whose middle falls just before a record embedded in a body
    carrier = offsets[2]
    inner = carrier + 88 + 7  # the header, then 7 bytes of the body before the record
    monkeypatch.setattr(recovery, "MIN_SPLIT_BYTES", 1)
    monkeypatch.setattr(recovery, "WALK_WINDOW", 2 * (inner - offsets[1]))
    assert recovery._record_start(buf, inner, len(buf), len(buf)) == inner  # a false start
    parts, count, end, stop = recovery.checked_walk(buf, offsets[1], len(buf))
    # the first half ends at the next real record, not at the false start: only it is kept
    assert len(parts) == 1 and parts[0].positions.tolist() == [offsets[1], carrier]
    assert (end, stop) == (offsets[3], STOP_FULL)
    seen, end, stop, _ = _checked(buf, len(buf))
    assert (seen, end, stop) == _plain(buf, len(buf))
    assert seen == offsets


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_damage_anywhere_stops_the_split_walk_where_the_plain_walk_stops(fresh_dir, data):
    path = str(fresh_dir("walk") / "s")
    embed = data.draw(st.sampled_from([0, 2, 4]))
    raw, offsets = _store_bytes(path, _messages(data.draw(st.integers(3, 30))), embed)
    raw = bytearray(raw) + bytearray(64)
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(0, len(raw) - 65))] = data.draw(st.integers(0, 255))
    buf = np.frombuffer(bytes(raw), dtype=np.uint8)
    window = data.draw(st.integers(200, 4000))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recovery, "WALK_WINDOW", window)
        mp.setattr(recovery, "MIN_SPLIT_BYTES", data.draw(st.integers(1, window)))
        seen, end, stop, _ = _checked(buf, len(buf))
    assert (seen, end, stop) == _plain(buf, len(buf))


def test_a_torn_last_record_is_cut_at_every_byte_by_the_split_walk(tmp_path, small_windows):
    raw, offsets = _store_bytes(str(tmp_path / "s"), _messages(14))
    last, end = offsets[-1], len(raw)
    for cut in range(last, end):  # the record's bytes from `cut` on never reached the file
        buf = np.frombuffer(raw[:cut] + bytes(end - cut + 64), dtype=np.uint8)
        seen, stop_at, stop, _ = _checked(buf, len(buf))
        assert (seen, stop_at, stop) == _plain(buf, len(buf)), cut
        assert seen == offsets[:-1] and stop_at == last, cut


def _queues(store) -> dict:
    return {(t, q): store.consume_queue(t, q).entries(0, store.max_offset(t, q)).tobytes()
            for t in store.topics() for q in store.queue_ids(t)}


@pytest.mark.parametrize("torn", [False, True])
def test_a_crash_recovery_with_split_windows_indexes_what_one_thread_indexes(
        tmp_path, monkeypatch, torn):
    """The same crashed store recovered twice, by one-thread walks and by two-thread walks of
    small windows: the same ConsumeQueues, the same end of the log."""
    import shutil
    import subprocess

    from store.files.checkpoint import StoreCheckpoint

    path = str(tmp_path / "crashed")
    with MessageStore.open(path) as store:
        p = store.producer("g")
        for m in _messages(300, tag_count=TABLE_SIZE + 5):
            p.send(m)
        last = p.send(Message("t0", b"the last one", tags="z")).commitlog_offset
        end = store.confirmed_offset()
    if torn:  # the last record's tail never reached the disk
        with open(f"{path}/commitlog/{0:020d}", "r+b") as fh:
            fh.seek(end - 5)
            fh.write(bytes(5))
    cp = StoreCheckpoint(f"{path}/checkpoint")
    cp.set("flushed_phy_offset", 0)  # everything is past the last flush: all rescanned
    cp.flush()
    cp.close()
    open(f"{path}/abort", "w").close()
    shutil.rmtree(f"{path}/consumequeue")  # nothing indexed survives: recovery rebuilds it
    # a sparse copy: the 1 GiB segment holds a few KiB
    subprocess.run(["cp", "-r", "--sparse=always", path, str(tmp_path / "copy")], check=True)
    results = []
    for where, window in ((path, None), (str(tmp_path / "copy"), 4096)):
        with pytest.MonkeyPatch.context() as mp:
            if window:
                mp.setattr(recovery, "WALK_WINDOW", window)
                mp.setattr(recovery, "MIN_SPLIT_BYTES", 512)
            with MessageStore.open(where) as store:
                assert store.recovered
                results.append((store.confirmed_offset(), _queues(store)))
    assert results[0] == results[1]
    assert results[0][0] == (last if torn else end)
    assert sum(len(b) // 20 for b in results[0][1].values()) == 301 - torn


def test_more_topics_than_the_table_holds_are_numbered_by_hash(tmp_path):
    messages = [Message(f"topic-{i % (TABLE_SIZE + 8)}", b"x" * (i % 7 + 1), tags=f"t{i % 3}")
                for i in range(120)]
    raw, offsets = _store_bytes(str(tmp_path / "s"), messages)
    buf = np.frombuffer(raw + bytes(64), dtype=np.uint8)
    index, end, stop = index_records(buf, 0, len(buf), max_records=200)
    assert index.positions.tolist() == offsets
    names = [index.topics[t].decode() for t in index.topic_ids.tolist()]
    assert names == [decode_record(raw, p).topic for p in offsets]
    assert len(index.topics) == len(set(index.topics)) == TABLE_SIZE + 8
