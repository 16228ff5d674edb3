"""Fixed-size segment files named by their 20-digit start offset (RocketMQ's MappedFileQueue).

Used by the CommitLog, every ConsumeQueue and the TimerLog.  A segment is created at its full
size (sparse, zero-filled), written with ``os.pwrite`` and read through a shared read-only
``mmap``, so readers in other processes see bytes as soon as they are written and never take
a lock.  The segment holding offset ``o`` starts at ``o - o % file_size``.

A segment of the wrong length (truncated, or grown by foreign bytes) is damage.  With
``wrong_length="raise"`` (the TimerLog, whose owner rebuilds it) it is a
:class:`CorruptRecordError`.  With ``"repair"`` (CommitLog, ConsumeQueues) the rest of the
log stays readable: a writable queue moves the file aside (``<name>.damaged-<n>``, kept)
and puts a full-length copy of its first ``file_size`` bytes in its place (missing bytes
read as zeros, i.e. as no record); a read-only queue maps that zero-padded copy in memory and
changes nothing on disk.  Either way a warning names the file and :attr:`repaired` lists it,
so the store can rescan what the damage touched.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading

import numpy as np

from .errors import CorruptRecordError, DiskFullError
from .fileio import allocate, disk_full, fsync_dir, move_aside

NAME_DIGITS = 20
log = logging.getLogger("store")


def segment_name(start: int) -> str:
    return f"{start:0{NAME_DIGITS}d}"


class MappedFile:
    """One segment: ``path`` holds bytes ``[start, start + size)`` of the log."""

    __slots__ = ("path", "start", "size", "length", "_fd", "_map", "_lock", "_allocated")

    def __init__(self, path: str, start: int, size: int, length: int | None = None) -> None:
        self.path = path
        self.start = start
        self.size = size
        #: bytes the file really holds when it is not ``size`` long (a damaged segment opened
        #: read-only: mapped as an in-memory copy padded with zeros); ``None`` otherwise
        self.length = length
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()
        #: ``(lo, hi)``: a range of the file this process has reserved (``posix_fallocate``)
        self._allocated = (0, 0)

    @property
    def end(self) -> int:
        return self.start + self.size

    def fd(self) -> int:
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDWR)
        return self._fd

    def buffer(self) -> mmap.mmap:
        """A read-only shared mapping of the whole segment."""
        m = self._map
        if m is None:
            with self._lock:
                if self._map is None and self.length is not None:
                    self._map = _padded_copy(self.path, self.size)
                elif self._map is None:
                    with open(self.path, "rb") as fh:
                        self._map = mmap.mmap(fh.fileno(), self.size, access=mmap.ACCESS_READ)
                m = self._map
        return m

    def write(self, position: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``position`` (relative to the segment start)."""
        # reserve the blocks first: on a full disk nothing is written (no torn record, and no
        # hole that a mapping would fault on), the error is typed.  Blocks are reserved up to
        # ALLOCATE_AHEAD (or a 16th of the file) at a time, so most writes need no system
        # call for it
        end = position + len(data)
        lo, hi = self._allocated
        if not lo <= position <= end <= hi:
            step = min(ALLOCATE_AHEAD, self.size // 16)
            ahead = min(self.size, max(end, position + step))
            try:
                allocate(self.fd(), ahead - position, self.path, offset=position)
            except DiskFullError:
                ahead = end  # no room to reserve ahead: this write's blocks alone, or fail
                allocate(self.fd(), len(data), self.path, offset=position)
            self._allocated = (lo, ahead) if lo <= position <= hi else (position, ahead)
        try:
            n = os.pwrite(self.fd(), data, position)
        except OSError as exc:
            raise disk_full(exc, self.path, f"a write of {len(data)} bytes") from None
        if n != len(data):  # a short write means a full disk
            raise DiskFullError(errno.ENOSPC, f"{self.path}: short write, {n} of {len(data)} "
                                "bytes; the disk is full; allowed: free some space")

    def flush(self) -> None:
        os.fdatasync(self.fd())

    def close(self) -> None:
        with self._lock:
            if self._map is not None:
                try:
                    self._map.close()
                except BufferError:  # a caller still holds a view; the GC closes it later
                    pass
                self._map = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


_ZERO_CHUNK = 4 * 1024 * 1024
#: Most bytes :meth:`MappedFile.write` reserves past a write that needs new blocks (a 16th
#: of the file at most, so that thousands of queue files do not reserve gigabytes).
ALLOCATE_AHEAD = 4 * 1024 * 1024


def _prefix_chunks(fh, size: int):
    """``(position, bytes)`` of the first ``size`` bytes of the open file ``fh``, in chunks."""
    pos = 0
    while pos < size:
        chunk = fh.read(min(_ZERO_CHUNK, size - pos))
        if not chunk:
            return
        yield pos, chunk
        pos += len(chunk)


def _padded_copy(path: str, size: int) -> mmap.mmap:
    """An anonymous mapping of ``size`` bytes holding the first bytes of ``path`` (the rest
    zeros: untouched anonymous pages cost no memory)."""
    m = mmap.mmap(-1, size)
    with open(path, "rb") as fh:
        for pos, chunk in _prefix_chunks(fh, size):
            m[pos:pos + len(chunk)] = chunk
    return m


def _repair_in_place(path: str, size: int) -> str:
    """Move the damaged segment at ``path`` aside and put a ``size``-byte copy of its first
    bytes (zero-padded) in its place; returns where the original went."""
    aside = move_aside(path)
    tmp = path + ".tmp"
    with open(aside, "rb") as src, open(tmp, "wb") as dst:
        dst.truncate(size)
        allocate(dst.fileno(), min(size, os.fstat(src.fileno()).st_size), tmp)
        for pos, chunk in _prefix_chunks(src, size):
            if np.frombuffer(chunk, dtype=np.uint8).any():  # zeros stay a hole
                os.pwrite(dst.fileno(), chunk, pos)
        os.fdatasync(dst.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
    return aside


def _data_extents(f: MappedFile, position: int):
    """``(start, end)`` ranges of ``f`` from ``position`` on that may hold data.

    Holes of the sparse segment are skipped with ``SEEK_DATA``/``SEEK_HOLE``, so a mostly
    unwritten 1 GiB segment is not read page by page; without that support the whole rest
    of the file is one range.
    """
    fd = f.fd()
    pos = position
    while pos < f.size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but holes from here on
                return
            start, end = pos, f.size
        if start >= f.size:
            return
        end = min(end, f.size)
        yield start, end
        pos = end


def zero_tail(f: MappedFile, position: int) -> None:
    """Overwrite the non-zero bytes of ``f`` from ``position`` to its end with zeros."""
    buf = f.buffer()
    for start, end in _data_extents(f, position):
        pos = start
        while pos < end:
            n = min(_ZERO_CHUNK, end - pos)
            if np.frombuffer(buf, dtype=np.uint8, count=n, offset=pos).any():
                f.write(pos, bytes(n))
            pos += n


class MappedFileQueue:
    """The ordered segments of one log directory."""

    def __init__(self, directory: str, file_size: int, *, create: bool = True,
                 read_only: bool = False, wrong_length: str = "raise") -> None:
        if wrong_length not in ("raise", "repair"):
            raise ValueError(f"wrong_length={wrong_length!r}; allowed: 'raise', 'repair'")
        self.directory = directory
        self.file_size = file_size
        self.read_only = read_only
        self.wrong_length = wrong_length
        #: ``(path, length found, where the original went or None)`` of every segment of the
        #: wrong length met so far (see the module docstring)
        self.repaired: list[tuple[str, int, str | None]] = []
        if create and not read_only:
            os.makedirs(directory, exist_ok=True)
        self._files: list[MappedFile] = []
        self._lock = threading.RLock()
        self.refresh()

    # -- discovery --------------------------------------------------------------------------
    def refresh(self) -> list[MappedFile]:
        """Re-read the directory (other processes create and delete segments)."""
        with self._lock:
            try:
                names = sorted(n for n in os.listdir(self.directory)
                               if len(n) == NAME_DIGITS and n.isdigit())
            except FileNotFoundError:
                names = []
            known = {f.start: f for f in self._files}
            files = []
            for name in names:
                start = int(name)
                path = os.path.join(self.directory, name)
                f = known.pop(start, None)
                if f is None:
                    try:
                        actual = os.path.getsize(path)
                    except FileNotFoundError:
                        continue
                    if actual != self.file_size:
                        if actual == 0:  # an empty file left by a crash during creation
                            if not self.read_only:
                                try:
                                    os.unlink(path)
                                except OSError:
                                    pass
                            continue
                        if start % self.file_size == 0 and self.wrong_length == "repair":
                            f = self._repair(path, start, actual)
                            if f is not None:
                                files.append(f)
                            continue
                        raise CorruptRecordError(
                            path, 0, f"segment is {actual} bytes; expected {self.file_size}"
                        )
                    if start % self.file_size:
                        raise CorruptRecordError(
                            path, 0, "segment name is not a multiple of the file size")
                    f = MappedFile(path, start, self.file_size)
                files.append(f)
            for stale in known.values():
                stale.close()
            self._files = files
            return files

    def _repair(self, path: str, start: int, actual: int) -> MappedFile | None:
        """A segment for the damaged file at ``path`` (see the module docstring)."""
        what = "truncated" if actual < self.file_size else "grown"
        if self.read_only:
            log.warning("%s is %d bytes, expected %d (%s): read as a zero-padded copy; a "
                        "writable open sets it aside and repairs it", path, actual,
                        self.file_size, what)
            self.repaired.append((path, actual, None))
            return MappedFile(path, start, self.file_size, length=actual)
        try:
            aside = _repair_in_place(path, self.file_size)
        except FileNotFoundError:  # moved or removed by another process meanwhile
            return None
        log.warning("%s was %d bytes, expected %d (%s): kept as %s; a copy of its first %d "
                    "bytes, zero-padded, takes its place", path, actual, self.file_size, what,
                    aside, min(actual, self.file_size))
        self.repaired.append((path, actual, aside))
        return MappedFile(path, start, self.file_size)

    @property
    def files(self) -> list[MappedFile]:
        return self._files

    def min_offset(self) -> int:
        files = self._files
        return files[0].start if files else 0

    def last_file(self) -> MappedFile | None:
        files = self._files
        return files[-1] if files else None

    def find(self, offset: int, *, refresh: bool = True) -> MappedFile | None:
        """The segment holding ``offset``, or ``None``."""
        start = offset - offset % self.file_size
        for attempt in (0, 1):
            files = self._files
            if files:
                idx = (start - files[0].start) // self.file_size
                if 0 <= idx < len(files) and files[idx].start == start:
                    return files[idx]
                for f in files:  # gaps are possible after manual damage
                    if f.start == start:
                        return f
            if attempt == 0 and refresh:
                self.refresh()
            else:
                break
        return None

    # -- writing ----------------------------------------------------------------------------
    def get_or_create(self, offset: int) -> MappedFile:
        f = self.find(offset, refresh=False) or self.find(offset)
        if f is not None:
            return f
        with self._lock:
            start = offset - offset % self.file_size
            path = os.path.join(self.directory, segment_name(start))
            tmp = path + ".tmp"
            with open(tmp, "wb") as fh:
                fh.truncate(self.file_size)
            os.replace(tmp, path)
            fsync_dir(self.directory)
            self.refresh()
            f = self.find(start, refresh=False)
            assert f is not None
            return f

    def write(self, offset: int, data: bytes) -> None:
        """Write ``data`` at absolute ``offset``; it must lie inside one segment."""
        f = self.get_or_create(offset)
        pos = offset - f.start
        if pos + len(data) > f.size:
            raise ValueError(f"write of {len(data)} bytes at {offset} crosses {f.path}")
        f.write(pos, data)

    def read(self, offset: int, size: int) -> bytes:
        f = self.find(offset)
        if f is None:
            return b""
        pos = offset - f.start
        return f.buffer()[pos:pos + size]

    def flush(self, from_offset: int = 0) -> None:
        for f in self._files:
            if f.end > from_offset:
                f.flush()

    def truncate(self, offset: int) -> None:
        """Zero everything from ``offset`` on and delete later segments.

        Zeroing uses writes, never ``ftruncate``: another process may have the segment
        mapped, and shrinking a mapped file would make its reads fault.
        """
        with self._lock:
            self.refresh()
            for f in list(self._files):
                if f.start > offset:
                    f.close()
                    try:
                        os.unlink(f.path)
                    except FileNotFoundError:
                        pass
                elif offset < f.end:
                    zero_tail(f, offset - f.start)
            fsync_dir(self.directory)
            self.refresh()

    def delete_file(self, f: MappedFile) -> None:
        with self._lock:
            f.close()
            try:
                os.unlink(f.path)
            except FileNotFoundError:
                pass
            self.refresh()

    def close(self) -> None:
        with self._lock:
            for f in self._files:
                f.close()
            self._files = []
