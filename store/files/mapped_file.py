"""Fixed-size segment files named by their 20-digit start offset (RocketMQ's MappedFileQueue).

Used by the CommitLog, every ConsumeQueue and the TimerLog.  A segment is created at its full
size (sparse, zero-filled), written with ``os.pwrite`` (small writes into blocks this
process has reserved go through a writable shared mapping instead: no system call) and read
through a shared read-only ``mmap``, so readers in other processes see bytes as soon as they
are written and never take a lock.  The segment holding offset ``o`` starts at
``o - o % file_size``.

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

from ..base.errors import CorruptRecordError, DiskFullError
from .fileio import allocate, disk_full, fsync_dir
from .segment_bytes import padded_copy, repair_in_place, zero_tail

NAME_DIGITS = 20
log = logging.getLogger("store")


def segment_name(start: int) -> str:
    """A segment's file name: its start offset as 20 zero-padded digits."""
    return f"{start:0{NAME_DIGITS}d}"


#: ``madvise`` advice that maps a range's pages readable at once (Linux 5.14+).
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


def release_pages(mappings) -> None:
    """Drop this process's resident pages of each of ``mappings`` (``mmap`` objects; ``None``
    passed over): the data stays in the file and the page cache.  A mapping that cannot
    (closed, no ``madvise`` here) is passed over too."""
    for m in mappings:
        if m is None:
            continue
        try:
            m.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError, AttributeError):
            pass


