"""Placing timer records on the wheel: enqueue, TimerLog units chained per slot, rolling, repair.

:func:`enqueue` reads new timer-queue entries (delivering those already due at once).  A
ConsumeQueue entry of the timer topic becomes a 52-byte TimerLog unit linked into the chain
of its wheel slot (:func:`place_units`).  A fire time at least ``timer_roll_window_slots``
slots ahead is rolled: the unit goes to a slot half or a whole window ahead and is re-put to the
timer topic when that slot fires.  :func:`repair_wheel` rebuilds slots a dead run left pointing
past the checkpointed TimerLog end.  All of it is NumPy over whole batches of units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..files.crash_points import crash_point
from ..core.ports import StorePort
from ..formats.message import TIMER_TOPIC
from .timer_checkpoint import TimerCheckpoint
from .slot_firing import SlotFiring
from .timer_log import MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL, UNIT_DTYPE, UNIT_SIZE, TimerLog
from .timer_queue import marker_keys, read_timer_entries
from .wheel import TimerWheel

#: ConsumeQueue entries enqueued per step.
ENQUEUE_CHUNK = 1 << 15


@dataclass(frozen=True, slots=True)
class WheelShape:
    """The settings that shape a wheel: precision P, roll window W and slot count S."""

    precision_ms: int
    window_slots: int
    slots: int


def place_units(wheel: TimerWheel, log: TimerLog, work: TimerCheckpoint, offs: np.ndarray,
                sizes: np.ndarray, fire: np.ndarray, marker: np.ndarray, now: int,
                shape: WheelShape) -> None:
    """Append TimerLog units for ``fire`` times and link them into their slots."""
    P, W, S = shape.precision_ms, shape.window_slots, shape.slots
    read_time = work.last_read_time_ms
    floor_now = now - now % P
    # RocketMQ places relative to now; after a long outage that could reach slots still
    # waiting to fire, so then place relative to the read time (and roll once more)
    base = floor_now if floor_now - read_time < (S - W) * P else read_time
    roll = (fire - base) >= W * P
    over = fire - base - W * P
    roll_slot = np.where(over < (W // 3) * P, base + (W // 2) * P, base + W * P)
    slot = np.maximum(np.where(roll, roll_slot, fire), read_time)
    magic = (MAGIC_DEFAULT | np.where(roll, MAGIC_ROLL, 0)
             | np.where(marker, MAGIC_DELETE, 0)).astype(np.int32)

    order = np.argsort(slot, kind="stable")
    slot, magic = slot[order], magic[order]
    n = len(slot)
    positions, blanks, new_end = log.place(work.last_timer_log_flush_pos, n)
    uniq, starts, counts = np.unique(slot, return_index=True, return_counts=True)
    valid, first, last, num = wheel.lookup(uniq)
    prev = np.empty(n, dtype=np.int64)
    prev[1:] = positions[:-1]
    prev[starts] = last  # -1 for an empty slot
    delta = np.where((magic & MAGIC_DELETE) != 0, -1, 1)
    units = np.zeros(n, dtype=UNIT_DTYPE)
    units["size"] = UNIT_SIZE
    units["prev_pos"] = prev
    units["magic"] = magic
    units["enqueue_time"] = base
    units["delay"] = slot - base
    units["offset_py"] = offs[order]
    units["size_py"] = sizes[order]
    crash_point("timer.log_append", "before")
    log.write(positions, units, blanks)
    crash_point("timer.log_append", "after")
    if work.log_crc_from:  # the checkpoint's CRC of the log goes on over what was appended
        crc = log.crc(work.last_timer_log_flush_pos, new_end, work.log_crc)
        work.log_crc_from, work.log_crc = (work.log_crc_from, crc) if crc is not None else (0, 0)
    # the slots only after the units they point at are written
    crash_point("timer.wheel_update", "before")
    wheel.put(uniq, np.where(valid, first, positions[starts]),
                   positions[starts + counts - 1], num + np.add.reduceat(delta, starts))
    crash_point("timer.wheel_update", "after")
    work.last_timer_log_flush_pos = new_end


def repair_wheel(wheel: TimerWheel, log: TimerLog, state: TimerCheckpoint,
                 shape: WheelShape) -> int:
    """Rebuild every slot that points at or past the checkpointed TimerLog end.

    Such a slot was being updated by a run that died, or is corrupt.  It is rebuilt from the
    units below the end (RocketMQ's checkPhyPos): the units whose slot time maps to it give
    its first and last position and its count; a slot with none (or only stale ones) is
    emptied.  Returns how many slots were repaired.
    """
    end = state.last_timer_log_flush_pos
    suspects = wheel.slots_pointing_past(end)
    if not len(suspects):
        return 0
    P, S = shape.precision_ms, shape.slots
    wanted = np.zeros(S, dtype=bool)
    wanted[suspects] = True
    found_pos, found_time, found_magic = [], [], []
    start = log.files.min_offset() if log.files.refresh() else end
    for positions, units in log.valid_units(start, end):
        slot_time = units["enqueue_time"] + units["delay"]
        hit = (slot_time >= state.last_read_time_ms) & wanted[(slot_time // P) % S]
        found_pos.append(positions[hit])
        found_time.append(slot_time[hit])
        found_magic.append(units["magic"][hit])
    wheel.clear(suspects)
    if found_pos:
        pos = np.concatenate(found_pos)
        times = np.concatenate(found_time)
        magic = np.concatenate(found_magic)
        if len(pos):
            # per slot time: first and last position and the count (markers subtract)
            order = np.lexsort((pos, times))
            pos, times, magic = pos[order], times[order], magic[order]
            uniq, first_idx, counts = np.unique(times, return_index=True, return_counts=True)
            delta = np.where((magic & MAGIC_DELETE) != 0, -1, 1)
            # one live time per slot: placements stay within a wheel turn of the read time
            wheel.put(uniq, pos[first_idx], pos[first_idx + counts - 1],
                           np.add.reduceat(delta, first_idx))
    wheel.flush()
    return len(suspects)


def enqueue(store: StorePort, wheel: TimerWheel, log: TimerLog, firing: SlotFiring,
            shape: WheelShape, work: TimerCheckpoint, done: np.ndarray, now: int,
            budget: int | None = None) -> tuple[int, int]:
    """Move new timer-queue entries into the wheel (or deliver them when already due).

    Returns ``(delivered, handled)``: handled counts the entries delivered at once (or
    skipped) against ``budget``; with a budget, steps are at most the budget left, and
    the run stops when it is spent.
    """
    queue = store.consume_queue(TIMER_TOPIC, 0)
    qmax = queue.max_offset(store.confirmed_offset())
    q = max(work.last_timer_queue_offset, queue.first_index())
    if work.last_timer_queue_offset >= qmax:
        return 0, 0
    P = shape.precision_ms
    # the markers first (a marker anywhere in the range cancels), found by their tag; a
    # marker without it still takes effect from its own chunk on
    delete_keys = marker_keys(store, q, qmax)
    chunks = (read_timer_entries(store, s, min(qmax, s + ENQUEUE_CHUNK))
              for s in range(q, qmax, ENQUEUE_CHUNK))
    delivered = handled = 0
    for chunk in chunks:
        if budget is not None and handled >= budget:
            break
        e, fire, marker, live = chunk.entries, chunk.fire, chunk.marker, chunk.ok
        delete_keys |= chunk.marker_keys
        if not len(e):
            break
        offs, sizes = e["offset"], e["size"]
        if len(done):
            live = live & ~np.isin(offs, done)
        due = live & ~marker & (fire + P <= now)
        if budget is not None:
            due_at = np.flatnonzero(due)
            if len(due_at) > budget - handled:  # the step ends before the first one over
                cut = int(due_at[budget - handled])
                e, offs, sizes, live = e[:cut], offs[:cut], sizes[:cut], live[:cut]
                marker, fire, due = marker[:cut], fire[:cut], due[:cut]
        if due.any():
            units = np.zeros(int(due.sum()), dtype=UNIT_DTYPE.newbyteorder("="))
            units["offset_py"] = offs[due]
            units["size_py"] = sizes[due]
            units["magic"] = MAGIC_DEFAULT
            units["enqueue_time"] = -1
            d, _ = firing.deliver_units(units, delete_keys, now, direct=True)
            delivered += d
            handled += len(units)
        place = live & ~due
        if place.any():
            place_units(wheel, log, work, offs[place], sizes[place], fire[place], marker[place],
                        now, shape)
        q = q + len(e)
        work.last_timer_queue_offset = q
    work.last_timer_queue_offset = max(work.last_timer_queue_offset, q)
    return delivered, handled
