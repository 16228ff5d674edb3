"""TimerWheel: the ``timerwheel`` file, one 32-byte slot per precision step.

File: ``timerwheel`` under the store root, exactly ``timer_wheel_slots * 32`` bytes
(RocketMQ: 2 x 604800 slots = 38,707,200 bytes), mapped shared so every process sees every
change at once.  A file of another length is refused (:class:`CorruptRecordError`).

Slot layout (32 bytes at ``index * 32``, big-endian)::

    off  size  type  field
    0    8     i64   time       slot time / precision (the slot's absolute tick)
    8    8     i64   firstPos   TimerLog position of the slot's first unit
    16   8     i64   lastPos    TimerLog position of its last unit (head of the prevPos chain)
    24   4     i32   num        units added minus cancel markers
    28   4     i32   magic      unused, 0

``index = (time_ms // precision) % slots``.  A slot counts only when its ``time`` field equals
the tick asked for; any other value reads as empty (firstPos = lastPos = -1, num = 0), so
slots are reused as the wheel turns without being cleared.

Crash safety: a slot update writes firstPos, lastPos, num and only then time, field by field
over all updated slots.  Every partial update therefore leaves either a stale slot or a slot
whose pointers reach past the TimerLog's checkpointed end; the timer service finds both with
:meth:`TimerWheel.slots_pointing_past` and rebuilds them from the TimerLog units.
"""

from __future__ import annotations

import logging
import mmap
import os

import numpy as np

from ..base.errors import CorruptRecordError
from ..files.fileio import allocate, move_aside
from ..files.mapped_file import release_pages
from ..formats.binary_layout import layout
from .timer_log import TimerLog

log = logging.getLogger("store")

SLOT_FIELDS = (
    ("time", ">i8"),  # time / precision
    ("first_pos", ">i8"),  # firstPos
    ("last_pos", ">i8"),  # lastPos
    ("num", ">i4"),  # num
    ("magic", ">i4"),  # magic (unused)
)
SLOT, SLOT_SIZE, SLOT_DTYPE = layout(SLOT_FIELDS).exports()  # 32 bytes


def live_ticks_of(slots: np.ndarray) -> np.ndarray:
    """``time`` (slot time / precision) of every slot of ``slots`` (:data:`SLOT_DTYPE`)
    holding units."""
    live = (slots["last_pos"] >= 0) & (slots["first_pos"] >= 0) & (slots["time"] > 0)
    return slots["time"][live].astype(np.int64)


