"""The checkpoint's layout version: a checkpoint rmq did not write never limits recovery.

Before the layout version, a checkpoint shorter than 48 bytes (or Apache RocketMQ's, which sets
only its first 24 bytes) read as "an append in progress at offset 0", and the next open zeroed
the whole CommitLog.  Each test damages or replaces the checkpoint of a store holding messages
and checks that every message is still there after a writable open, and that the checkpoint is
trusted again afterwards.
"""

from __future__ import annotations

import os
import struct

import pytest

from store import Message, MessageStore
from store.files.checkpoint import CHECKPOINT_FIELD, CHECKPOINT_FILE_SIZE, LAYOUT_MAGIC, StoreCheckpoint

N = 60


def _fill(path, config, clock) -> list[bytes]:
    with MessageStore.open(path, config, clock=clock) as s:
        p = s.producer("g")
        for i in range(N):
            p.send(Message("orders", b"m%03d" % i, tags="t"))
    return [b"m%03d" % i for i in range(N)]


def _bodies(path, config, clock, *, crashed: bool = False) -> list[bytes]:
    if crashed:  # the marker a killed process leaves
        with open(os.path.join(path, "abort"), "w") as fh:
            fh.write("1 " + open("/proc/sys/kernel/random/boot_id").read().strip())
    with MessageStore.open(path, config, clock=clock) as s:
        assert s.checkpoint.trusted
        out = []
        for q in s.queue_ids("orders"):
            out += [v.body for v in s.pull("orders", q, s.min_offset("orders", q), 1000)]
    return sorted(out)


def _rocketmq_checkpoint(path: str, *, five: bool) -> None:
    """What RocketMQ writes: three timestamps (4.x), plus two offsets (5.x), zeros after."""
    fields = [1_700_000_000_000, 1_700_000_000_000, 0] + ([4096, 4096] if five else [])
    data = b"".join(CHECKPOINT_FIELD.pack(v) for v in fields)
    with open(path, "wb") as fh:
        fh.write(data.ljust(CHECKPOINT_FILE_SIZE, b"\0"))


@pytest.mark.parametrize("crashed", [False, True], ids=["clean", "crashed"])
@pytest.mark.parametrize("damage", ["short-24", "short-47", "empty", "missing", "zeroed",
                                    "rocketmq-4", "rocketmq-5"])
def test_a_checkpoint_rmq_did_not_write_never_cuts_valid_records(store_path, small_config,
                                                                  clock, damage, crashed):
    expected = _fill(store_path, small_config, clock)
    cp_path = os.path.join(store_path, "checkpoint")
    with open(cp_path, "rb") as fh:
        original = fh.read()
    if damage.startswith("short"):
        with open(cp_path, "wb") as fh:
            fh.write(original[:int(damage.split("-")[1])])
    elif damage == "empty":
        open(cp_path, "wb").close()
    elif damage == "missing":
        os.unlink(cp_path)
    elif damage == "zeroed":
        with open(cp_path, "wb") as fh:
            fh.write(bytes(CHECKPOINT_FILE_SIZE))
    else:
        _rocketmq_checkpoint(cp_path, five=damage == "rocketmq-5")
    assert _bodies(store_path, small_config, clock, crashed=crashed) == expected
    # and the checkpoint is rmq's again: a second open trusts it and changes nothing
    assert _bodies(store_path, small_config, clock) == expected


def test_a_torn_tail_is_still_cut_without_a_trusted_checkpoint(store_path, small_config, clock):
    expected = _fill(store_path, small_config, clock)
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        end = s.confirmed_offset()
        seg = s.commit_log.files.find(end - 1)
    with open(seg.path, "r+b") as fh:  # half a record after the last one
        fh.seek(end - seg.start)
        fh.write(struct.pack(">ii", 500, -626843481) + b"\x01" * 40)
    _rocketmq_checkpoint(os.path.join(store_path, "checkpoint"), five=False)
    assert _bodies(store_path, small_config, clock) == expected
    with open(seg.path, "rb") as fh:
        fh.seek(end - seg.start)
        assert fh.read(48) == bytes(48)  # the torn bytes are zeroed, nothing before them


def test_an_earlier_rmq_checkpoint_is_trusted_and_upgraded_in_place(store_path, small_config,
                                                                     clock):
    expected = _fill(store_path, small_config, clock)
    cp_path = os.path.join(store_path, "checkpoint")
    with open(cp_path, "r+b") as fh:  # today's file minus the layout version: rmq before it
        fh.seek(64)
        fh.write(bytes(8))
    legacy = StoreCheckpoint(cp_path, writable=False, legacy_layout=True)
    assert legacy.trusted and legacy.get("layout_version") == 0
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        assert not s.recovered  # trusted: no rescan
        assert s.checkpoint.get("layout_version") == LAYOUT_MAGIC
    assert _bodies(store_path, small_config, clock) == expected


