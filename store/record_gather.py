"""Gathering many CommitLog records at once, at arbitrary offsets (the vectorised record reader).

:func:`gather_segments` is the one gather of headers and field positions: per segment, one
NumPy fancy index reads every header and the layout checks drop what does not fit.  The
transaction index reads half and op records through it (:mod:`store.transaction.half_records`).

:class:`SourceRecords`, used by the restore of delayed messages, builds on it: bodies and
properties as ``bytes`` slices of the segment mapping, and all properties joined into one byte
array in which :meth:`SourceRecords.find` locates a property of every record at once (pairs
start a record's properties or follow a 0x02 separator, names never contain 0x01 or 0x02).
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from .codec import FIXED_SIZE, HEADER_DTYPE, HEADER_SIZE, MESSAGE_MAGIC_CODE_V1, gather_headers
from .commit_log import CommitLog

_SEP = 2  # the byte after each name-value pair


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
        sel, rel = sel[inside], rel[inside]
        h = gather_headers(mm, size, rel)
        body = h["body_length"].astype(np.int64)
        total = h["total_size"].astype(np.int64)
        good = ((h["magic"] == MESSAGE_MAGIC_CODE_V1) & (body >= 0)
                & (total >= FIXED_SIZE + body) & (rel + total <= size))
        sel, rel, h, body, total = sel[good], rel[good], h[good], body[good], total[good]
        tpos = rel + HEADER_SIZE + body
        tl = raw[tpos].astype(np.int64)
        ppos = tpos + 1 + tl
        pl = (raw[ppos].astype(np.int64) << 8) | raw[ppos + 1]
        fits = FIXED_SIZE + body + tl + pl == total
        yield SegmentRecords(sel[fits], mm, raw, h[fits], rel[fits] + HEADER_SIZE, body[fits],
                             ppos[fits] + 2, pl[fits])


class SourceRecords:
    """Headers, bodies and properties of the source records (in the order given)."""

    def __init__(self, log: CommitLog, offsets: np.ndarray) -> None:
        n = len(offsets)
        self.headers = np.zeros(n, dtype=HEADER_DTYPE)
        self.ok = np.zeros(n, dtype=bool)
        self.props_len = np.zeros(n, dtype=np.int64)
        self.bodies: list = [b""] * n
        self.raw_props: list = [b""] * n
        for sel, mm, _raw, h, b0, body, p0, pl in gather_segments(log, offsets):
            self.headers[sel] = h
            self.ok[sel] = True
            self.props_len[sel] = pl
            bodies = list(map(mm.__getitem__, map(slice, b0.tolist(), (b0 + body).tolist())))
            props = list(map(mm.__getitem__, map(slice, p0.tolist(), (p0 + pl).tolist())))
            if len(sel) == n:
                self.bodies, self.raw_props = bodies, props
            else:
                for i, b, p in zip(sel.tolist(), bodies, props):
                    self.bodies[i] = b
                    self.raw_props[i] = p
        # all properties in one array, record i at [starts[i], ends[i])
        self.ends = np.cumsum(self.props_len)
        self.starts = self.ends - self.props_len
        self.blob = b"".join(self.raw_props)
        self.props = np.frombuffer(self.blob, dtype=np.uint8)
        self.seps = np.flatnonzero(self.props == _SEP)
        # a pair starts a record's properties or follows a separator
        is_start = np.zeros(len(self.props) + 1, dtype=bool)
        is_start[self.starts[self.props_len > 0]] = True
        is_start[self.seps + 1] = True
        self.pair_starts = np.flatnonzero(is_start[:len(self.props)])
        self._words: np.ndarray | None = None  # 8 bytes from each position (for find)

    def find(self, key: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The last non-empty value of property ``key`` per record: ``(found, start, end)``.

        Positions index :attr:`props`.
        """
        n = len(self.starts)
        found = np.zeros(n, dtype=bool)
        vs = np.zeros(n, dtype=np.int64)
        ve = np.zeros(n, dtype=np.int64)
        pattern = key + b"\x01"
        props = self.props
        c = self.pair_starts[self.pair_starts + len(pattern) < len(props)]
        if len(pattern) >= 8 and len(c):
            # the first 8 bytes of every pair at once, then the rest on the few that match
            if self._words is None:
                self._words = np.ndarray(shape=(len(props) - 7,), dtype="<u8", buffer=props,
                                         strides=(1,))
            c = c[self._words[c] == int.from_bytes(pattern[:8], "little")]
            rest = enumerate(pattern[8:], 8)
        else:
            rest = enumerate(pattern)
        for j, byte in rest:
            if not len(c):
                return found, vs, ve
            c = c[props[c + j] == byte]
        if not len(c) or not len(self.seps):
            return found, vs, ve
        rec = np.searchsorted(self.ends, c, side="right")
        v0 = c + len(pattern)
        idx = np.searchsorted(self.seps, v0)
        inside = idx < len(self.seps)
        c, rec, v0, idx = c[inside], rec[inside], v0[inside], idx[inside]
        v1 = self.seps[idx]
        good = (v1 > v0) & (v1 < self.ends[rec])
        rec, v0, v1 = rec[good], v0[good], v1[good]
        last = np.concatenate((rec[1:] != rec[:-1], [True])) if len(rec) else rec.astype(bool)
        found[rec[last]] = True
        vs[rec[last]] = v0[last]
        ve[rec[last]] = v1[last]
        return found, vs, ve

    def matrix(self, vs: np.ndarray, ve: np.ndarray) -> np.ndarray:
        """Values ``props[vs:ve]`` as rows of a zero-padded ``uint8`` matrix."""
        width = int((ve - vs).max()) if len(vs) else 0
        cols = np.arange(max(width, 1))
        idx = vs[:, None] + cols
        inside = cols < (ve - vs)[:, None]
        return np.where(inside, self.props[np.minimum(idx, max(len(self.props) - 1, 0))], 0
                        ).astype(np.uint8)


def unique_values(src: SourceRecords, sel: np.ndarray, vs: np.ndarray, ve: np.ndarray
                   ) -> tuple[list[bytes], np.ndarray]:
    """Distinct values of the records ``sel`` and each record's index into them."""
    if not len(sel):
        return [], np.empty(0, np.int64)
    m = np.ascontiguousarray(src.matrix(vs[sel], ve[sel]))
    rows = m.view(np.dtype((np.void, m.shape[1]))).ravel()
    uniq, inverse = np.unique(rows, return_inverse=True)
    return [bytes(u).rstrip(b"\x00") for u in uniq.tolist()], inverse.ravel()


def parse_ints(src: SourceRecords, sel: np.ndarray, vs: np.ndarray, ve: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Decimal values of short fields: ``(value, ok)`` per record of ``sel``."""
    m = src.matrix(vs[sel], ve[sel]).astype(np.int64)
    lengths = ve[sel] - vs[sel]
    digits = m - 48
    cols = np.arange(m.shape[1])
    inside = cols < lengths[:, None]
    ok = (((digits >= 0) & (digits <= 9)) | ~inside).all(axis=1) & (lengths > 0) & (lengths <= 18)
    power = np.where(inside, lengths[:, None] - 1 - cols, 0)
    value = (np.where(inside, digits, 0) * (10 ** np.clip(power, 0, 18))).sum(axis=1)
    return value, ok


def as_bytes(values: np.ndarray) -> list[bytes]:
    """Decimal ASCII of each value."""
    if len(values) > 1 and values[0] == values[-1] and (values == values[0]).all():
        return [str(int(values[0])).encode("ascii")] * len(values)
    return list(map(str.encode, map(str, values.tolist())))
