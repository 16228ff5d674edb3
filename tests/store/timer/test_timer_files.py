"""The timer's on-disk structures: TimerLog units, wheel slots, the timer checkpoint."""

from __future__ import annotations

import os

import numpy as np
import pytest

from store.formats.record_codec import BLANK_MAGIC_CODE
from store.base.errors import CorruptRecordError
from store.timer import timer_checkpoint as ckpt
from store.timer.timer_checkpoint import CHECKPOINT_FILE_SIZE, CHECKPOINT_LAYOUT, TimerCheckpoint
from store.timer.timer_service import round_fire_time
from store.timer.timer_log import (BLANK, BLANK_SIZE, MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL,
                                   UNIT, UNIT_DTYPE, UNIT_SIZE, TimerLog, units_per_file)
from store.timer.wheel import SLOT, SLOT_DTYPE, SLOT_SIZE, TimerWheel


def test_layout_sizes_match_the_reference():
    assert UNIT.size == UNIT_DTYPE.itemsize == UNIT_SIZE == 52
    assert SLOT.size == SLOT_DTYPE.itemsize == SLOT_SIZE == 32
    assert BLANK.size == BLANK_SIZE == 16
    assert CHECKPOINT_LAYOUT.size == 136 and CHECKPOINT_FILE_SIZE == 4096
    # RocketMQ: last unit of a 100 MiB file at 104857532
    per = units_per_file(100 * 1024 * 1024)
    assert (per - 1) * UNIT_SIZE == 104857532
    assert (MAGIC_DEFAULT, MAGIC_ROLL, MAGIC_DELETE) == (1, 2, 4)


@pytest.mark.parametrize("deliver, out", [(10_000, 9_900), (10_001, 10_000), (10_099, 10_000),
                                          (10_100, 10_000), (10_150, 10_100)])
def test_fire_time_rounding(deliver, out):
    assert round_fire_time(deliver, 100) == out
    # the slot fires once now >= out + P, never before the time asked for
    assert out + 100 >= deliver > out


def _units(n, slot_time=1000, offset0=0):
    u = np.zeros(n, dtype=UNIT_DTYPE)
    u["size"] = UNIT_SIZE
    u["magic"] = MAGIC_DEFAULT
    u["enqueue_time"] = 0
    u["delay"] = slot_time
    u["offset_py"] = offset0 + np.arange(n)
    u["size_py"] = 100
    return u


def test_timer_log_places_units_and_blanks(tmp_path):
    log = TimerLog(str(tmp_path / "timerlog"), 1024)
    per = units_per_file(1024)
    assert per == 19
    positions, blanks, end = log.place(0, 110)
    assert ((positions % 1024) % UNIT_SIZE == 0).all()  # units sit at file start + 52k
    assert ((positions % 1024) + UNIT_SIZE + BLANK_SIZE <= 1024).all()
    assert end == 5 * 1024 + (110 - 5 * per) * UNIT_SIZE
    units = _units(110)
    units["prev_pos"] = np.concatenate(([-1], positions[:-1]))
    log.write(positions, units, blanks)
    assert len(log.files.refresh()) == 6  # RocketMQ: 110 units in 1024-byte files, 6 files
    raw = open(log.files.files[0].path, "rb").read()
    left, zero, magic = BLANK.unpack_from(raw, per * UNIT_SIZE)
    assert (left, zero, magic) == (1024 - per * UNIT_SIZE, 0, BLANK_MAGIC_CODE)
    # the chain walks back through every file, newest first
    pos, walked = log.walk_chain(int(positions[-1]), end)
    assert pos.tolist() == positions[::-1].tolist()
    assert walked["offset_py"].tolist() == list(range(109, -1, -1))
    # a pointer at or past the end is not followed
    assert len(log.walk_chain(int(positions[-1]), int(positions[-1]))[0]) == 0
    seen = np.concatenate([p for p, _ in log.valid_units(0, end)])
    assert seen.tolist() == positions.tolist()
    # cleanup keeps the last file; truncate zeroes the tail
    assert log.delete_expired(commitlog_min=10**9) == 5
    assert len(log.files.refresh()) == 1
    log.truncate(int(positions[-3]))
    assert len(list(log.valid_units(int(positions[-3]), end))) == 0
    log.close()


def test_chain_with_gaps_and_runs(tmp_path):
    log = TimerLog(str(tmp_path / "timerlog"), 64 * 1024)
    # two slots interleaved: A gets units 0-2, B 3, A 4-5, B 6
    positions, blanks, end = log.place(0, 7)
    owner = ["A", "A", "A", "B", "A", "A", "B"]
    units = _units(7)
    last = {}
    for i, o in enumerate(owner):
        units["prev_pos"][i] = last.get(o, -1)
        last[o] = int(positions[i])
    log.write(positions, units, blanks)
    pos_a, _ = log.walk_chain(last["A"], end)
    pos_b, _ = log.walk_chain(last["B"], end)
    assert pos_a.tolist() == [int(positions[i]) for i in (5, 4, 2, 1, 0)]
    assert pos_b.tolist() == [int(positions[i]) for i in (6, 3)]
    # a corrupt unit stops the walk
    bad = _units(1)
    bad["magic"] = 0x100
    log.write(positions[4:5], bad, [])
    assert log.walk_chain(last["A"], end)[0].tolist() == [int(positions[5])]
    log.close()


def test_wheel_slots(tmp_path):
    path = str(tmp_path / "timerwheel")
    wheel = TimerWheel(path, 64, 100)
    assert os.path.getsize(path) == 64 * 32
    assert wheel.get(5_000) == (-1, -1, 0)
    wheel.put(np.array([5_000, 5_100]), np.array([0, 52]), np.array([104, 52]), np.array([3, 1]))
    assert wheel.get(5_000) == (0, 104, 3)
    assert wheel.get(5_000 + 64 * 100) == (-1, -1, 0)  # same index, another turn: empty
    valid, first, last, num = wheel.lookup(np.array([5_000, 5_200]))
    assert valid.tolist() == [True, False] and last.tolist() == [104, -1]
    assert wheel.due_slots(4_000, 5_200).tolist() == [5_000, 5_100]
    assert wheel.due_slots(5_050, 5_200).tolist() == [5_100]
    assert wheel.due_slots(0, 10**9).tolist() == [5_000, 5_100]  # the full-scan path
    assert wheel.slots_pointing_past(100).tolist() == [(5_000 // 100) % 64]
    assert wheel.pending_count(0) == 4
    wheel.close()
    reopened = TimerWheel(path, 64, 100)
    assert reopened.get(5_100) == (52, 52, 1) and not reopened.created
    reopened.close()
    with pytest.raises(CorruptRecordError, match="timerwheel is 2048 bytes; expected 4096"):
        TimerWheel(path, 128, 100)


def test_timer_checkpoint_round_trip(tmp_path):
    path = str(tmp_path / "timercheck")
    assert ckpt.load(path) is None
    state = TimerCheckpoint(last_read_time_ms=123, last_timer_log_flush_pos=520,
                            last_timer_queue_offset=7, master_timer_queue_offset=7, counter=3,
                            deliver_mark=-1, precision_ms=100, wheel_slots=4096)
    ckpt.save(path, state)
    assert os.path.getsize(path) == 4096
    assert ckpt.load(path) == state
    stamp = ckpt.file_stamp(path)
    state.counter += 1
    ckpt.save(path, state)
    assert ckpt.file_stamp(path) != stamp and ckpt.load(path).counter == 4
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]
