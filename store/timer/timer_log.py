"""TimerLog: the append-only log of timer units, chained per wheel slot by ``prevPos``.

Files: ``timerlog/{20-digit start offset}``, each ``timer_log_file_size_bytes`` long
(100 MiB by default), zero-filled, named like CommitLog segments.  A unit never spans two
files, so units sit at ``file start + 52 * k``.

Unit layout (52 bytes, big-endian)::

    off  size  type  field
    0    4     i32   size          always 52
    4    8     i64   prevPos       position of the slot's previous unit, -1 for the first
    12   4     i32   magic         DEFAULT 1 | ROLL 2 | DELETE 4; no bits above 0xF
    16   8     i64   enqueueTime   the timer's write time when the unit was added (ms)
    24   4     i32   delay         slot time - enqueueTime (ms)
    28   8     i64   offsetPy      CommitLog offset of the rmq_sys_wheel_timer record
    36   4     i32   sizePy        its size
    40   4     i32   topicHash     RocketMQ: Java hash of REAL_TOPIC (metrics); 0 here, since
                                   units are built from the ConsumeQueue without reading records
    44   8     i64   reserved      0

File end: when fewer than 52 + 16 bytes remain, a 16-byte blank is written (i32 bytes left,
i64 0, i32 0xCBD43194 -- the CommitLog's BLANK magic) and the next unit starts the next file.

Recovery: the timer checkpoint (:mod:`store.timer.timer_checkpoint`) records how far the log is
valid; everything past it is zeroed on the next run (:meth:`TimerLog.truncate`), and wheel
slots pointing past it are rebuilt from the units below it (:mod:`store.timer.timer_service`).
"""

from __future__ import annotations

import os
import struct

import numpy as np

from ..base.crc import crc32
from ..formats.record_codec import BLANK_MAGIC_CODE
from ..formats.binary_layout import layout
from ..files.mapped_file import MappedFileQueue
from ..base.jit import kernel_set

UNIT_FIELDS = (
    ("size", ">i4"),  # size, 52
    ("prev_pos", ">i8"),  # prevPos
    ("magic", ">i4"),  # magic
    ("enqueue_time", ">i8"),  # enqueueTime (ms)
    ("delay", ">i4"),  # delay: slot time - enqueueTime (ms)
    ("offset_py", ">i8"),  # offsetPy
    ("size_py", ">i4"),  # sizePy
    ("topic_hash", ">i4"),  # topicHash
    ("reserved", ">i8"),  # reserved
)
UNIT, UNIT_SIZE, UNIT_DTYPE = layout(UNIT_FIELDS).exports()  # 52 bytes
NATIVE_UNIT_DTYPE = UNIT_DTYPE.newbyteorder("=")

BLANK = struct.Struct(
    ">"
    "i"  # bytes left in the file
    "q"  # 0
    "i"  # BLANK_MAGIC_CODE (0xCBD43194)
)
BLANK_SIZE = BLANK.size  # 16

MAGIC_DEFAULT = 1
MAGIC_ROLL = 2
MAGIC_DELETE = 4
_MAGIC_MASK = 0xF

#: What a chain walk returns per unit (native byte order): what firing a slot reads.
CHAIN_DTYPE = np.dtype([("position", np.int64), ("magic", np.int64),
                        ("enqueue_time", np.int64), ("offset_py", np.int64)])

# how the compiled walk of one file ended
_NEXT_FILE, _STOP, _FULL = 0, 1, 2


def _be(raw, at, width):
    """The unsigned big-endian integer of ``width`` bytes at ``raw[at]``."""
    v = np.int64(0)  # int64 as Python too: NumPy keeps a uint8 element's width
    for i in range(width):
        v = (v << 8) | np.int64(raw[at + i])
    return v


