"""ConsumeQueue: the per (topic, queue) index of CommitLog records.

Files: ``consumequeue/{topic}/{queueId}/{20-digit byte offset}``, each holding
``consume_queue_file_entries`` (300,000) units; entry ``n`` sits at byte ``n * 20``.

Unit layout (big-endian)::

    off  size  type  field
    0    8     i64   offsetPy   CommitLog offset of the record
    8    4     i32   sizePy     record size; 0 marks unwritten space
    12   8     i64   tagsCode   Java hash of the tag (0: none); deliver time for SCHEDULE_TOPIC_XXXX

The CommitLog is the only truth: a queue is derived from it and rebuilt by recovery.  A
torn or unconfirmed tail (entries past the store's confirmed offset) is invisible to readers
and is cut by recovery.  Entry ``n`` always describes the record whose QUEUEOFFSET is ``n``,
so re-dispatching a record rewrites the same bytes (dispatch is idempotent).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..formats.binary_layout import layout
from .mapped_file import MappedFileQueue, segment_name, zero_tail

ENTRY_FIELDS = (
    ("offset", ">i8"),  # offsetPy
    ("size", ">i4"),  # sizePy
    ("tags_code", ">i8"),  # tagsCode
)
ENTRY, ENTRY_SIZE, ENTRY_DTYPE = layout(ENTRY_FIELDS).exports()  # 20 bytes
#: sizePy of a filler unit: a placeholder in front of a queue that starts past entry 0.
FILLER_SIZE = 0x7FFFFFFF


def live_mask(entries: np.ndarray, commitlog_min: int | None = None) -> np.ndarray:
    """Which entries point at a record: written (size > 0), not fillers and, when
    ``commitlog_min`` is given, not below it (removed by retention)."""
    sizes = entries["size"]
    live = (sizes > 0) & (sizes != FILLER_SIZE)
    if commitlog_min is not None:
        live &= entries["offset"] >= commitlog_min
    return live


class ConsumeQueue:
    """One queue's index files.

    Parameters
    ----------
    root : str
        The store's ``consumequeue`` directory.
    topic, queue_id :
        Which queue.
    entries_per_file : int
        Units per file.
    read_only : bool
        Never change a file (a store opened read-only): a queue file of the wrong length is
        read as a zero-padded copy instead of being repaired (see :mod:`store.files.mapped_file`).
    """

    def __init__(self, root: str, topic: str, queue_id: int, entries_per_file: int, *,
                 read_only: bool = False) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.entries_per_file = entries_per_file
        self.directory = os.path.join(root, topic, str(queue_id))
        self.files = MappedFileQueue(self.directory, entries_per_file * ENTRY_SIZE, create=False,
                                     read_only=read_only, wrong_length="repair")
        # Written since the last flush.  Writes come under the store's append lock (one
        # writer at a time); the flusher's thread takes files out one by one (see flush).
        self._dirty_files: dict[int, object] = {}
        # (file start, count) of the last max_offset's answer: where its search starts next
        self._count_hint: tuple[int, int] = (-1, 0)
        # (CommitLog minimum, answer) of the last min_offset that found a live entry
        self._min_hint: tuple[int, int] | None = None

    # -- reading ----------------------------------------------------------------------------
    def _file_entries(self, index: int):
        """The segment holding entry ``index`` and the entry array view of it."""
        f = self.files.find(index * ENTRY_SIZE)
        if f is None:
            return None, None
        return f, np.frombuffer(f.buffer(), dtype=ENTRY_DTYPE)

    @staticmethod
    def _counts(buffer, i: int, limit_phys: int | None) -> bool:
        """Whether entry ``i`` of a file's ``buffer`` is written (and ends at or before
        ``limit_phys``)."""
        offset, size, _ = ENTRY.unpack_from(buffer, i * ENTRY_SIZE)
        return size > 0 and (limit_phys is None or size == FILLER_SIZE
                             or offset + size <= limit_phys)

    def _valid_count(self, entries: np.ndarray, limit_phys: int | None,
                     hint: int = 0, buffer=None) -> int:
        """How many leading entries are written (and end at or before ``limit_phys``).

        ``hint``: the count found last time, and ``buffer`` the file's bytes ``entries``
        views.  When the entry before the hint still counts and the one at it does not, the
        answer is the hint again (two reads: a queue that did not move, which is most
        queues at most calls); else a binary search."""
        n = len(entries)
        # The fast check reads entry ``hint`` only where it lies in the page of the entry
        # before it, a page written already: reading a never-written page of a sparse file
        # through a mapping allocates it on tmpfs, and on a full tmpfs that is a SIGBUS.
        if 0 < hint <= n and buffer is not None and (
                hint == n or (hint * ENTRY_SIZE + ENTRY_SIZE - 1) // mmap.PAGESIZE
                == (hint * ENTRY_SIZE - 1) // mmap.PAGESIZE):
            if self._counts(buffer, hint - 1, limit_phys) and (
                    hint == n or not self._counts(buffer, hint, limit_phys)):
                return hint
        lo, hi = 0, n
        sizes = entries["size"]
        offsets = entries["offset"]
        while lo < hi:  # entries are a written prefix: binary search its end
            mid = (lo + hi) // 2
            size = int(sizes[mid])
            ok = size > 0 and (limit_phys is None or int(offsets[mid]) + size <= limit_phys
                               or size == FILLER_SIZE)
            if ok:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def max_offset(self, limit_phys: int | None = None) -> int:
        """One past the last written entry (entries ending after ``limit_phys`` do not count)."""
        files = self.files.files or self.files.refresh()
        if not files:
            return 0
        n = self._file_count(files[-1], limit_phys)
        if n == self.entries_per_file and os.path.exists(os.path.join(
                self.directory, segment_name(files[-1].end))):
            # the last file is full and a newer one exists (made by another process)
            files = self.files.refresh()
            n = self._file_count(files[-1], limit_phys)
        for f in reversed(files):
            if f is not files[-1]:
                n = self._file_count(f, limit_phys)
            if n > 0 or f is files[0]:
                return f.start // ENTRY_SIZE + n
        return 0  # pragma: no cover

    def _file_count(self, f, limit_phys: int | None) -> int:
        """How many leading entries of file ``f`` count, searched from the last answer."""
        buffer = f.buffer()
        entries = np.frombuffer(buffer, dtype=ENTRY_DTYPE)
        start, hint = self._count_hint
        n = self._valid_count(entries, limit_phys, hint if start == f.start else 0, buffer)
        if n > 0:
            self._count_hint = (f.start, n)
        return n

    def first_index(self) -> int:
        """The index of the first entry still on disk (retention deletes whole files)."""
        files = self.files.files or self.files.refresh()
        return files[0].start // ENTRY_SIZE if files else 0

    def min_offset(self, commitlog_min: int, limit_phys: int | None = None, *,
                   max_offset: int | None = None) -> int:
        """The first entry whose record still exists (offsetPy >= ``commitlog_min``).

        Once it is a live entry, the answer stays until the CommitLog minimum moves
        (retention): it is kept for the next call with the same minimum, which then reads
        nothing (a driver asks for every queue's bounds at every micro-batch).
        ``max_offset``: :meth:`max_offset` with the same ``limit_phys``, when the caller has
        it already."""
        maxo = self.max_offset(limit_phys) if max_offset is None else max_offset
        hint = self._min_hint
        if hint is not None and hint[0] == commitlog_min and hint[1] < maxo:  # (not cut since)
            return hint[1]
        files = self.files.refresh()
        if not files:
            return 0
        found = self._first_live(files, commitlog_min, maxo)
        if found < maxo:
            self._min_hint = (commitlog_min, found)
        return found

    def _first_live(self, files, commitlog_min: int, maxo: int) -> int:
        for f in files:
            entries = np.frombuffer(f.buffer(), dtype=ENTRY_DTYPE)
            base = f.start // ENTRY_SIZE
            n = min(len(entries), maxo - base)
            if n <= 0:
                return maxo
            # fillers, blank units and entries below the CommitLog minimum are "too old"; a
            # damaged unit (a negative offset or size) is not: reading it raises
            pos, step = 0, 64  # usually the first entry: look at growing chunks
            while pos < n:
                head = entries[pos:min(n, pos + step)]
                old = ((head["size"] == FILLER_SIZE)
                       | ((head["size"] == 0) & (head["offset"] == 0))
                       | ((head["size"] > 0) & (head["offset"] >= 0)
                          & (head["offset"] < commitlog_min)))
                if not old.all():
                    return base + pos + int(np.argmin(old))
                pos, step = pos + len(head), step * 8
        return maxo

    def entries(self, start: int, end: int) -> np.ndarray:
        """Entries ``[start, end)`` as a native-endian structured array (copied)."""
        return self.stored_entries(start, end).astype(ENTRY_DTYPE.newbyteorder("="))

    def stored_entries(self, start: int, end: int) -> np.ndarray:
        """Entries ``[start, end)`` as stored (:data:`ENTRY_DTYPE`, big-endian): a view of the
        file when one file holds them, else a copy; fewer past the written files."""
        parts = []
        i = start
        while i < end:
            f, arr = self._file_entries(i)
            if f is None:
                break
            base = f.start // ENTRY_SIZE
            j = min(end, base + len(arr))
            parts.append(arr[i - base:j - base])
            i = j
        if not parts:
            return np.empty(0, dtype=ENTRY_DTYPE)
        return np.concatenate(parts, dtype=ENTRY_DTYPE) if len(parts) > 1 else parts[0]

    def entry(self, index: int) -> tuple[int, int, int] | None:
        """Entry ``index`` as ``(commitlog_offset, size, tags_code)``, or None past the files."""
        f, arr = self._file_entries(index)
        if f is None:
            return None
        e = arr[index - f.start // ENTRY_SIZE]
        return int(e["offset"]), int(e["size"]), int(e["tags_code"])

    # -- writing ----------------------------------------------------------------------------
    def put(self, first_index: int, offsets, sizes, tags_codes) -> None:
        """Write entries for queue offsets ``first_index, first_index + 1, ...``."""
        n = len(offsets)
        if n == 0:
            return
        if n == 1:
            self.put_one(first_index, int(offsets[0]), int(sizes[0]), int(tags_codes[0]))
            return
        if n <= 8:  # a few entries: struct is cheaper than building an array
            data = b"".join(map(ENTRY.pack, map(int, offsets), map(int, sizes),
                                map(int, tags_codes)))
        else:
            arr = np.empty(n, dtype=ENTRY_DTYPE)
            arr["offset"] = offsets
            arr["size"] = sizes
            arr["tags_code"] = tags_codes
            data = memoryview(arr).cast("B")
        self._write_units(first_index, n, data)

    def put_units(self, first_index: int, units: np.ndarray) -> None:
        """Write entries already laid out as units (an :data:`ENTRY_DTYPE` array) for queue
        offsets ``first_index, first_index + 1, ...`` (what :meth:`put` writes, no copy)."""
        if len(units):
            self._write_units(first_index, len(units),
                              memoryview(np.ascontiguousarray(units)).cast("B"))

    def _write_units(self, first_index: int, n: int, data) -> None:
        """Write ``n`` units' bytes ``data`` from queue offset ``first_index`` on."""
        hint = self._min_hint
        if hint is not None and first_index < hint[1]:  # a rebuild rewrites the head
            self._min_hint = None
        i = 0
        while i < n:
            pos = (first_index + i) * ENTRY_SIZE
            f = self.files.find(pos, refresh=False)
            if f is None:
                os.makedirs(self.directory, exist_ok=True)
                f = self.files.get_or_create(pos)
            room = (f.end - pos) // ENTRY_SIZE
            k = min(room, n - i)
            f.write(pos - f.start, data[i * ENTRY_SIZE:(i + k) * ENTRY_SIZE])
            self._dirty_files[f.start] = f
            i += k

    def put_one(self, index: int, offset: int, size: int, tags_code: int) -> None:
        """Write the one entry of queue offset ``index`` (what :meth:`put` does for one)."""
        pos = index * ENTRY_SIZE
        data = ENTRY.pack(offset, size, tags_code)
        hint = self._min_hint
        if hint is not None and index < hint[1]:  # a rebuild rewrites the head
            self._min_hint = None
        try:
            f = self.files.write(pos, data, mapped=True)
        except FileNotFoundError:  # the queue's directory is not there yet
            os.makedirs(self.directory, exist_ok=True)
            f = self.files.write(pos, data, mapped=True)
        self._dirty_files[f.start] = f  # after the write: a flush that takes it covers it

    def fill_to(self, index: int) -> None:
        """Give a queue that starts at ``index`` > 0 filler units (0, FILLER_SIZE, 0) in front."""
        start = self.max_offset()
        if index > start:
            n = index - start
            self.put(start, np.zeros(n, np.int64), np.full(n, FILLER_SIZE, np.int32),
                     np.zeros(n, np.int64))

    def _forget_hints(self) -> None:
        """Entries were removed here: the next answers are searched afresh."""
        self._count_hint = (-1, 0)
        self._min_hint = None

    def truncate_physical(self, process_offset: int) -> None:
        """Drop every entry whose record starts at or after ``process_offset``.

        Files are zeroed rather than deleted (RocketMQ deletes a file whose first entry is
        past the cut): a reader in another process may have mapped it, and a file deleted
        and created again under the same name would leave that reader on the old copy.
        """
        self._forget_hints()
        files = self.files.refresh()
        for f in reversed(files):
            entries = np.frombuffer(f.buffer(), dtype=ENTRY_DTYPE)
            n = self._valid_count(entries, None)
            if n == 0:  # nothing written here (or already cut): look at the file before
                continue
            offs = entries["offset"][:n].astype(np.int64)
            # the first entry at or past the cut, in queue order: entries are in CommitLog
            # order (fillers, offset 0, first) except those of an index commit, which point
            # back at records staged before (store.core.index_commit); any entry after one
            # at or past the cut was written after it and goes too
            past = offs >= process_offset
            keep = int(np.argmax(past)) if past.any() else n
            if keep < n:
                zero_tail(f, keep * ENTRY_SIZE)
            if keep > 0:
                break

    def flush(self) -> None:
        """Make every entry written so far durable (all files written since the last flush)."""
        # Each file is taken out of the dirty set one at a time (one atomic dict operation),
        # so a writer marking a file meanwhile is never lost: its mark is taken now or stays
        # for the next flush.  Writers mark a file after writing to it.
        dirty = self._dirty_files
        while dirty:
            try:
                _, f = dirty.popitem()
            except KeyError:
                break
            try:
                f.flush()
            except (OSError, TypeError):  # deleted by retention or closed meanwhile
                pass
        self.files.sync_directory()  # files created since the last flush

    def delete_expired(self, commitlog_min: int) -> int:
        """Delete files (never the last) whose last entry's record is gone; return how many."""
        self._forget_hints()
        files = self.files.refresh()
        deleted = 0
        for f in files[:-1]:
            entries = np.frombuffer(f.buffer(), dtype=ENTRY_DTYPE)
            last = entries[-1]
            if int(last["size"]) > 0 and int(last["offset"]) + int(last["size"]) <= commitlog_min:
                self.files.delete_file(f)
                deleted += 1
            else:
                break
        return deleted

    def close(self) -> None:
        self.files.close()