def test_a_read_only_checkpoint_never_touches_the_file(store_path, small_config, clock):
    _fill(store_path, small_config, clock)
    cp_path = os.path.join(store_path, "checkpoint")
    with open(cp_path, "wb") as fh:
        fh.write(b"\x01" * 20)
    cp = StoreCheckpoint(cp_path, writable=False, legacy_layout=True)
    assert not cp.trusted and cp.get("write_in_progress") == -1
    with pytest.raises(PermissionError):
        cp.set("confirm_phy_offset", 1)
    cp.close()
    with open(cp_path, "rb") as fh:
        assert fh.read() == b"\x01" * 20
    os.unlink(cp_path)
    StoreCheckpoint(cp_path, writable=False).close()
    assert not os.path.exists(cp_path)


@pytest.mark.parametrize("back", [1, 37, 150, 4000])
def test_a_confirmed_end_damaged_below_the_last_append_hides_nothing(store_path, small_config,
                                                                     clock, back):
    """Bits flipped in ``confirm_phy_offset`` of a trusted checkpoint (the file fuzzer's
    case) can move it below ``last_append_offset``, and off any record boundary.  A clean
    open must not take that for a verified tail (readers never look past the confirmed
    end): it rescans and every message stays readable, nothing is cut."""
    expected = _fill(store_path, small_config, clock)
    cp_path = os.path.join(store_path, "checkpoint")
    cp = StoreCheckpoint(cp_path, writable=True)
    assert cp.trusted
    confirm, last = cp.get("confirm_phy_offset"), cp.get("last_append_offset")
    assert 0 <= last < confirm
    cp.set("confirm_phy_offset", last - back)
    cp.flush()
    cp.close()
    segment = os.path.join(store_path, "commitlog", "0" * 20)
    with open(segment, "rb") as fh:
        log = fh.read(confirm)
    assert _bodies(store_path, small_config, clock) == expected
    cp = StoreCheckpoint(cp_path, writable=False)
    assert cp.get("confirm_phy_offset") == confirm  # the real end again
    cp.close()
    with open(segment, "rb") as fh:
        assert fh.read(confirm) == log  # nothing cut or rewritten


@pytest.mark.parametrize("fault", ["marker-damaged", "crashed-flush-behind"])
def test_a_confirmed_end_moved_back_cuts_nothing_with_a_second_fault(store_path, small_config,
                                                                      clock, fault):
    """The confirmed end moved back (as above) together with a second fault: a damaged
    ``write_in_progress`` (read as a writer that died mid-append), or a crash on this boot
    with the flushed offset behind.  A genuine in-progress marker equals the confirmed end,
    so neither is taken for an unconfirmed append to cut: every message stays readable."""
    expected = _fill(store_path, small_config, clock)
    cp_path = os.path.join(store_path, "checkpoint")
    cp = StoreCheckpoint(cp_path, writable=True)
    confirm, last = cp.get("confirm_phy_offset"), cp.get("last_append_offset")
    assert cp.get("write_in_progress") == -1
    cp.set("confirm_phy_offset", last - 37)
    if fault == "marker-damaged":
        cp.set("write_in_progress", 12345)
    else:
        cp.set("flushed_phy_offset", 0)
    cp.flush()
    cp.close()
    segment = os.path.join(store_path, "commitlog", "0" * 20)
    with open(segment, "rb") as fh:
        log = fh.read(confirm)
    assert _bodies(store_path, small_config, clock,
                   crashed=fault == "crashed-flush-behind") == expected
    with open(segment, "rb") as fh:
        assert fh.read(confirm) == log


@pytest.mark.parametrize("state", ["no magic", "short"])
def test_a_reader_opened_before_the_checkpoint_was_rmqs_follows_it_once_it_is(tmp_path, state):
    """A reader that opened a store while its checkpoint was not rmq's yet (a new store
    being created, a writer recovering) kept validating the records itself for as long as
    it stayed open, a walk racing the writers' appends; it follows the checkpoint once a
    writer has made it rmq's."""
    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        store.producer("g").send(Message("t", b"first"))
    name = os.path.join(path, "checkpoint")
    if state == "short":
        os.truncate(name, 0)
    else:
        with open(name, "r+b") as fh:
            fh.seek(40)
            fh.write(bytes(32))  # rmq's fields and layout_version: not rmq's (yet)
    reader = MessageStore.open(path, read_only=True)
    try:
        assert not reader.checkpoint.trusted
        with MessageStore.open(path) as writer:  # recovers from the records, marks it rmq's
            writer.producer("g").send(Message("t", b"second"))
            assert reader.confirmed_offset() == writer.confirmed_offset()
            assert reader.checkpoint.trusted
            assert [v.body for v in reader.pull("t", 0, 0, 10)] == [b"first", b"second"]
    finally:
        reader.close()