class MappedFile:
    """One segment: ``path`` holds bytes ``[start, start + size)`` of the log."""

    __slots__ = ("path", "start", "size", "length", "_fd", "_map", "_lock", "_allocated",
                 "_reserved", "_wmap", "_wbase", "_wlo", "_whi")

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
        self._allocated = (0, 0)  # a range this process reserved (``posix_fallocate``)
        self._reserved = True  # every reservation really reserved blocks (no mapped fault)
        #: the mapping :meth:`write_mapped` uses (from ``_wbase``; ``[_wlo, _whi)`` reserved)
        self._wmap: mmap.mmap | None = None
        self._wbase = self._wlo = self._whi = 0

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
                    self._map = padded_copy(self.path, self.size)
                elif self._map is None:
                    with open(self.path, "rb") as fh:
                        self._map = mmap.mmap(fh.fileno(), self.size, access=mmap.ACCESS_READ)
                m = self._map
        return m

    def populate(self, start: int, end: int) -> None:
        """Map the pages of ``[start, end)`` of :meth:`buffer` ahead of a scan (0.02 s/GiB
        against 0.07-0.4 s of faults here)."""
        m, lo, hi = self.buffer(), start - start % mmap.PAGESIZE, min(end, self.size)
        if isinstance(m, mmap.mmap) and hi > lo:
            try:
                m.madvise(MADV_POPULATE_READ, lo, hi - lo)
            except (OSError, ValueError, AttributeError):
                pass  # an older kernel, or no madvise: the walk faults the pages in

    def write(self, position: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``position`` (relative to the segment start)."""
        # blocks reserved first (ALLOCATE_AHEAD at a time): on a full disk nothing is written
        # (no torn record, no hole a mapping would fault on) and the error is typed
        end = position + len(data)
        lo, hi = self._allocated
        if not lo <= position <= end <= hi:
            step = min(ALLOCATE_AHEAD, self.size // 16)
            ahead = min(self.size, max(end, position + step))
            try:
                reserved = allocate(self.fd(), ahead - position, self.path, offset=position)
            except DiskFullError:
                ahead = end  # no room to reserve ahead: this write's blocks alone, or fail
                reserved = allocate(self.fd(), len(data), self.path, offset=position)
            self._reserved = self._reserved and reserved
            self._allocated = (lo, ahead) if lo <= position <= hi else (position, ahead)
        try:
            n = os.pwrite(self.fd(), data, position)
        except OSError as exc:
            raise disk_full(exc, self.path, f"a write of {len(data)} bytes") from None
        if n != len(data):  # a short write means a full disk
            raise DiskFullError(errno.ENOSPC, f"{self.path}: short write, {n} of {len(data)} "
                                "bytes; the disk is full; allowed: free some space")

    def write_mapped(self, position: int, data: bytes) -> None:
        """Write a few bytes at ``position`` through a writable shared mapping (no system
        call), only where this process reserved the blocks (a hole of a mapping dies of SIGBUS
        on a full disk); other writes, and those crossing the window, go through :meth:`write`.
        Both share the page cache: readers and ``fdatasync`` see no difference."""
        end = position + len(data)
        if self._wlo <= position and end <= self._whi:
            base = self._wbase
            self._wmap[position - base:end - base] = data
            return
        lo, hi = self._allocated
        if not (self._reserved and lo <= position and end <= hi):
            self.write(position, data)  # reserves blocks ahead: the next writes map
            return
        base = position - position % WRITE_WINDOW
        if end > base + WRITE_WINDOW:  # crosses the window: not worth a second mapping
            self.write(position, data)
            return
        if self._wmap is None or self._wbase != base:
            self._map_window(base)
        # writable: the reserved part of the window (blocks once reserved stay reserved)
        self._wlo, self._whi = max(base, lo), min(base + len(self._wmap), hi)
        self._wmap[position - base:end - base] = data

    def _map_window(self, base: int) -> None:
        fd = self.fd()  # (takes the lock itself when the file is not open yet)
        with self._lock:
            self._close_window()
            length = min(WRITE_WINDOW, self.size - base)
            self._wmap = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE, offset=base)
            self._wbase = base

    def _close_window(self) -> None:
        self._wlo = self._whi = self._wbase = 0
        if self._wmap is not None:
            try:
                self._wmap.close()
            except BufferError:  # pragma: no cover - nobody takes views of it
                pass
            self._wmap = None

    def flush(self) -> None:
        os.fdatasync(self.fd())

    def close(self) -> None:
        with self._lock:
            self._close_window()
            if self._map is not None:
                try:
                    self._map.close()
                except BufferError:  # a caller still holds a view; the GC closes it later
                    pass
                self._map = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


#: Size of the writable mapping :meth:`MappedFile.write_mapped` keeps (a multiple of the
#: mmap offset granularity).
WRITE_WINDOW = 4 * 1024 * 1024
#: Most bytes :meth:`MappedFile.write` reserves past a write that needs new blocks (a 16th
#: of the file at most, so that thousands of queue files do not reserve gigabytes).
ALLOCATE_AHEAD = 4 * 1024 * 1024


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
        #: the segment the last write went to, valid while ``_files`` is the same list
        self._tail: MappedFile | None = None
        self._tail_files: list[MappedFile] | None = None
        self._directory_unsynced = False  # a segment was made since the last sync
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
            aside = repair_in_place(path, self.file_size)
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

    def release_pages(self) -> None:
        """Drop this process's resident pages of every segment's mapping (see
        :func:`release_pages`)."""
        release_pages([getattr(f, "_map", None) for f in self._files])

    def min_offset(self) -> int:
        """The start of the first segment (0 when there is none)."""
        files = self._files
        return files[0].start if files else 0

    def last_file(self) -> MappedFile | None:
        """The newest segment, or None."""
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
        """The segment holding ``offset``, created full-size (via a temporary name) if missing."""
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
            self._directory_unsynced = True  # synced by the next flush, after its bytes
            self.refresh()
            f = self.find(start, refresh=False)
            assert f is not None
            return f

    def write(self, offset: int, data: bytes, *, mapped: bool = False) -> MappedFile:
        """Write ``data`` at absolute ``offset``; it must lie inside one segment.

        ``mapped``: a small write, through the segment's writable mapping where it can
        (:meth:`MappedFile.write_mapped`).  Returns the segment written.
        """
        f = self._tail
        if f is None or self._tail_files is not self._files or not (
                f.start <= offset < f.start + f.size):
            f = self.get_or_create(offset)
            self._tail, self._tail_files = f, self._files
        pos = offset - f.start
        if pos + len(data) > f.size:
            raise ValueError(f"write of {len(data)} bytes at {offset} crosses {f.path}")
        if mapped:
            f.write_mapped(pos, data)
        else:
            f.write(pos, data)
        return f

    def flush(self, from_offset: int = 0) -> None:
        for f in self._files:
            if f.end > from_offset:
                try:
                    f.flush()
                except FileNotFoundError:
                    # retention deleted it meanwhile (the flush thread takes no lock; the
                    # lock waits for a deletion under way to finish): a deleted segment
                    # needs no flush; any other missing one is an error
                    with self._lock:
                        if f in self._files:
                            raise
        self.sync_directory()

    def sync_directory(self) -> None:
        """Make the names of segments created since the last call durable.  Creating a
        segment leaves that to the next flush (a directory ``fsync`` took 6-13 ms here)."""
        if self._directory_unsynced:
            self._directory_unsynced = False  # first: a segment made meanwhile sets it again
            fsync_dir(self.directory)

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
        """Unmap and delete one segment (retention); a file already gone is not an error."""
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
