"""CommitLog: the append-only log of every record, in fixed-size segment files.

Files: ``commitlog/{20-digit start offset}``, each ``commitlog_file_size_bytes`` long
(1 GiB by default), zero-filled.  Record layout: :mod:`store.formats.record_codec`.  A record never spans
two files: when it does not fit with 8 bytes to spare, an 8-byte BLANK marks the file end and
the record starts the next file.  Recovery stops at the first invalid record and zeroes the
tail from there (:meth:`CommitLog.truncate`).
"""

from __future__ import annotations

import os
import struct
from typing import Iterator

import numpy as np

from ..formats.record_codec import (
    BLANK,
    FIELD_OFFSET,
    Record,
    RecordCheck,
    check_record,
    decode_record,
    encode_blank,
)
from ..base.errors import CorruptRecordError
from .mapped_file import MappedFileQueue
from ..kernels.segment_walk import STOP_BLANK, STOP_INVALID, first_record_start, walk_records

_I64 = struct.Struct(">q")
#: Writes up to this size (single records) go through the segment's writable mapping.
MAPPED_WRITE_MAX = 4096


class CommitLog:
    """The segment files of the CommitLog and record-level reads."""

    def __init__(self, directory: str, file_size: int, *, read_only: bool = False) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files = MappedFileQueue(directory, file_size, read_only=read_only,
                                     wrong_length="repair")
        self._valid_end: tuple[tuple, int] | None = None

    # -- placement --------------------------------------------------------------------------
    def place(self, offset: int, size: int) -> tuple[int, bytes | None]:
        """Where a record of ``size`` bytes goes when the log ends at ``offset``.

        Returns the record's offset and the blank to write at ``offset`` first (or ``None``).
        """
        remaining = self.file_size - offset % self.file_size
        if size + BLANK.size > remaining:
            if size + BLANK.size > self.file_size:
                raise ValueError(
                    f"record of {size} bytes cannot fit a {self.file_size}-byte segment")
            return offset + remaining, encode_blank(remaining)
        return offset, None

    def write(self, offset: int, data: bytes) -> None:
        """Copy ``data`` to absolute ``offset`` (inside one segment); no flush."""
        # a single record is copied through the segment's writable mapping (no system call)
        self.files.write(offset, data, mapped=len(data) <= MAPPED_WRITE_MAX)

    # -- reading ----------------------------------------------------------------------------
    def min_offset(self) -> int:
        """The start of the oldest segment still on disk (0 for an empty log)."""
        return self.files.min_offset()

    def buffer_at(self, offset: int):
        """The mapping of the segment holding ``offset`` and ``offset``'s position in it."""
        f = self.files.find(offset)
        if f is None:
            raise CorruptRecordError(self.directory, offset,
                                     "no CommitLog segment holds this offset")
        return f.buffer(), offset - f.start, f

    def read_record(self, offset: int) -> Record:
        """Decode the record at ``offset``; CorruptRecordError if it fails the checks."""
        buf, pos, f = self.buffer_at(offset)
        return decode_record(buf, pos, file=f.path, base_offset=f.start)

    def store_timestamp(self, offset: int) -> int:
        """The store timestamp of the record at ``offset``, read without decoding the rest."""
        buf, pos, _ = self.buffer_at(offset)
        return _I64.unpack_from(buf, pos + FIELD_OFFSET["store_timestamp"])[0]

    def scan(self, start: int, *, check_crc: bool = True) -> Iterator[tuple[int, int]]:
        """Yield ``(offset, size)`` of valid records from ``start``, following blanks.

        Stops at the first invalid record; :attr:`scan_end` then holds where the valid log ends.
        """
        for f, positions, sizes in self.scan_batches(start, check_crc=check_crc):
            yield from zip((positions + f.start).tolist(), sizes.tolist())

    def scan_batches(self, start: int, *, check_crc: bool = True, max_records: int = 1 << 18,
                     resync_until: int | None = None) -> Iterator[tuple[object, np.ndarray,
                                                                        np.ndarray]]:
        """Yield ``(segment, positions, sizes)``: runs of valid records from ``start`` (positions
        relative to the segment), validated by the compiled walk
        (:func:`~store.kernels.segment_walk.walk_records`: the checks of
        :func:`~store.formats.record_codec.check_record`), following blanks into the next segment.

        Stops at the first invalid record that no valid segment follows; :attr:`scan_end`
        holds where the valid records yielded so far end (the valid log's end once the scan is
        exhausted).  An invalid record followed by a segment that begins with a valid record
        is damage, not a torn tail: the rest of its segment is skipped (the range added to
        :attr:`scan_skipped`) and the scan goes on there, so no repair cuts valid records.
        Below ``resync_until`` (where the log is known to hold records: the confirmed end),
        damage inside a segment is skipped too: the scan goes on at the next valid record
        (found by its magic code, then every record check, CRC included).
        """
        def walk(raw, pos, limit):
            positions, sizes, end, stop = walk_records(raw, pos, limit, check_crc=check_crc,
                                                       max_records=max_records)
            return (positions, sizes), len(positions), end, stop

        for f, (positions, sizes) in self.scan_runs(start, walk, resync_until=resync_until):
            yield f, positions, sizes

    def scan_runs(self, start: int, walk, *, resync_until: int | None = None,
                  populate_bytes: int = 0) -> Iterator[tuple[object, object]]:
        """:meth:`scan_batches` with another walk: yield ``(segment, run)`` for each run that
        ``walk(raw, pos, limit) -> (run, count, end, stop)`` returns with records in it
        (``raw``: the segment as uint8; ``end`` and ``stop`` as
        :func:`~store.kernels.segment_walk.walk_records` returns them).  The walk must stop where
        ``walk_records`` stops (e.g. :func:`~store.kernels.recovery_scan.index_records` with its CRCs
        checked).  With ``populate_bytes``, the pages of that many bytes from where each walk
        begins are mapped first (:meth:`~store.files.mapped_file.MappedFile.populate`)."""
        self.scan_end = start
        self.scan_skipped: list[tuple[int, int]] = []
        offset = start
        while True:
            f = self.files.find(offset)
            if f is None:
                return
            raw = np.frombuffer(f.buffer(), dtype=np.uint8)
            pos = offset - f.start
            while True:
                if populate_bytes:
                    f.populate(pos, pos + populate_bytes)
                run, count, end, stop = walk(raw, pos, f.size)
                self.scan_end = f.start + end
                if count:
                    yield f, run
                pos = end
                if stop == STOP_BLANK:
                    offset = f.end
                    self.scan_end = offset  # a blank is a valid end: the log resumes next file
                    break
                if stop == STOP_INVALID and resync_until is not None \
                        and f.start + end < resync_until:
                    found = self._next_valid_record(f, end, min(f.size, resync_until - f.start))
                    if found is not None:
                        self.scan_skipped.append((f.start + end, f.start + found))
                        pos = found
                        continue
                if stop == STOP_INVALID:
                    resume = self._next_valid_segment(f)
                    if resume is None:  # the torn (or zeroed) tail: the log ends here
                        return
                    self.scan_skipped.append((f.start + end, f.end))
                    offset = self.scan_end = resume
                    break

    def _next_valid_record(self, f, pos: int, stop: int) -> int | None:
        """The position of the first valid record of ``f`` after ``pos`` that starts before
        ``stop`` (``None``: none)."""
        buf = f.buffer()
        return first_record_start(np.frombuffer(buf, dtype=np.uint8), pos + 1, stop, f.size,
                                  lambda p: check_record(buf, p, f.size) >= 0)

    def _next_valid_segment(self, f) -> int | None:
        """The start of the first segment after ``f`` that begins with a valid record: the
        scan goes on there past damage in ``f`` (``None``: nothing valid follows ``f``)."""
        for g in self.files.files:
            if g.start > f.start and check_record(g.buffer(), 0, g.size) >= 0:
                return g.start
        return None

    def valid_end(self) -> int:
        """Where the valid log ends, found by validating records (no checkpoint needed).

        As RocketMQ's recovery: from the newest segment whose first record is valid (or a
        blank), scan forward to the first invalid record.  Cached while the newest segment is
        unchanged (its name, size and modification time).
        """
        files = self.files.refresh()
        if not files:
            return 0
        try:
            st = os.stat(files[-1].path)
        except FileNotFoundError:
            return self.valid_end() if self.files.refresh() else 0
        key = (files[-1].start, len(files), st.st_mtime_ns, st.st_size)
        if self._valid_end is not None and self._valid_end[0] == key:
            return self._valid_end[1]
        start = files[0].start
        for f in reversed(files):
            if check_record(f.buffer(), 0, f.size, check_crc=False) != RecordCheck.INVALID:
                start = f.start
                break
        for _ in self.scan_batches(start):
            pass
        self._valid_end = (key, self.scan_end)
        return self.scan_end

    def truncate(self, offset: int) -> None:
        """Zero the log from ``offset`` on and delete later segments."""
        self.files.truncate(offset)

    def flush(self, from_offset: int = 0) -> None:
        self.files.flush(from_offset)

    def segment_paths(self) -> list[str]:
        """The segment files on disk now, oldest first."""
        return [f.path for f in self.files.refresh()]

    def close(self) -> None:
        self.files.close()
