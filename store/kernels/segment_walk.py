"""A compiled walk over the records of a CommitLog segment: the vectorised recovery scan.

:func:`walk_records` validates records one after another from a position of a mapped segment
with exactly the checks of :func:`store.formats.record_codec.check_record` (magic, sizes adding up, the
topic, the last byte, and the body CRC when asked), in a numba loop instead of Python:
recovery and the queue rebuild scan a GiB of CommitLog in about a second instead of minutes.
It stops at the first record that fails a check, at an end-of-segment blank, or when the
output arrays are full; the caller then decodes the valid records' headers, topics and
properties as whole columns (:mod:`store.core.recovery`).  :func:`body_crcs` computes the
body CRCs of many records at once (reads with ``verify_crc``).

Record layout (big-endian, :mod:`store.formats.record_codec`)::

    offset              field
    0                   TOTALSIZE (i32), MAGICCODE (i32), BODYCRC (i32), ... (HEADER_SIZE)
    HEADER_SIZE - 4     BODYLENGTH (i32), then the body
    ...                 TOPICLENGTH (1 byte), TOPIC, PROPERTIESLENGTH (i16), PROPERTIES
"""

from __future__ import annotations

import numpy as np

from ..formats.record_codec import (
    BLANK_MAGIC_CODE,
    FIELD_OFFSET,
    FIXED_SIZE,
    HEADER_SIZE,
    MESSAGE_MAGIC_CODE_V1,
)
from ..base.crc import crc_function
from ..base.jit import kernel_set
from .record_assembly import crc32_call

#: How :func:`walk_records` stopped.
STOP_INVALID, STOP_BLANK, STOP_FULL = 0, 1, 2

_crc32 = crc32_call


def _i32(buf, p):
    v = (np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16) | (np.int64(buf[p + 2]) << 8) \
        | np.int64(buf[p + 3])
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


def _record_size(buf, pos, limit, magic_v1, magic_blank, fixed, header, body_len_at):
    """The size of the record at ``pos`` when it passes every check but the CRC; -1 when it
    fails one, -2 at an end-of-segment blank."""
    remaining = limit - pos
    if remaining <= 4:
        return np.int64(-1)
    total = np.int64(0)
    magic = np.int64(0)
    if remaining >= 8:
        total = _i32(buf, pos)
        magic = _i32(buf, pos + 4)
    if magic == magic_blank:
        if 8 <= total <= remaining:
            return np.int64(-2)
        return np.int64(-1)
    if magic != magic_v1 or total < fixed or total > remaining:
        return np.int64(-1)
    body_len = _i32(buf, pos + body_len_at)
    if body_len < 0 or header + body_len + 1 > total:
        return np.int64(-1)
    tpos = pos + header + body_len
    topic_len = np.int64(buf[tpos])
    ppos = tpos + 1 + topic_len
    if topic_len == 0 or ppos + 2 > pos + total:
        return np.int64(-1)
    props_len = (np.int64(buf[ppos]) << 8) | np.int64(buf[ppos + 1])
    if props_len >= 32768:
        return np.int64(-1)  # a negative i16
    if fixed + body_len + topic_len + props_len != total:
        return np.int64(-1)
    last = pos + total - 1 if props_len else ppos - 1
    if buf[last] == 0:
        return np.int64(-1)  # a write cut short: a zeroed suffix
    return total


def _walk_records(buf, pos, limit, check_crc, crc, out_pos, out_size, magic_v1, magic_blank,
                  fixed, header, crc_at, body_len_at):
    """Validate records from ``pos``; return ``(count, end position, how it stopped)``."""
    count = 0
    cap = len(out_pos)
    while True:
        if count == cap:
            return count, pos, 2
        total = _record_size(buf, pos, limit, magic_v1, magic_blank, fixed, header, body_len_at)
        if total == -2:
            return count, pos, 1
        if total < 0:
            return count, pos, 0
        if check_crc:
            body_len = _i32(buf, pos + body_len_at)
            body_crc = np.int64(_crc32(buf, pos + header, pos + header + body_len, crc)
                                & np.uint32(0x7FFFFFFF))
            if body_crc != _i32(buf, pos + crc_at):
                return count, pos, 0
        out_pos[count] = pos
        out_size[count] = total
        count += 1
        pos += total


