"""Checking the timer's own files (``timerwheel``, ``timerlog``) against each other and the
CommitLog, once per process before they are used.

The wheel and the TimerLog are derived from the timer topic's records; damage inside them
(bits flipped, a range zeroed) would otherwise lose or hurry the timer messages they name,
since a slot is only ever read through its pointers.  :func:`timer_files_problem` checks,
with NumPy over the mapped files (no Python step per unit or slot):

* the TimerLog from its first file to the checkpointed end holds only valid units (size 52,
  magic bits within DEFAULT | ROLL | DELETE, DEFAULT set), with no file missing between;
* the units not fired yet (slot time at or after the read time) and the live slots (time at
  or after the read time, lastPos set) describe the same slots: each such slot is found at
  its index, its lastPos is its newest unit and its firstPos its oldest, its ``num`` is the
  units minus the cancel markers, and every unit's ``prevPos`` is the slot's previous unit
  (-1 for the first: the chain links point backwards);
* each such unit names a real timer record: ``offsetPy`` and ``sizePy`` point at a record of
  that size in the CommitLog holding ``TIMER_OUT_MS``, a cancel marker exactly when the unit
  is one, and a fire time that matches its slot (the slot itself for a unit placed at its
  time, a later one for a rolled unit).

A unit whose record is gone to retention is not checked against it.  Any failure names the
first thing found; the timer service then sets both files aside (copies, never deleted) and
rebuilds the timer from the timer topic's queue (see :mod:`store.timer.service`).
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from ..core.ports import StorePort
from ..files.consume_queue import ENTRY_DTYPE
from .checkpoint import TimerCheckpoint
from .timer_log import MAGIC_DELETE, MAGIC_ROLL, UNIT_SIZE, TimerLog
from .timer_queue import record_fields
from .wheel import TimerWheel

_PENDING = [("position", np.int64), ("slot_time", np.int64), ("magic", np.int64),
            ("prev_pos", np.int64), ("offset_py", np.int64), ("size_py", np.int64)]


def _pending_units(log: TimerLog, start: int, end: int, read_time: int
                   ) -> tuple[np.ndarray, str | None]:
    """The units in ``[start, end)`` whose slot time is at or after ``read_time``, and why
    the range is not all valid units (``None`` when it is)."""
    parts = []
    seen = 0
    for positions, units in log.valid_units(start, end):
        seen += len(units)
        slot_time = units["enqueue_time"].astype(np.int64) + units["delay"]
        keep = slot_time >= read_time
        if keep.any():
            part = np.empty(int(keep.sum()), dtype=_PENDING)
            part["position"] = positions[keep]
            part["slot_time"] = slot_time[keep]
            for name in ("magic", "prev_pos", "offset_py", "size_py"):
                part[name] = units[name][keep]
            parts.append(part)
    pending = np.concatenate(parts) if parts else np.empty(0, dtype=_PENDING)
    size = log.file_size
    expected = sum(min(log.per_file, (end - s) // UNIT_SIZE) for s in range(start, end, size))
    if seen < expected:
        return pending, (f"the TimerLog holds no valid unit at or after unit {seen} of the "
                         f"{expected} from {start} to its checkpointed end {end}")
    return pending, None


def _slots_problem(wheel: TimerWheel, units: np.ndarray, read_time: int,
                   log_min: int) -> str | None:
    """Whether the live slots and the pending ``units`` (sorted by slot time, position)
    disagree (see the module docstring)."""
    times = units["slot_time"]
    uniq, first_idx, counts = np.unique(times, return_index=True, return_counts=True)
    last_idx = first_idx + counts - 1
    positions = units["position"]
    # chains: each unit points at the previous unit of its slot, the first at -1 (or into
    # TimerLog files retention removed)
    expected = np.empty(len(units), dtype=np.int64)
    expected[1:] = positions[:-1]
    expected[first_idx] = -1
    head = np.zeros(len(units), dtype=bool)
    head[first_idx] = True
    cut = head & (units["prev_pos"] >= 0) & (units["prev_pos"] < log_min)
    wrong = (units["prev_pos"] != expected) & ~cut
    if wrong.any():
        at = int(positions[np.argmax(wrong)])
        return f"the TimerLog unit at {at} does not point at the previous unit of its slot"
    valid, first, last, num = wheel.lookup(uniq)
    delta = np.where((units["magic"] & MAGIC_DELETE) != 0, -1, 1)
    sums = np.add.reduceat(delta, first_idx) if len(units) else delta
    partial = cut[first_idx]  # slots whose first units retention removed: first/num unknown
    bad = ~valid | (last != positions[last_idx]) | (
        ~partial & ((first != positions[first_idx]) | (num != sums)))
    if bad.any():
        i = int(np.argmax(bad))
        return (f"the wheel slot of {int(uniq[i])} ms does not match the TimerLog (slot "
                f"firstPos {int(first[i])}, lastPos {int(last[i])}, num {int(num[i])}; the "
                f"units say {int(positions[first_idx[i]])}, {int(positions[last_idx[i]])}, "
                f"{int(sums[i])})")
    live = wheel.live_slot_count(read_time)
    if live != len(uniq):
        return (f"the wheel has {live} live slots but the TimerLog's pending units fill "
                f"{len(uniq)}")
    return None


def _records_problem(store: StorePort, units: np.ndarray) -> str | None:
    """Whether a pending unit names no timer record of its size and slot."""
    log = store.commit_log
    offsets = units["offset_py"]
    present = offsets >= log.min_offset()
    past = present & (offsets + units["size_py"] > store.confirmed_offset())
    if past.any():
        return (f"the TimerLog unit at {int(units['position'][np.argmax(past)])} points past "
                "the CommitLog's end")
    if not present.any():
        return None
    e = np.zeros(len(units), dtype=ENTRY_DTYPE.newbyteorder("="))
    e["offset"] = offsets
    e["size"] = units["size_py"]
    fire, marker, ok, _ = record_fields(store, e, present)
    roll = (units["magic"] & MAGIC_ROLL) != 0
    slot = units["slot_time"]
    fits = ok & (marker == ((units["magic"] & MAGIC_DELETE) != 0)) & np.where(
        roll, fire >= slot, fire <= slot)
    bad = present & ~fits
    if bad.any():
        i = int(np.argmax(bad))
        return (f"the TimerLog unit at {int(units['position'][i])} names no timer record of "
                f"its slot (CommitLog offset {int(offsets[i])}, size {int(units['size_py'][i])})")
    return None


def timer_files_problem(store: StorePort, wheel: TimerWheel, log: TimerLog,
                        state: TimerCheckpoint) -> str | None:
    """Why the wheel and the TimerLog cannot be what ``state`` (a checkpoint that passed its
    own checks) says, or ``None`` (see the module docstring)."""
    end = state.last_timer_log_flush_pos
    files = log.files.refresh()
    log_min = files[0].start if files else end
    if (end % log.file_size) % UNIT_SIZE:
        return f"the checkpointed TimerLog end {end} is not on a unit boundary"
    units, problem = _pending_units(log, log_min, end, state.last_read_time_ms)
    if problem is not None:
        return problem
    order = np.lexsort((units["position"], units["slot_time"]))
    units = units[order]
    return (_slots_problem(wheel, units, state.last_read_time_ms, log_min)
            or _records_problem(store, units))


def copy_aside(path: str) -> str:
    """Copy a damaged file or directory to ``<path>.damaged-<n>`` (the first free ``n``) and
    return its name: the original stays where it is, for processes that have it mapped, and
    is rebuilt in place."""
    n = 1
    while os.path.exists(f"{path}.damaged-{n}"):
        n += 1
    target = f"{path}.damaged-{n}"
    if os.path.isdir(path):
        shutil.copytree(path, target)
    elif os.path.exists(path):
        shutil.copyfile(path, target)
    return target
