"""ConsumeQueue: 20-byte entries, file roll, idempotent dispatch, min offsets."""

from __future__ import annotations

import os

import numpy as np
import pytest

from store import Message, MessageStore
from store.files.consume_queue import ENTRY_DTYPE, ENTRY, ENTRY_SIZE, ConsumeQueue
from store.formats.message import java_string_hash
from store.core.recovery import recover_tail


@pytest.fixture
def one_queue(store_path, small_config, clock):
    """A store whose topics have one queue (1000 entries per ConsumeQueue file)."""
    s = MessageStore.open(store_path, small_config.replace(default_queue_count=1), clock=clock)
    yield s
    s.close()


def cq_bytes(store):
    out = {}
    root = os.path.join(store.root, "consumequeue")
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                out[os.path.relpath(os.path.join(dirpath, name), root)] = fh.read()
    return out


def test_entry_layout():
    assert ENTRY.size == ENTRY_DTYPE.itemsize == ENTRY_SIZE == 20
    assert ENTRY_DTYPE.fields["offset"][1] == 0
    assert ENTRY_DTYPE.fields["size"][1] == 8
    assert ENTRY_DTYPE.fields["tags_code"][1] == 12


def test_entries_point_at_the_records(one_queue):
    p = one_queue.producer("g")
    sent = [p.send(Message("q", b"x" * i, tags=["TagA", None, "B"][i % 3])) for i in range(1, 60)]
    sent += p.send_batch([Message("q", b"b" * i, tags="TagA") for i in range(1, 60)])
    cq = one_queue.consume_queue("q", 0)
    entries = cq.entries(0, len(sent))
    assert list(entries["offset"]) == [r.commitlog_offset for r in sent]
    assert list(entries["size"]) == [one_queue.read_record(r.commitlog_offset).total_size
                                     for r in sent]
    expected_tags = [["TagA", None, "B"][i % 3] for i in range(1, 60)] + ["TagA"] * 59
    assert list(entries["tags_code"]) == [java_string_hash(t) if t else 0 for t in expected_tags]
    assert java_string_hash("TagA") == 2598919
    # on disk: big-endian units at n * 20
    with open(os.path.join(one_queue.root, "consumequeue", "q", "0", "0" * 20), "rb") as fh:
        raw = fh.read()
    assert ENTRY.unpack_from(raw, 5 * 20) == (sent[5].commitlog_offset,
                                                 int(entries["size"][5]),
                                                 int(entries["tags_code"][5]))


def test_queue_files_roll_every_1000_entries(one_queue):
    p = one_queue.producer("g")
    for _ in range(5):
        p.send_batch([Message("roll", b"r" * 10) for _ in range(500)])
    names = sorted(os.listdir(os.path.join(one_queue.root, "consumequeue", "roll", "0")))
    assert names == ["00000000000000000000", "00000000000000020000", "00000000000000040000"]
    for n in names:
        path = os.path.join(one_queue.root, "consumequeue", "roll", "0", n)
        assert os.path.getsize(path) == 20000
    assert one_queue.max_offset("roll", 0) == 2500
    entries = one_queue.queue_entries("roll", 0, 990, 1010)  # across the file boundary
    assert len(entries) == 20 and np.all(np.diff(entries["offset"]) > 0)
    views = one_queue.pull("roll", 0, 995, 10)
    assert [v.queue_offset for v in views] == list(range(995, 1005))


def test_new_files_are_synced_by_the_next_flush_not_when_created(one_queue, monkeypatch):
    """Creating a queue or CommitLog file does not fsync its directory (6-13 ms each on
    ext4); the next flush does, once per directory, after the files' bytes."""
    from store.files import mapped_file

    synced = []
    monkeypatch.setattr(mapped_file, "fsync_dir", synced.append)
    p = one_queue.producer("g")
    for _ in range(3):  # three queue files, and the CommitLog's segments
        p.send_batch([Message("roll", b"r" * 10) for _ in range(500)])
    assert synced == []
    one_queue.flush()
    queue_dir = os.path.join(one_queue.root, "consumequeue", "roll", "0")
    assert synced.count(queue_dir) == 1
    assert synced.count(os.path.join(one_queue.root, "commitlog")) == 1
    synced.clear()
    p.send(Message("roll", b"r"))  # no new file: nothing to sync
    one_queue.flush()
    assert synced == []


