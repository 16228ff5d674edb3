"""Recovery: torn and damaged tails, clean and crash reopen."""

from __future__ import annotations

import os
import shutil

import pytest

from store import Message, MessageStore
from store.formats.record_codec import HEADER_SIZE

N = 12


def zero(path, offset, length, seg=64 * 1024):
    """Zero ``length`` CommitLog bytes at ``offset`` in the store at ``path``."""
    name = os.path.join(path, "commitlog", f"{offset - offset % seg:020d}")
    with open(name, "r+b") as fh:
        fh.seek(offset % seg)
        fh.write(bytes(length))


def patch(path, offset, data, seg=64 * 1024):
    name = os.path.join(path, "commitlog", f"{offset - offset % seg:020d}")
    with open(name, "r+b") as fh:
        fh.seek(offset % seg)
        fh.write(data)


@pytest.fixture
def crashed_copy(store_path, small_config, clock, tmp_path):
    """A store as a crash leaves it: N messages sent, the first N - 1 flushed, the last not.

    The copy is taken while the store is open (its ``abort`` marker present, its checkpoint
    saying the last record is confirmed but not flushed).  Returns (path, results).
    """
    s = MessageStore.open(store_path, small_config, clock=clock, flush_service=False)
    p = s.producer("g")
    results = [p.send(Message("t", f"m{i}".encode() * 30, tags="a", keys=f"k{i}",
                              properties={"i": str(i)}))
               for i in range(N - 1)]
    s.flush()
    results.append(p.send(Message("t", b"L")))  # small: the torn test cuts at every byte
    copy = str(tmp_path / "pristine")
    shutil.copytree(store_path, copy)
    s.close()
    assert os.path.exists(os.path.join(copy, "abort"))
    return copy, results


def maxes(store):
    return {q: store.max_offset("t", q) for q in store.queue_ids("t")}


def check_prefix(store, results, n_alive):
    """The first ``n_alive`` results are readable with their bodies; nothing after them."""
    for i, r in enumerate(results[:n_alive]):
        v = store.pull("t", r.queue_id, r.queue_offset)[0]
        assert v.msg_id == r.msg_id and v.commitlog_offset == r.commitlog_offset
    expected = {}
    for r in results[:n_alive]:
        expected[r.queue_id] = max(expected.get(r.queue_id, 0), r.queue_offset + 1)
    assert {q: m for q, m in maxes(store).items() if m} == expected