def read_live_ticks(path: str) -> tuple[np.ndarray, int] | None:
    """:func:`live_ticks_of` the wheel file at ``path`` and its slot count, read without
    writing (``None``: no such file, or not a whole number of slots)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    if not size or size % SLOT_SIZE:
        return None
    slots = np.memmap(path, dtype=SLOT_DTYPE, mode="r")
    try:
        return live_ticks_of(slots), size // SLOT_SIZE
    finally:
        del slots


class TimerWheel:
    """The shared ``timerwheel`` mapping.

    Parameters
    ----------
    path : str
        The file.
    slots : int
        Number of slots.
    precision_ms : int
        Width of one slot.
    """

    def __init__(self, path: str, slots: int, precision_ms: int) -> None:
        self.path = path
        self.slots = slots
        self.precision = precision_ms
        size = slots * SLOT_SIZE
        # created in place (never renamed over), so processes opening it together share one
        # inode; an empty file is what a crash during creation leaves
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            actual = os.fstat(fd).st_size
            self.created = actual == 0
            if self.created:
                os.ftruncate(fd, size)
                os.fsync(fd)
                actual = size
            if actual != size:
                raise CorruptRecordError(
                    path, 0, f"timerwheel is {actual} bytes; expected {size} "
                    f"({slots} slots of {SLOT_SIZE} bytes, timer_wheel_slots={slots})")
            try:
                allocate(fd, size, path)  # written through mmap: no holes (SIGBUS when full)
            except OSError:
                if self.created:  # leave the empty file a failed creation leaves
                    os.ftruncate(fd, 0)
                raise
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self._slots = np.frombuffer(self._map, dtype=SLOT_DTYPE)
        if self.created:
            self.reset()  # every slot empty: time and positions -1
            self.flush()
            self.release_memory()

    # -- addressing -------------------------------------------------------------------------
    def ticks(self, times_ms) -> np.ndarray:
        """Each time as a count of ``precision`` ticks."""
        return np.asarray(times_ms, dtype=np.int64) // self.precision

    def index(self, times_ms) -> np.ndarray:
        """The slot index of a due time: its tick modulo the wheel's slot count."""
        return self.ticks(times_ms) % self.slots

    # -- reading ----------------------------------------------------------------------------
    def get(self, time_ms: int) -> tuple[int, int, int]:
        """``(firstPos, lastPos, num)`` of the slot of ``time_ms``; ``(-1, -1, 0)`` when empty."""
        row = self._slots[(time_ms // self.precision) % self.slots]
        if int(row["time"]) != time_ms // self.precision:
            return -1, -1, 0
        return int(row["first_pos"]), int(row["last_pos"]), int(row["num"])

    def lookup(self, times_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised :meth:`get`: ``(valid, firstPos, lastPos, num)`` arrays."""
        ticks = self.ticks(times_ms)
        rows = self._slots[ticks % self.slots]
        valid = rows["time"] == ticks
        first = np.where(valid, rows["first_pos"], -1).astype(np.int64)
        last = np.where(valid, rows["last_pos"], -1).astype(np.int64)
        num = np.where(valid, rows["num"], 0).astype(np.int64)
        return valid, first, last, num

    def due_slots(self, start_ms: int, end_ms: int) -> np.ndarray:
        """Times (ms, ascending) of the non-empty slots with time in ``[start_ms, end_ms)``."""
        lo, hi = start_ms // self.precision, -(-end_ms // self.precision)
        if hi <= lo:
            return np.empty(0, np.int64)
        if hi - lo >= self.slots:
            t = self._slots["time"].astype(np.int64)
            keep = (t >= lo) & (t < hi) & (self._slots["last_pos"] >= 0)
            out = np.sort(t[keep])
        else:
            ticks = np.arange(lo, hi, dtype=np.int64)
            rows = self._slots[ticks % self.slots]
            out = ticks[(rows["time"] == ticks) & (rows["last_pos"] >= 0)]
        out = out * self.precision
        return out[(out >= start_ms) & (out < end_ms)]

    def slots_pointing_past(self, end: int) -> np.ndarray:
        """Indices of slots whose firstPos or lastPos is at or past ``end``."""
        return np.flatnonzero((self._slots["first_pos"] >= end) | (self._slots["last_pos"] >= end))

    def row(self, index: int) -> tuple[int, int, int, int]:
        """Slot ``index`` as ``(time_ms, first_pos, last_pos, num)``."""
        r = self._slots[index]
        return int(r["time"]), int(r["first_pos"]), int(r["last_pos"]), int(r["num"])

    def live_slots(self, from_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Times (ms) and ``num`` of the non-empty slots at or after ``from_ms``."""
        t = self._slots["time"].astype(np.int64)
        idx = np.arange(self.slots)
        keep = (t >= from_ms // self.precision) & (self._slots["last_pos"] >= 0) & (
            t % self.slots == idx)
        return t[keep] * self.precision, self._slots["num"][keep].astype(np.int64)

    def raw_bytes(self) -> memoryview:
        """The whole file's bytes, as mapped (read them only)."""
        return memoryview(self._map)

    def live_ticks(self) -> np.ndarray:
        """``time`` (slot time / precision) of every slot holding units."""
        return live_ticks_of(self._slots)

    def live_slot_count(self, from_ms: int) -> int:
        """How many slots hold units (``lastPos`` set) with a time at or after ``from_ms``,
        wherever they sit (a slot at the wrong index counts too: it is damage)."""
        keep = (self._slots["time"] >= from_ms // self.precision) & (self._slots["last_pos"] >= 0)
        return int(np.count_nonzero(keep))

    def live_first_pos(self, from_ms: int) -> int | None:
        """The lowest ``first_pos`` of the non-empty slots at or after ``from_ms``."""
        t = self._slots["time"]
        keep = (t >= from_ms // self.precision) & (self._slots["last_pos"] >= 0) & (
            self._slots["first_pos"] >= 0)
        return int(self._slots["first_pos"][keep].min()) if keep.any() else None

    def pending_count(self, from_ms: int) -> int:
        """Sum of ``num`` over live slots at or after ``from_ms`` (approximate pending count)."""
        t = self._slots["time"]
        keep = (t >= from_ms // self.precision) & (self._slots["last_pos"] >= 0)
        return int(self._slots["num"][keep].astype(np.int64).sum())

    # -- writing ----------------------------------------------------------------------------
    def put(self, times_ms: np.ndarray, first: np.ndarray, last: np.ndarray,
            num: np.ndarray) -> None:
        """Write slots (vectorised); ``time`` goes last so a torn update is detectable."""
        ticks = self.ticks(times_ms)
        idx = ticks % self.slots
        self._slots["first_pos"][idx] = first
        self._slots["last_pos"][idx] = last
        self._slots["num"][idx] = num
        self._slots["magic"][idx] = 0
        self._slots["time"][idx] = ticks

    def clear(self, index: np.ndarray) -> None:
        """Empty slots by index (``time`` first, so they read as empty at once)."""
        self._slots["time"][index] = -1
        self._slots["first_pos"][index] = -1
        self._slots["last_pos"][index] = -1
        self._slots["num"][index] = 0

    def reset(self) -> None:
        """Empty every slot."""
        self.clear(np.arange(self.slots))

    def flush(self) -> None:
        self._map.flush()

    def release_memory(self) -> None:
        """Drop this process's resident pages of the mapping (the data stays in the file)."""
        release_pages([self._map])

    def close(self) -> None:
        self._slots = None  # type: ignore[assignment]
        try:
            self._map.flush()
            self._map.close()
        except (BufferError, ValueError):
            pass


def open_timer_files(root: str, slots: int, precision_ms: int,
                     log_file_size: int) -> tuple[TimerWheel, TimerLog, bool]:
    """Open ``<root>/timerwheel`` and ``<root>/timerlog``; ``damaged`` is True when one had
    the wrong length.

    Such a file is moved aside (``<name>.damaged-<n>``, kept for inspection, never deleted)
    and a fresh one created: both files are derived from the timer ConsumeQueue and the
    CommitLog, so the caller rebuilds them (the timer service's ``_rebuild``).
    """
    wheel_path, log_path = os.path.join(root, "timerwheel"), os.path.join(root, "timerlog")
    damaged = False
    for _ in range(3):
        try:
            wheel = TimerWheel(wheel_path, slots, precision_ms)
        except CorruptRecordError as exc:
            log.warning("%s; moved to %s, rebuilding the timer wheel", exc,
                        move_aside(wheel_path))
            damaged = True
            continue
        try:
            return wheel, TimerLog(log_path, log_file_size), damaged
        except CorruptRecordError as exc:
            wheel.close()
            log.warning("%s; moved %s to %s, rebuilding the timer wheel", exc, log_path,
                        move_aside(log_path))
            damaged = True
    raise CorruptRecordError(wheel_path, 0, "the timer files could not be opened or rebuilt")