def test_repeated_dispatch_is_a_no_op(one_queue):
    p = one_queue.producer("g")
    for i in range(30):
        p.send(Message(f"t{i % 3}", b"x" * 100, tags="a"))
    p.send_batch([Message("t0", b"y" * 50)] * 1200)  # rolls t0's queue file
    before = cq_bytes(one_queue)
    maxes = {t: one_queue.max_offset(t, 0) for t in ("t0", "t1", "t2")}
    end = recover_tail(one_queue, 0)  # re-dispatch every record of the CommitLog
    assert end == one_queue.confirmed_offset()
    assert cq_bytes(one_queue) == before
    assert {t: one_queue.max_offset(t, 0) for t in ("t0", "t1", "t2")} == maxes
    # and writing entries again by hand changes nothing either
    cq = one_queue.consume_queue("t0", 0)
    e = cq.entries(0, 1210)
    cq.put(0, e["offset"], e["size"], e["tags_code"])
    assert cq_bytes(one_queue) == before
    # appends continue with the next queue offset
    assert p.send(Message("t0", b"z")).queue_offset == maxes["t0"]


def synthetic(tmp_path, n=100, start=0, size=100):
    cq = ConsumeQueue(str(tmp_path / "cq"), "t", 0, 1000)
    if start:
        cq.fill_to(start)
    if n:
        offs = np.arange(n, dtype=np.int64) * size
        cq.put(start, offs, np.full(n, size), np.zeros(n, np.int64))
    return cq


def test_min_offset_is_the_first_entry_whose_record_exists(tmp_path):
    cq = synthetic(tmp_path)
    assert cq.max_offset() == 100
    assert cq.min_offset(0) == 0
    assert cq.min_offset(2000) == 20  # correctMinOffset(2000) with 100-byte messages
    assert cq.min_offset(2050) == 21
    assert cq.min_offset(10**9) == cq.max_offset() == 100  # all stale: min = max


def test_queue_starting_at_100_has_min_equal_max(tmp_path):
    cq = synthetic(tmp_path, n=0, start=100)
    assert cq.max_offset() == 100
    assert cq.min_offset(0) == 100
    e = cq.entry(5)
    assert e == (0, 0x7FFFFFFF, 0)  # RocketMQ's filler unit


def test_fillers_then_entries(tmp_path):
    cq = synthetic(tmp_path, n=10, start=100)
    assert cq.max_offset() == 110
    assert cq.min_offset(0) == 100


def test_max_offset_ignores_entries_past_the_confirmed_offset(tmp_path):
    cq = synthetic(tmp_path, n=50)
    assert cq.max_offset(limit_phys=50 * 100) == 50
    assert cq.max_offset(limit_phys=20 * 100) == 20
    assert cq.max_offset(limit_phys=20 * 100 + 99) == 20


def test_truncate_physical_cuts_entries_at_and_after_an_offset(tmp_path):
    cq = synthetic(tmp_path, n=2500)  # three files
    cq.truncate_physical(1500 * 100 + 1)
    assert cq.max_offset() == 1501
    cq.truncate_physical(1000 * 100)
    assert cq.max_offset() == 1000
    # later files are zeroed, not deleted: a reader that mapped them keeps seeing the file
    # the writer fills next
    reader = ConsumeQueue(os.path.dirname(os.path.dirname(cq.directory)), "t", 0, 1000)
    assert reader.max_offset() == 1000
    assert not any(bytes(f.buffer()) != bytes(f.size) for f in cq.files.files[1:])
    cq.put(1000, np.arange(5) * 7 + 10**6, np.full(5, 7), np.zeros(5, np.int64))
    assert reader.max_offset() == 1005
    assert reader.entry(1002) == (10**6 + 14, 7, 0)
    cq.truncate_physical(0)
    assert cq.max_offset() == reader.max_offset() == 0


def test_unknown_topic_queue_reads(store):
    from store import UnknownTopicError

    with pytest.raises(UnknownTopicError):
        store.max_offset("nope", 0)
    store.producer("g").send(Message("known", b"x"))
    with pytest.raises(UnknownTopicError) as info:
        store.max_offset("known", 4)
    assert "0 to 3" in str(info.value)
