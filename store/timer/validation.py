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

A unit whose record is gone to retention is not checked against it, nor (but for pointing
past the CommitLog's end) a unit the checkpoint's CRC of the TimerLog certifies
(:func:`certified_from`): the units from ``logCrcFrom`` to the checkpointed end are then
byte for byte those the store appended from its records, so after a crash only the units
below it (an earlier version's, or none) have their records read, which was most of the
check's cost (about 0.7 s of 0.9 s CPU per million pending units).  Any failure names the
first thing found; the timer service then sets both files aside (copies, never deleted) and
rebuilds the timer from the timer topic's queue (see :mod:`store.timer.timer_service`).

:func:`handled_in_slot` checks the checkpoint's ``slotDone`` (how many units, in append
order, of the slot at the read time a bounded run handled already) against the delivered
copies: a handled unit's record was delivered (or re-put, a roll), and that copy carries the
unit's CommitLog offset (``__RMQ_DELAY_ORIGIN``), so the units handled are exactly a prefix of
the slot's units whose last one with a copy ends it.  A count too large would skip units
never delivered, too small deliver some twice.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from ..core.ports import StorePort
from ..delayed.delivery import (origins_since, properties_since, read_queue_entries,
                                release_commitlog_pages)
from ..formats.message import PROPERTY_DELAY_ORIGIN, PROPERTY_TIMER_DEQUEUE_MS, TIMER_TOPIC
from ..kernels.property_scan import parse_int_ranges
from ..files.consume_queue import ENTRY_DTYPE
from .timer_checkpoint import TimerCheckpoint
from .timer_log import MAGIC_DELETE, MAGIC_ROLL, UNIT_SIZE, TimerLog
from .timer_queue import CHUNK, record_fields
from .wheel import TimerWheel

_PENDING = [("position", np.int64), ("slot_time", np.int64), ("magic", np.int64),
            ("prev_pos", np.int64), ("offset_py", np.int64), ("size_py", np.int64)]
#: TimerLog units checked per step (bounds the memory the check takes).
CHECK_CHUNK = 1 << 16


def _pending(positions: np.ndarray, units: np.ndarray, read_time: int) -> np.ndarray:
    """The units whose slot time is at or after ``read_time`` (not fired yet)."""
    slot_time = units["enqueue_time"].astype(np.int64) + units["delay"]
    keep = slot_time >= read_time
    part = np.empty(int(keep.sum()), dtype=_PENDING)
    part["position"] = positions[keep]
    part["slot_time"] = slot_time[keep]
    for name in ("magic", "prev_pos", "offset_py", "size_py"):
        part[name] = units[name][keep]
    return part


class _SlotTally:
    """What the pending units say of each slot they fill, built a chunk at a time in log
    order: slot time, first and last position, units minus markers, and whether the slot's
    first units are in TimerLog files retention removed.  Its size is the live slots'."""

    def __init__(self, log_min: int) -> None:
        self.log_min = log_min
        self.time = np.empty(0, np.int64)
        self.first = np.empty(0, np.int64)
        self.last = np.empty(0, np.int64)
        self.num = np.empty(0, np.int64)
        self.cut = np.empty(0, bool)

    def add(self, units: np.ndarray) -> str | None:
        """Take a chunk of pending units (in position order); why their chains are broken."""
        if not len(units):
            return None
        units = units[np.argsort(units["slot_time"], kind="stable")]
        times, positions, prev = units["slot_time"], units["position"], units["prev_pos"]
        uniq, first_idx, counts = np.unique(times, return_index=True, return_counts=True)
        last_idx = first_idx + counts - 1
        at = np.searchsorted(self.time, uniq)
        known = at < len(self.time)
        known[known] = self.time[at[known]] == uniq[known]
        # each unit points at the previous unit of its slot: within the chunk, the one before
        # it; the first of a slot at the slot's last unit so far (-1 for a new slot, or a
        # unit in files retention removed)
        expected = np.empty(len(units), dtype=np.int64)
        expected[1:] = positions[:-1]
        expected[first_idx] = np.where(known, self.last[np.minimum(at, len(self.last) - 1)]
                                       if len(self.last) else -1, -1)
        cut = np.zeros(len(units), dtype=bool)
        cut[first_idx] = ~known & (prev[first_idx] >= 0) & (prev[first_idx] < self.log_min)
        wrong = (prev != expected) & ~cut
        if wrong.any():
            return (f"the TimerLog unit at {int(positions[np.argmax(wrong)])} does not point "
                    "at the previous unit of its slot")
        delta = np.where((units["magic"] & MAGIC_DELETE) != 0, -1, 1)
        sums = np.add.reduceat(delta, first_idx)
        k = at[known]
        self.last[k] = positions[last_idx[known]]
        self.num[k] += sums[known]
        new = ~known
        if new.any():
            merged = np.concatenate((self.time, uniq[new]))
            order = np.argsort(merged, kind="stable")
            self.time = merged[order]
            self.first = np.concatenate((self.first, positions[first_idx[new]]))[order]
            self.last = np.concatenate((self.last, positions[last_idx[new]]))[order]
            self.num = np.concatenate((self.num, sums[new]))[order]
            self.cut = np.concatenate((self.cut, cut[first_idx[new]]))[order]
        return None

    def against(self, wheel: TimerWheel, read_time: int) -> str | None:
        """Whether the wheel's live slots are not exactly the tallied ones."""
        valid, first, last, num = wheel.lookup(self.time)
        bad = ~valid | (last != self.last) | (~self.cut & ((first != self.first)
                                                           | (num != self.num)))
        if bad.any():
            i = int(np.argmax(bad))
            return (f"the wheel slot of {int(self.time[i])} ms does not match the TimerLog "
                    f"(slot firstPos {int(first[i])}, lastPos {int(last[i])}, num "
                    f"{int(num[i])}; the units say {int(self.first[i])}, {int(self.last[i])}, "
                    f"{int(self.num[i])})")
        live = wheel.live_slot_count(read_time)
        if live != len(self.time):
            return (f"the wheel has {live} live slots but the TimerLog's pending units fill "
                    f"{len(self.time)}")
        return None


def _records_problem(store: StorePort, units: np.ndarray, certified_from: int) -> str | None:
    """Whether a pending unit names no timer record of its size and slot (the records of
    units at or after ``certified_from`` are not read: see :func:`certified_from`)."""
    log = store.commit_log
    offsets = units["offset_py"]
    present = offsets >= log.min_offset()
    past = present & (offsets + units["size_py"] > store.confirmed_offset())
    if past.any():
        return (f"the TimerLog unit at {int(units['position'][np.argmax(past)])} points past "
                "the CommitLog's end")
    present &= units["position"] < certified_from
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


def certified_from(log: TimerLog, state: TimerCheckpoint, log_min: int) -> int:
    """Where the TimerLog units the checkpoint's CRC certifies begin: those from there to
    the checkpointed end are byte for byte what this store appended (the end: none is).

    The units are appended, flushed and only then covered by a saved checkpoint, and never
    rewritten below its end; a crash leaves them as they were.  Only damage changes them,
    and the CRC finds it (a damaged ``logCrcFrom`` or ``logCrc`` only costs the reads)."""
    end = state.last_timer_log_flush_pos
    start = state.log_crc_from - 1
    if state.log_crc_from and log_min <= start <= end and log.crc(start, end) == state.log_crc:
        return start
    return end


def timer_files_problem(store: StorePort, wheel: TimerWheel, log: TimerLog,
                        state: TimerCheckpoint) -> str | None:
    """Why the wheel and the TimerLog cannot be what ``state`` (a checkpoint that passed its
    own checks) says, or ``None`` (see the module docstring).  Reads the TimerLog still on
    disk a chunk at a time; the caller releases the mapped pages."""
    end = state.last_timer_log_flush_pos
    files = log.files.refresh()
    log_min = files[0].start if files else end
    if (end % log.file_size) % UNIT_SIZE:
        return f"the checkpointed TimerLog end {end} is not on a unit boundary"
    read_time = state.last_read_time_ms
    tally = _SlotTally(log_min)
    seen = 0
    certified = certified_from(log, state, log_min)
    for positions, units in log.valid_units(log_min, end, CHECK_CHUNK):
        seen += len(units)
        pending = _pending(positions, units, read_time)
        problem = tally.add(pending) or _records_problem(store, pending, certified)
        if problem is not None:
            return problem
        release_commitlog_pages(store)
    size = log.file_size
    expected = sum(min(log.per_file, (end - s) // UNIT_SIZE) for s in range(log_min, end, size))
    if seen < expected:
        return (f"the TimerLog holds no valid unit at or after unit {seen} of the "
                f"{expected} from {log_min} to its checkpointed end {end}")
    return tally.against(wheel, read_time)


def handled_in_slot(store: StorePort, wheel: TimerWheel, log: TimerLog,
                    state: TimerCheckpoint) -> int | None:
    """The units of the slot at ``state``'s read time that were really handled, when
    ``state.slot_done`` says otherwise (``None``: it is right, or nothing can tell).

    Only the units whose handling leaves a copy count (a cancel marker leaves none, nor a
    unit whose record retention removed): the last of those below ``slot_done`` must have a
    copy and none from ``slot_done`` on may.  The copies are looked for from
    ``slotDoneFrom`` (where the run that last moved the count began appending: a short scan)
    and, when that contradicts the count (or there is no hint: a checkpoint of an earlier
    version, whose count of 0 may be set back too), from the oldest record of the units in
    question on (a scan of the CommitLog since they were enqueued: once per process).  An
    empty slot with a count of 0 (the normal case) costs nothing."""
    _first, last, num = wheel.get(state.last_read_time_ms)
    if last < 0 and state.slot_done == 0:
        return None  # an empty slot, none handled: the normal case
    _positions, units = log.walk_chain(last, state.last_timer_log_flush_pos, num)
    units = units[::-1]  # append order
    k, redo = state.slot_done, state.deliver_mark >= 0
    source = units["offset_py"]
    leaves_copy = (((units["magic"] & (MAGIC_DELETE | MAGIC_ROLL)) != MAGIC_DELETE)
                   & (source >= store.commit_log.min_offset()))
    if not leaves_copy.any():
        # nothing can tell which were handled, and no count loses or repeats a message
        return None if k <= len(units) else len(units)
    hint = state.slot_done_from - 1
    if k <= len(units) and store.commit_log.min_offset() <= hint <= store.confirmed_offset() \
            and _consistent(k, leaves_copy, np.isin(source, origins_since(store, hint)), redo):
        return None
    start = max(int(source[leaves_copy].min()), store.commit_log.min_offset())
    has_copy = np.isin(source, origins_since(store, start)) & leaves_copy
    if k <= len(units) and _consistent(k, leaves_copy, has_copy, redo):
        return None
    done = np.flatnonzero(has_copy)
    return int(done[-1]) + 1 if len(done) else 0


def _consistent(k: int, leaves_copy: np.ndarray, has_copy: np.ndarray, redo: bool) -> bool:
    """Whether the units before ``k`` end in a handled one and none from ``k`` on is (but
    ``redo``: a run that died after the count was saved may have handled more, which its
    redo skips by their copies)."""
    if not redo and (has_copy[k:] & leaves_copy[k:]).any():
        return False
    before = np.flatnonzero(leaves_copy[:k])
    return not len(before) or bool(has_copy[before[-1]])


def timer_origins_since(store: StorePort, start: int, end: int | None = None) -> np.ndarray:
    """Sorted, distinct origins (``__RMQ_DELAY_ORIGIN``) of the timer's own copies (a
    delivery or a roll's re-put: they carry ``TIMER_DEQUEUE_MS``, which no other service
    sets) from CommitLog offset ``start`` to ``end`` (the confirmed end when ``None``).

    One compiled scan of the records' properties, as :func:`origins_since`; a checkpoint
    saved at ``start`` that is the timer's newest knows of none of them (see
    :meth:`store.timer.timer_service.TimerService._stale_from`)."""
    found: list[np.ndarray] = []
    for raw, has, vstart, vend in properties_since(
            store, start, [PROPERTY_DELAY_ORIGIN, PROPERTY_TIMER_DEQUEUE_MS], end):
        timer = has[0] & has[1]
        if timer.any():
            values, ok = parse_int_ranges(raw, vstart[0][timer], vend[0][timer])
            found.append(values[ok])
    return np.unique(np.concatenate(found)) if found else np.empty(0, np.int64)


def delivered_since_mark(store: StorePort, wheel: TimerWheel, log: TimerLog,
                         state: TimerCheckpoint, floor_now: int) -> np.ndarray:
    """The fire times (slot time + precision, one per message) of the messages ``state``
    still counts as pending although a run it does not know of delivered them: a run that
    died after its mark was saved, or the runs after a stale checkpoint (whose mark
    :meth:`~store.timer.timer_service.TimerService._stale_from` set).  Empty when no mark
    is set or nothing was delivered since it.

    Those runs fired only slots due by ``floor_now`` (the units of the slot at the read time
    from ``slotDone`` on) and delivered straight from the queue only entries past the
    checkpointed queue offset; a source counts when a timer copy from the mark on names it
    (:func:`timer_origins_since`).  A roll's re-put is a new queue entry, counted pending
    there, so its unit counts as delivered here.  One chain walk per due slot, NumPy per
    unit (what the redo does anyway)."""
    empty = np.empty(0, np.int64)
    if state.deliver_mark < 0:
        return empty
    origins = timer_origins_since(store, state.deliver_mark)
    if not len(origins):
        return empty
    precision = wheel.precision
    found = [empty]
    read_time = state.last_read_time_ms
    for slot_time in wheel.due_slots(read_time, floor_now).tolist():
        _first, last, num = wheel.get(slot_time)
        _positions, units = log.walk_chain(last, state.last_timer_log_flush_pos, num)
        units = units[::-1][state.slot_done if slot_time == read_time else 0:]
        copied = np.isin(units["offset_py"], origins) & (
            (units["magic"] & (MAGIC_DELETE | MAGIC_ROLL)) != MAGIC_DELETE)
        found.append(np.full(int(copied.sum()), slot_time + precision, np.int64))
    queue = store.consume_queue(TIMER_TOPIC, 0)
    end = queue.max_offset(store.confirmed_offset())
    for q in range(state.last_timer_queue_offset, end, CHUNK):
        e = read_queue_entries(queue, q, min(end, q + CHUNK))
        hit = np.isin(e["offset"].astype(np.int64), origins)
        if hit.any():
            fire, marker, ok, _ = record_fields(store, e, hit)
            found.append(fire[hit & ok & ~marker] + precision)
    return np.concatenate(found)


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