def test_clean_reopen_keeps_max_offsets_without_rescanning(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        p = s.producer("g")
        for i in range(500):
            p.send(Message("t", b"x" * 150))
        before, end = maxes(s), s.confirmed_offset()
    assert not os.path.exists(os.path.join(store_path, "abort"))
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        assert not s.recovered
        assert maxes(s) == before and s.confirmed_offset() == end


def test_crash_reopen_keeps_max_offsets(crashed_copy, small_config, clock):
    path, results = crashed_copy
    with MessageStore.open(path, small_config, clock=clock) as s:
        assert s.recovered
        check_prefix(s, results, N)
        assert s.confirmed_offset() == results[-1].commitlog_offset + s.read_record(
            results[-1].commitlog_offset).total_size


def test_torn_last_record_at_every_byte(crashed_copy, small_config, clock, tmp_path):
    """Cut the last record at every byte (zeros from there, as an interrupted write leaves
    it) and reopen after the crash: it is gone, everything before it stays, appends go on."""
    path, results = crashed_copy
    last = results[-1]
    with MessageStore.open(path, small_config, clock=clock, read_only=True) as ro:
        size = ro.read_record(last.commitlog_offset).total_size
    for cut in range(last.commitlog_offset, last.commitlog_offset + size + 1):
        work = str(tmp_path / f"cut{cut}")
        shutil.copytree(path, work)
        zero(work, cut, last.commitlog_offset + size - cut)
        with MessageStore.open(work, small_config, clock=clock, flush_service=False) as s:
            whole = cut == last.commitlog_offset + size
            check_prefix(s, results, N if whole else N - 1)
            if not whole:
                assert s.confirmed_offset() == last.commitlog_offset
                again = s.producer("g").send(Message("t", b"again"))
                assert again.commitlog_offset == last.commitlog_offset
                assert s.pull("t", again.queue_id, again.queue_offset)[0].body == b"again"
        shutil.rmtree(work)


def damage_topic_length(path, offset, body_len):
    patch(path, offset + HEADER_SIZE + body_len, bytes([99]))


@pytest.mark.parametrize("mode", ["clean", "crash"])
def test_damaged_topic_length_stops_at_the_previous_record(crashed_copy, small_config, clock,
                                                           tmp_path, mode):
    path, results = crashed_copy
    if mode == "clean":  # close cleanly first: normal recovery must still catch it
        with MessageStore.open(path, small_config, clock=clock) as s:
            pass
        assert not os.path.exists(os.path.join(path, "abort"))
    last = results[-1]
    damage_topic_length(path, last.commitlog_offset, len(b"L"))
    with MessageStore.open(path, small_config, clock=clock) as s:
        assert s.recovered
        check_prefix(s, results, N - 1)
        assert s.confirmed_offset() == last.commitlog_offset
        assert s.max_offset("t", last.queue_id) == last.queue_offset  # the CQ max matches
        r = s.producer("g").send(Message("t", b"next"))
        assert r.commitlog_offset == last.commitlog_offset
    with MessageStore.open(path, small_config, clock=clock) as s:
        assert not s.recovered
        assert s.pull("t", r.queue_id, r.queue_offset)[0].body == b"next"


@pytest.mark.parametrize("mode", ["clean", "crash"])
def test_crc_damage_in_the_last_record(crashed_copy, small_config, clock, mode):
    path, results = crashed_copy
    if mode == "clean":
        with MessageStore.open(path, small_config, clock=clock):
            pass
    last = results[-1]
    patch(path, last.commitlog_offset + HEADER_SIZE, b"X")  # first body byte: CRC mismatch
    with MessageStore.open(path, small_config, clock=clock) as s:
        check_prefix(s, results, N - 1)


def test_crc_damage_before_the_confirmed_end_keeps_the_rest(store_path, small_config, clock,
                                                            tmp_path):
    """A damaged record before the confirmed end is skipped, not cut: the acknowledged records
    after it pass every check and stay (RocketMQ would cut them); the damaged one is a typed
    error when read."""
    from store import CorruptRecordError

    s = MessageStore.open(store_path, small_config, clock=clock, flush_service=False)
    p = s.producer("g")
    results = [p.send(Message("t", f"a{i}".encode() * 20)) for i in range(5)]
    s.flush()
    results += [p.send(Message("t", f"b{i}".encode() * 20)) for i in range(5)]
    copy = str(tmp_path / "copy")
    shutil.copytree(store_path, copy)
    s.close()
    patch(copy, results[7].commitlog_offset + HEADER_SIZE + 3, b"!")
    with MessageStore.open(copy, small_config, clock=clock) as s2:
        assert s2.recovered
        for i, r in enumerate(results):
            if i == 7:
                with pytest.raises(CorruptRecordError):
                    s2.pull("t", r.queue_id, r.queue_offset, 1, verify_crc=True)
            else:
                (v,) = s2.pull("t", r.queue_id, r.queue_offset, 1, verify_crc=True)
                assert v.msg_id == r.msg_id
        assert sum(maxes(s2).values()) == 10


def test_unflushed_tail_is_rescanned_and_queues_rebuilt(crashed_copy, small_config, clock):
    """Crash recovery rebuilds queue entries that were never written (the CommitLog is the
    truth): remove the queue files and reopen."""
    path, results = crashed_copy
    shutil.rmtree(os.path.join(path, "consumequeue", "t"))
    # rescan everything: the checkpoint's flushed offset back to the start
    from store.files.checkpoint import StoreCheckpoint

    cp = StoreCheckpoint(os.path.join(path, "checkpoint"))
    cp.set("flushed_phy_offset", 0)
    cp.flush()
    cp.close()
    with MessageStore.open(path, small_config, clock=clock) as s:
        check_prefix(s, results, N)
        assert [v.tags for v in s.pull("t", results[0].queue_id, 0, 100)][:1] == ["a"]


def test_writer_died_mid_append_is_repaired_by_the_next_writer(store_path, small_config,
                                                              clock):
    """write_in_progress left behind (a writer killed inside an append while another process
    keeps the store open): the next append repairs the tail first."""
    keeper = MessageStore.open(store_path, small_config, clock=clock)  # another "process"
    dead = MessageStore.open(store_path, small_config, clock=clock, flush_service=False)
    p = dead.producer("g")
    ok = [p.send(Message("t", b"ok" * 40)) for _ in range(5)]
    end = dead.confirmed_offset()
    # the dead writer's half-written record: marked in progress, partly on disk, unconfirmed
    dead.checkpoint.set("write_in_progress", end)
    patch(store_path, end, b"\x00\x00\x01\x00\xda\xa3\x20\xa7" + b"\x07" * 40)
    keeper_view = keeper.max_offset("t", ok[-1].queue_id)
    assert keeper_view == ok[-1].queue_offset + 1  # readers never see past the confirmed end
    r = keeper.producer("g").send(Message("t", b"after"))
    assert r.commitlog_offset == end
    assert keeper.checkpoint.get("write_in_progress") == -1
    assert keeper.pull("t", r.queue_id, r.queue_offset)[0].body == b"after"
    for x in ok:
        assert keeper.pull("t", x.queue_id, x.queue_offset)[0].body == b"ok" * 40
    dead.close()
    keeper.close()
    assert not os.path.exists(os.path.join(store_path, "abort"))


def test_a_failed_open_releases_the_store(crashed_copy, small_config, clock):
    """Recovery that fails (a queue file whose name is no file boundary) raises a typed error
    and leaves no lock behind: other opens must not wait forever."""
    import fcntl

    from store import CorruptRecordError

    path, results = crashed_copy
    bad = os.path.join(path, "consumequeue", "t", "0", f"{20001:020d}")
    with open(bad, "wb") as fh:
        fh.write(b"short")
    with pytest.raises(CorruptRecordError) as info:
        MessageStore.open(path, small_config, clock=clock)
    assert bad in str(info.value) and "expected 20000" in str(info.value)
    fd = os.open(os.path.join(path, "open.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a lock was left held
    finally:
        os.close(fd)
    os.unlink(bad)
    with MessageStore.open(path, small_config, clock=clock) as s:
        check_prefix(s, results, N)
