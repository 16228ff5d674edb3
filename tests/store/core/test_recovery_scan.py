"""The compiled recovery scan against the record checks, record by record and byte by byte.

A write cut short leaves the last record with a zeroed suffix (fresh file pages are zero):
the scan must stop exactly before that record wherever the cut falls, keep every record
before it, and agree with :func:`store.formats.record_codec.check_record` (the reference checks) on each
record.  Damage inside a record (a flipped body byte, a wrong length) stops it there too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import Message, MessageStore
from store.files.checkpoint import StoreCheckpoint
from store.formats.record_codec import RecordCheck, check_record
from store.kernels.segment_walk import STOP_BLANK, STOP_FULL, STOP_INVALID, walk_records


def _fill(store, n=40):
    p = store.producer("g")
    out = []
    for i in range(n):
        m = Message(f"t{i % 3}", bytes([i % 251 + 1]) * (i * 7 % 300 + 1), tags=f"tag{i % 4}",
                    keys=f"k{i}", properties={"p": "v" * (i % 5 + 1)} if i % 2 else {})
        out.append(p.send(m).commitlog_offset)
    return out


def _reference(buf, pos, limit):
    """The Python checks, record by record: positions of the valid prefix and the stop."""
    buf = bytes(buf)  # as a segment mapping reads: ints, not NumPy scalars
    got = []
    while True:
        size = check_record(buf, pos, limit)
        if size == RecordCheck.BLANK:
            return got, pos, STOP_BLANK
        if size == RecordCheck.INVALID:
            return got, pos, STOP_INVALID
        got.append(pos)
        pos += size


def test_a_torn_last_record_is_cut_at_every_byte(store):
    offsets = _fill(store)
    f = store.commit_log.files.files[0]
    last = offsets[-1] - f.start
    end = store.confirmed_offset() - f.start
    pristine = bytes(f.buffer()[:end])
    for cut in range(last, end):  # the record's bytes from `cut` on never reached the file
        buf = np.frombuffer(pristine[:cut] + bytes(end - cut + 64), dtype=np.uint8)
        positions, sizes, stop_at, stop = walk_records(buf, 0, len(buf))
        assert stop == STOP_INVALID and stop_at == last, cut
        kept = (positions + f.start).tolist()
        assert kept[kept.index(offsets[0]):] == offsets[:-1]  # (a warm-up record may precede)
        ref, ref_end, ref_stop = _reference(buf, 0, len(buf))
        assert ref == positions.tolist() and ref_end == stop_at and ref_stop == stop


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_damage_anywhere_stops_the_scan_where_the_reference_stops(fresh_dir, data):
    path = str(fresh_dir("scan") / "store")
    with MessageStore.open(path) as store:
        _fill(store, 12)
        f = store.commit_log.files.files[0]
        end = store.confirmed_offset() - f.start
        raw = bytearray(f.buffer()[:end]) + bytearray(64)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, end - 1))
        raw[i] = data.draw(st.integers(0, 255))
    buf = np.frombuffer(bytes(raw), dtype=np.uint8)
    positions, sizes, stop_at, stop = walk_records(buf, 0, len(buf))
    ref, ref_end, ref_stop = _reference(buf, 0, len(buf))
    assert positions.tolist() == ref and stop_at == ref_end and stop == ref_stop


def test_a_full_output_resumes_where_it_stopped(store):
    offsets = _fill(store, 25)
    f = store.commit_log.files.files[0]
    buf = np.frombuffer(f.buffer(), dtype=np.uint8)
    seen, pos = [], 0
    while True:
        positions, _, pos, stop = walk_records(buf, pos, f.size, max_records=7)
        seen += (positions + f.start).tolist()
        if stop != STOP_FULL:
            break
    assert seen[seen.index(offsets[0]):] == offsets and stop == STOP_INVALID


@pytest.mark.parametrize("crashed", [True, False])
@pytest.mark.parametrize("cut_from_end", [1, 2, 30, 200])
def test_reopen_after_a_torn_last_record_keeps_the_rest(store_path, small_config, clock,
                                                         cut_from_end, crashed):
    store = MessageStore.open(store_path, small_config, clock=clock)
    offsets = _fill(store)
    end = store.confirmed_offset()
    last = offsets[-1]
    store.close()
    size = small_config.commitlog_file_size_bytes
    start = max(last, end - cut_from_end)
    with open(f"{store_path}/commitlog/{last - last % size:020d}", "r+b") as fh:
        fh.seek(start % size)  # the last bytes never reached the disk
        fh.write(bytes(end - start))
    if crashed:  # the process died after the first record was flushed: a crash recovery
        cp = StoreCheckpoint(f"{store_path}/checkpoint")
        cp.set("flushed_phy_offset", offsets[0])
        cp.flush()
        cp.close()
        open(f"{store_path}/abort", "w").close()
    # else: a clean open re-checks the last append and finds it damaged
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        assert s.confirmed_offset() == last
        kept = sum(s.max_offset(f"t{i}", q) for i in range(3) for q in s.queue_ids(f"t{i}"))
        assert kept == len(offsets) - 1
        assert s.recovered