def _body_crcs(buf, starts, ends, crc, out):
    for i in range(len(starts)):
        out[i] = np.int64(_crc32(buf, starts[i], ends[i], crc) & np.uint32(0x7FFFFFFF))


#: The plain-Python loops, for other kernel modules to compile as their own helpers.
i32_loop, record_size_loop = _i32, _record_size

_KERNELS = kernel_set(globals(), helpers=("_crc32", "_i32", "_record_size"),
                    kernels=("_walk_records", "_body_crcs"))


def body_crcs(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """RocketMQ's BODYCRC (CRC32 & 0x7FFFFFFF) of the byte ranges ``[starts[i], ends[i])`` of
    ``buf`` (uint8), as int64: what a record's header must hold for its body."""
    out = np.empty(len(starts), dtype=np.int64)
    if len(out):
        _KERNELS(len(starts))["_body_crcs"](buf, np.ascontiguousarray(starts, dtype=np.int64),
                                 np.ascontiguousarray(ends, dtype=np.int64), crc_function(), out)
    return out


def walk_records(buf: np.ndarray, pos: int, limit: int, *, check_crc: bool = True,
                 max_records: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Validate records of ``buf`` (a segment as uint8) from ``pos`` up to ``limit``.

    Returns ``(positions, sizes, end, stop)``: the valid records, where the walk ended, and
    why (:data:`STOP_INVALID` at a record failing a check, :data:`STOP_BLANK` at an
    end-of-segment blank, :data:`STOP_FULL` after ``max_records``; ``end`` is where to go on).
    """
    cap = max(1, int(max_records))
    out_pos = np.empty(cap, dtype=np.int64)
    out_size = np.empty(cap, dtype=np.int64)
    count, end, stop = _KERNELS(min(cap, (int(limit) - int(pos)) // FIXED_SIZE))["_walk_records"](
        buf, int(pos), int(limit), bool(check_crc), crc_function(), out_pos, out_size,
        MESSAGE_MAGIC_CODE_V1, BLANK_MAGIC_CODE, FIXED_SIZE, HEADER_SIZE,
        FIELD_OFFSET["body_crc"], FIELD_OFFSET["body_length"])
    return out_pos[:count], out_size[:count], int(end), int(stop)


#: Bytes searched for magic codes per step of :func:`first_record_start` (a record start is
#: usually found in the first step; a window searched whole would cost a pass over it).
SEARCH_STEP = 1 << 18
_MAGIC_BYTES = np.frombuffer(int(MESSAGE_MAGIC_CODE_V1).to_bytes(4, "big", signed=True),
                             dtype=np.uint8)


def first_record_start(buf: np.ndarray, begin: int, until: int, limit: int, valid,
                       max_candidates: int = 100_000) -> int | None:
    """The first position in ``[begin, until)`` where ``valid(position)`` holds among those
    whose MAGICCODE bytes (4 bytes in) are a record's, searched ``SEARCH_STEP`` bytes at a
    time (``buf``: a segment as uint8, ``limit`` its size); ``None`` when none is, or after
    ``max_candidates`` candidates failed."""
    m = _MAGIC_BYTES
    tried = 0
    for lo in range(max(begin, 0), until, SEARCH_STEP):
        hi = min(until, lo + SEARCH_STEP)
        window = buf[lo + 4:min(hi + 7, limit)]
        if len(window) < 4:
            return None
        hits = np.flatnonzero((window[:-3] == m[0]) & (window[1:-2] == m[1])
                              & (window[2:-1] == m[2]) & (window[3:] == m[3]))
        for candidate in (hits + lo).tolist():
            if candidate >= hi:
                break
            if valid(candidate):
                return candidate
            tried += 1
            if tried >= max_candidates:
                return None
    return None