def _walk_file(raw, file_start, per_file, pos, end, out, n):
    """Follow a chain from ``pos`` while it stays in the file mapped at ``raw``, appending
    each unit's position, magic, enqueueTime and offsetPy to the rows ``out[n:]``.

    Returns ``(n, next position, how it ended)``: the chain went to another file
    (``_NEXT_FILE``), ended (``_STOP``) or filled ``out`` (``_FULL``).
    """
    cap = len(out)
    p = pos
    while True:
        if p < 0 or p >= end:
            return n, p, 1
        rel = p - file_start
        if rel < 0 or rel >= len(raw):
            return n, p, 0
        if rel % 52 != 0 or rel // 52 >= per_file:
            return n, p, 1
        if n >= cap:
            return n, p, 2
        size = _be(raw, rel, 4)
        magic = _be(raw, rel + 12, 4)
        if size != 52 or (magic & ~0xF) != 0:
            return n, p, 1
        hi = _be(raw, rel + 4, 4)
        if hi >= 2147483648:
            hi -= 4294967296
        prev = hi * 4294967296 + _be(raw, rel + 8, 4)
        out[n, 0] = p
        out[n, 1] = magic
        hi = _be(raw, rel + 16, 4)
        if hi >= 2147483648:
            hi -= 4294967296
        out[n, 2] = hi * 4294967296 + _be(raw, rel + 20, 4)
        hi = _be(raw, rel + 28, 4)
        if hi >= 2147483648:
            hi -= 4294967296
        out[n, 3] = hi * 4294967296 + _be(raw, rel + 32, 4)
        n += 1
        if prev >= p:  # a pointer must go backwards
            return n, -1, 1
        p = prev


_kernels = kernel_set(globals(), helpers=("_be",), kernels=("_walk_file",))


def units_per_file(file_size: int) -> int:
    """How many units one file holds (the rest is the blank)."""
    return (file_size - BLANK_SIZE) // UNIT_SIZE


