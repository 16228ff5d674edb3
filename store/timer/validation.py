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
  (-1 for the first: the chain links point backwards); one compiled pass over the units in
  log order tallies their slots (no sort; a table twice the wheel's live slots), then NumPy
  compares the tally with the wheel;
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

from ..base.jit import kernel_set
from ..core.ports import StorePort
from ..delayed.delivery import (
    origins_since,
    properties_since,
    read_queue_entries,
    release_commitlog_pages,
)
from ..files.consume_queue import ENTRY_DTYPE
from ..formats.message import PROPERTY_DELAY_ORIGIN, PROPERTY_TIMER_DEQUEUE_MS, TIMER_TOPIC
from ..kernels.property_scan import parse_int_ranges
from .timer_checkpoint import TimerCheckpoint
from .timer_log import MAGIC_DELETE, MAGIC_ROLL, UNIT_SIZE, TimerLog
from .timer_queue import CHUNK, record_fields
from .wheel import TimerWheel

#: TimerLog units checked per step (bounds the memory the check takes).
CHECK_CHUNK = 1 << 16
#: A slot of the tally no pending unit filled yet.
_EMPTY = np.iinfo(np.int64).min
# how a chunk's tally ended: fine, a unit not pointing at its slot's previous unit, a unit
# of one slot more than the wheel holds live ones
_FINE, _BROKEN_CHAIN, _TOO_MANY_SLOTS = 0, 1, 2


def _tally_units(positions, slot_time, magic, prev, read_time, log_min, precision, empty,
                 limit, t_time, t_first, t_last, t_num, t_cut, used, keep):
    """Add the pending units (slot time at or after ``read_time``) among a chunk of TimerLog
    units, in position order, to the tally of their slots: a table probed from the slot's
    tick (``t_*``: slot time or ``empty``, first and last position, units minus markers,
    whether the slot's first units are in files retention removed; ``used[0]``: slots in
    it, at most ``limit``, the wheel's live slots, in a table of twice as many); ``keep`` is
    set for the pending ones.

    Returns ``(how it ended, the unit)``: each pending unit must point at the previous unit
    of its slot (the first of a slot at -1, or below ``log_min``: a cut), and the pending
    units fill no more slots than the wheel holds.  One pass, no sort."""
    cap = len(t_time)
    for i in range(len(positions)):
        t = slot_time[i]
        if t < read_time:
            keep[i] = False
            continue
        keep[i] = True
        h = (t // precision) % cap
        while t_time[h] != t and t_time[h] != empty:
            h = (h + 1) % cap
        p = prev[i]
        if t_time[h] == t:
            if p != t_last[h]:
                return 1, i
        else:
            cut = p >= 0 and p < log_min
            if p != -1 and not cut:
                return 1, i
            if used[0] >= limit:
                return 2, i
            used[0] += 1
            t_time[h] = t
            t_first[h] = positions[i]
            t_cut[h] = cut
            t_num[h] = 0
        t_last[h] = positions[i]
        if magic[i] & 4:  # MAGIC_DELETE: a cancel marker
            t_num[h] -= 1
        else:
            t_num[h] += 1
    return 0, -1


_kernels = kernel_set(globals(), kernels=("_tally_units",))


class _SlotTally:
    """What the pending units say of each slot they fill, built a chunk at a time in log
    order (:func:`_tally_units`): its size is twice the wheel's live slots (more slots
    than those is damage, found as soon as the units fill one more)."""

    def __init__(self, log_min: int, live: int, precision: int) -> None:
        self.log_min, self.live, self.precision = log_min, live, precision
        cap = 2 * max(live, 512)
        self.time = np.full(cap, _EMPTY, np.int64)
        self.first = np.empty(cap, np.int64)
        self.last = np.empty(cap, np.int64)
        self.num = np.empty(cap, np.int64)
        self.cut = np.zeros(cap, bool)
        self.used = np.zeros(1, np.int64)

    def add(self, positions: np.ndarray, units: np.ndarray, read_time: int
            ) -> tuple[np.ndarray, np.ndarray, str | None]:
        """Take a chunk of units (in position order); returns which are pending, their slot
        times and why their chains are broken (``None``: they are not)."""
        slot_time = units["enqueue_time"].astype(np.int64) + units["delay"]
        keep = np.empty(len(units), bool)
        status, i = _kernels(len(units))["_tally_units"](
            positions, slot_time, units["magic"], units["prev_pos"], read_time, self.log_min,
            self.precision, _EMPTY, self.live, self.time, self.first, self.last, self.num,
            self.cut, self.used, keep)
        if status == _BROKEN_CHAIN:
            return keep, slot_time, (f"the TimerLog unit at {int(positions[i])} does not "
                                     "point at the previous unit of its slot")
        if status == _TOO_MANY_SLOTS:
            return keep, slot_time, (f"the wheel has {self.live} live slots but the "
                                     f"TimerLog's pending units fill more (the unit at "
                                     f"{int(positions[i])}, of the slot of "
                                     f"{int(slot_time[i])} ms)")
        return keep, slot_time, None

    def against(self, wheel: TimerWheel) -> str | None:
        """Whether the wheel's live slots are not exactly the tallied ones."""
        rows = np.flatnonzero(self.time != _EMPTY)
        rows = rows[np.argsort(self.time[rows], kind="stable")]  # reported in time order
        times = self.time[rows]
        valid, first, last, num = wheel.lookup(times)
        bad = ~valid | (last != self.last[rows]) | (~self.cut[rows] & (
            (first != self.first[rows]) | (num != self.num[rows])))
        if bad.any():
            i = int(np.argmax(bad))
            r = rows[i]
            return (f"the wheel slot of {int(times[i])} ms does not match the TimerLog "
                    f"(slot firstPos {int(first[i])}, lastPos {int(last[i])}, num "
                    f"{int(num[i])}; the units say {int(self.first[r])}, {int(self.last[r])}, "
                    f"{int(self.num[r])})")
        if self.live != len(times):
            return (f"the wheel has {self.live} live slots but the TimerLog's pending units "
                    f"fill {len(times)}")
        return None


def _records_problem(store: StorePort, positions: np.ndarray, units: np.ndarray,
                     slot_time: np.ndarray, pending: np.ndarray,
                     certified_from: int) -> str | None:
    """Whether a ``pending`` unit names no timer record of its size and slot (the records of
    units at or after ``certified_from`` are not read: see :func:`certified_from`)."""
    log = store.commit_log
    offsets = units["offset_py"].astype(np.int64, copy=False)
    sizes = units["size_py"].astype(np.int64)
    present = pending & (offsets >= log.min_offset())
    past = present & (offsets + sizes > store.confirmed_offset())
    if past.any():
        return (f"the TimerLog unit at {int(positions[np.argmax(past)])} points past "
                "the CommitLog's end")
    rows = np.flatnonzero(present & (positions < certified_from))
    if not len(rows):
        return None
    e = np.zeros(len(rows), dtype=ENTRY_DTYPE.newbyteorder("="))
    e["offset"] = offsets[rows]
    e["size"] = sizes[rows]
    fire, marker, ok, _ = record_fields(store, e, np.ones(len(rows), bool))
    magic = units["magic"][rows]
    roll = (magic & MAGIC_ROLL) != 0
    slot = slot_time[rows]
    fits = ok & (marker == ((magic & MAGIC_DELETE) != 0)) & np.where(
        roll, fire >= slot, fire <= slot)
    if not fits.all():
        i = int(np.argmin(fits))
        return (f"the TimerLog unit at {int(positions[rows[i]])} names no timer record of "
                f"its slot (CommitLog offset {int(e['offset'][i])}, size {int(e['size'][i])})")
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
    tally = _SlotTally(log_min, wheel.live_slot_count(read_time), wheel.precision)
    seen = 0
    certified = certified_from(log, state, log_min)
    for positions, units in log.valid_units(log_min, end, CHECK_CHUNK):
        seen += len(units)
        pending, slot_time, problem = tally.add(positions, units, read_time)
        problem = problem or _records_problem(store, positions, units, slot_time, pending,
                                              certified)
        if problem is not None:
            return problem
        release_commitlog_pages(store)
    size = log.file_size
    expected = sum(min(log.per_file, (end - s) // UNIT_SIZE) for s in range(log_min, end, size))
    if seen < expected:
        return (f"the TimerLog holds no valid unit at or after unit {seen} of the "
                f"{expected} from {log_min} to its checkpointed end {end}")
    return tally.against(wheel)


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
