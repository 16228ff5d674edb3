"""Gathering many CommitLog records at once, at arbitrary offsets (the vectorised record reader).

:func:`gather_segments` is the one gather of headers and field positions: per segment, one
NumPy fancy index reads every header and the layout checks drop what does not fit.  The
transaction index reads half and op records through it (:mod:`store.transaction.half_records`).

:class:`SourceRecords`, used by the restore of delayed messages, builds on it: bodies and
properties of one segment's records as byte slices of its mapping, ready for the property
kernels (:mod:`store.kernels.property_scan`) and the record kernel.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from ..formats.record_codec import (FIXED_SIZE, HEADER_DTYPE, HEADER_SIZE, MESSAGE_MAGIC_CODE_V1,
                                    gather_headers)
from .commit_log import CommitLog
from ..formats.byte_columns import ByteSlices


class SegmentRecords(NamedTuple):
    """The valid records of one CommitLog segment among the offsets asked for.

    ``sel`` indexes the offsets given to :func:`gather_segments`; positions are relative to
    the segment (``buffer`` is its mapping, ``raw`` the same bytes as ``uint8``).
    """

    sel: np.ndarray
    buffer: object
    raw: np.ndarray
    headers: np.ndarray
    body_start: np.ndarray
    body_length: np.ndarray
    properties_start: np.ndarray
    properties_length: np.ndarray


def gather_segments(log: CommitLog, offsets: np.ndarray) -> Iterator[SegmentRecords]:
    """Read the headers and field positions of the records at ``offsets``, per segment.

    One NumPy gather per segment reads every header; records whose magic or length fields
    do not fit the layout (and records of removed segments) are left out.
    """
    size = log.file_size
    seg = offsets - offsets % size
    for start in np.unique(seg).tolist():
        sel = np.flatnonzero(seg == start)
        f = log.files.find(int(start))
        if f is None:
            continue  # removed by retention
        mm = f.buffer()
        raw = np.frombuffer(mm, dtype=np.uint8)
        rel = offsets[sel] - start
        inside = rel + HEADER_SIZE <= size
        if not inside.all():
            sel, rel = sel[inside], rel[inside]
        h = gather_headers(mm, size, rel)
        body = h["body_length"].astype(np.int64)
        total = h["total_size"].astype(np.int64)
        good = ((h["magic"] == MESSAGE_MAGIC_CODE_V1) & (body >= 0)
                & (total >= FIXED_SIZE + body) & (rel + total <= size))
        if not good.all():
            sel, rel, h, body, total = sel[good], rel[good], h[good], body[good], total[good]
        tpos = rel + HEADER_SIZE + body
        tl = raw[tpos].astype(np.int64)
        ppos = tpos + 1 + tl
        pl = (raw[ppos].astype(np.int64) << 8) | raw[ppos + 1]
        fits = FIXED_SIZE + body + tl + pl == total
        if fits.all():
            yield SegmentRecords(sel, mm, raw, h, rel + HEADER_SIZE, body, ppos + 2, pl)
        else:
            yield SegmentRecords(sel[fits], mm, raw, h[fits], rel[fits] + HEADER_SIZE,
                                 body[fits], ppos[fits] + 2, pl[fits])


class SourceRecords:
    """Headers, bodies and properties of source records of **one** CommitLog segment (in the
    order given), as columns.

    ``headers`` and ``ok`` (False: missing or invalid record, whose rows are empty) have a
    row per offset; ``bodies`` and ``properties`` read the records in place
    (:class:`ByteSlices` of the segment mapping, no copy).  The caller splits its offsets by
    segment (the restore of delayed messages does).
    """

    def __init__(self, log: CommitLog, offsets: np.ndarray) -> None:
        n = len(offsets)
        self.headers = np.zeros(n, dtype=HEADER_DTYPE)
        self.ok = np.zeros(n, dtype=bool)
        segments = list(gather_segments(log, offsets))
        if len(segments) > 1:
            raise ValueError("SourceRecords reads one CommitLog segment; split the offsets")
        if not segments:  # the segment is gone (retention): every row missing
            empty = ByteSlices(np.zeros(1, np.uint8), np.zeros(n, np.int64),
                               np.zeros(n, np.int64))
            self.bodies = self.properties = empty
            return
        seg = segments[0]
        if len(seg.sel) == n:  # every record valid (sel is then 0 .. n-1)
            self.headers = seg.headers
            self.ok[:] = True
        else:
            self.headers[seg.sel] = seg.headers
            self.ok[seg.sel] = True
        self.bodies = _in_place(seg.raw, n, seg.sel, seg.body_start, seg.body_length)
        self.properties = _in_place(seg.raw, n, seg.sel, seg.properties_start,
                                    seg.properties_length)


def _in_place(raw: np.ndarray, n: int, sel: np.ndarray, start: np.ndarray,
              length: np.ndarray) -> ByteSlices:
    """Rows ``sel`` at ``raw[start:start + length]``, the other rows empty."""
    if len(sel) == n:
        return ByteSlices(raw, start, start + length)
    starts = np.zeros(n, dtype=np.int64)
    starts[sel] = start
    ends = starts.copy()
    ends[sel] += length
    return ByteSlices(raw, starts, ends)