class TimerLog:
    """The ``timerlog`` segment files.

    Parameters
    ----------
    directory : str
        The store's ``timerlog`` directory.
    file_size : int
        Size of one segment.
    """

    def __init__(self, directory: str, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.per_file = units_per_file(file_size)
        self.files = MappedFileQueue(directory, file_size)

    # -- placement and writing --------------------------------------------------------------
    def place(self, end: int, n: int) -> tuple[np.ndarray, list[tuple[int, int]], int]:
        """Positions of ``n`` new units appended at ``end``.

        Returns ``(positions, blanks, new_end)``; ``blanks`` lists ``(position, bytes_left)``
        of the file-end blanks to write.
        """
        size = self.file_size
        positions = np.empty(n, dtype=np.int64)
        blanks: list[tuple[int, int]] = []
        i = 0
        pos = end
        while i < n:
            rel = pos % size
            room = max(0, (size - rel - BLANK_SIZE) // UNIT_SIZE)
            if room == 0:
                blanks.append((pos, size - rel))
                pos += size - rel
                continue
            k = min(room, n - i)
            positions[i:i + k] = pos + UNIT_SIZE * np.arange(k, dtype=np.int64)
            i += k
            pos += UNIT_SIZE * k
        if n and (pos % size) and (size - pos % size) < UNIT_SIZE + BLANK_SIZE:
            # the file is full: close it now so the next append starts a new file cleanly
            blanks.append((pos, size - pos % size))
            pos += size - pos % size
        return positions, blanks, pos

    def write(self, positions: np.ndarray, units: np.ndarray,
              blanks: list[tuple[int, int]]) -> None:
        """Write units (``UNIT_DTYPE`` array, at ``positions`` from :meth:`place`) and blanks."""
        if len(units):
            data = units.astype(UNIT_DTYPE, copy=False).tobytes()
            # one write per run of consecutive positions (a run never crosses a file)
            breaks = np.flatnonzero(np.diff(positions) != UNIT_SIZE) + 1
            starts = np.concatenate(([0], breaks))
            stops = np.concatenate((breaks, [len(positions)]))
            for a, b in zip(starts.tolist(), stops.tolist()):
                self.files.write(int(positions[a]), data[a * UNIT_SIZE:b * UNIT_SIZE])
        for pos, left in blanks:
            self.files.write(pos, BLANK.pack(left, 0, BLANK_MAGIC_CODE))

    # -- reading ----------------------------------------------------------------------------
    def _file_units(self, pos: int):
        f = self.files.find(pos)
        if f is None:
            return None, None
        return f, np.frombuffer(f.buffer(), dtype=UNIT_DTYPE, count=self.per_file)

    def read_units(self, positions: np.ndarray) -> np.ndarray:
        """Units at ``positions`` (native byte order); missing files give rows of zeros."""
        out = np.zeros(len(positions), dtype=NATIVE_UNIT_DTYPE)
        if not len(positions):
            return out
        starts = positions - positions % self.file_size
        for start in np.unique(starts).tolist():
            sel = np.flatnonzero(starts == start)
            f, arr = self._file_units(int(start))
            if f is None:
                continue
            out[sel] = arr[(positions[sel] - start) // UNIT_SIZE]
        return out

    def walk_chain(self, last_pos: int, end: int, size_hint: int = 0
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Follow a slot's chain from ``last_pos`` back through ``prevPos``.

        Returns ``(positions, units)`` newest first; ``units`` is a :data:`CHAIN_DTYPE` array
        (position, magic, enqueueTime, offsetPy: what firing a slot reads).  The walk stops
        at -1, at a position at or past ``end`` (the valid end of the log), at a missing file,
        at an invalid unit, or at a pointer that does not go backwards.  A compiled loop
        follows the pointers over each file's mapping and reads the fields on the way.
        ``size_hint``: the units the slot is expected to hold (the wheel's count).
        """
        # a damaged wheel may hold any count: no chain is longer than the log holds units
        size_hint = min(size_hint, max(end, 0) // UNIT_SIZE)
        out = np.empty((max(1024, size_hint + 1), 4), dtype=np.int64)
        n, pos = 0, last_pos
        walk = _kernels(size_hint)["_walk_file"]
        while 0 <= pos < end:
            f = self.files.find(pos)
            if f is None:
                break
            raw = np.frombuffer(f.buffer(), dtype=np.uint8)
            n, pos, status = walk(raw, f.start, self.per_file, pos, end, out, n)
            if status == _FULL:
                out = np.concatenate((out, np.empty_like(out)))
            elif status == _STOP:
                break
        out = out[:n] if 2 * n >= len(out) else out[:n].copy()
        units = out.view(CHAIN_DTYPE).reshape(n)
        return units["position"], units

    def valid_units(self, start: int, end: int, most: int | None = None):
        """Yield ``(positions, units)`` arrays of the valid units in ``[start, end)`` per file
        (at most ``most`` units at a time when given).

        Stops at the first invalid unit (used to rebuild the wheel from the log).
        """
        pos = start
        while pos < end:
            f, arr = self._file_units(pos)
            if f is None:
                return
            k = (pos - f.start) // UNIT_SIZE
            stop = min(len(arr), -(-(end - f.start) // UNIT_SIZE))
            if most is not None and stop - k > most:
                stop = k + most
            chunk = arr[k:stop]
            ok = (chunk["size"] == UNIT_SIZE) & ((chunk["magic"] & ~_MAGIC_MASK) == 0) & (
                (chunk["magic"] & MAGIC_DEFAULT) != 0)
            n = int(np.argmin(ok)) if not ok.all() else len(chunk)
            if n:
                yield (pos + UNIT_SIZE * np.arange(n, dtype=np.int64),
                       chunk[:n].astype(NATIVE_UNIT_DTYPE))
            if n < len(chunk):
                return
            pos = f.end if stop == len(arr) else f.start + stop * UNIT_SIZE

    def crc(self, start: int, end: int, crc: int = 0) -> int | None:
        """CRC32 of the log's bytes in ``[start, end)`` (file-end blanks and the zeros after
        them included), going on from ``crc``; ``None`` when a file in the range is missing."""
        at = start
        while at < end:
            f = self.files.find(at)
            if f is None:
                return None
            stop = min(end, f.start + self.file_size)
            crc = crc32(memoryview(f.buffer())[at - f.start:stop - f.start], crc)
            at = stop
        return crc

    # -- maintenance ------------------------------------------------------------------------
    def truncate(self, end: int) -> None:
        """Zero everything from ``end`` on and delete later files."""
        self.files.truncate(end)

    def delete_expired(self, commitlog_min: int) -> int:
        """Delete files (never the last) whose last unit's record is below ``commitlog_min``."""
        deleted = 0
        for f in self.files.refresh()[:-1]:
            arr = np.frombuffer(f.buffer(), dtype=UNIT_DTYPE, count=self.per_file)
            sizes = arr["size"]
            n = int(np.count_nonzero(sizes == UNIT_SIZE))
            if n == 0:
                self.files.delete_file(f)
                deleted += 1
                continue
            last = arr[n - 1]
            if int(last["offset_py"]) + int(last["size_py"]) <= commitlog_min:
                self.files.delete_file(f)
                deleted += 1
            else:
                break
        return deleted

    def flush(self) -> None:
        self.files.flush()

    def release_memory(self) -> None:
        """Drop this process's resident pages of the log mappings (data stays on disk)."""
        self.files.release_pages()

    def disk_bytes(self) -> int:
        """Bytes the TimerLog segments take on disk."""
        return sum(os.path.getsize(f.path) for f in self.files.files if os.path.exists(f.path))

    def close(self) -> None:
        self.files.close()
