"""Where the records of an append go, and the bytes written there.

:func:`place_batch` applies RocketMQ's placement rule to a batch of record sizes (a record
needs its length plus 8 bytes left in its segment, else an 8-byte blank closes the segment;
a batch that fits a segment moves to the next one whole).  :func:`assemble_writes` turns
placed records given as columns into CommitLog writes, through the compiled record kernel
(:mod:`store.record_kernels`).  Used by :class:`~store.core.appender.Appender`.
"""

from __future__ import annotations

import zlib
from typing import Iterator

import numpy as np

from .. import codec
from ..commit_log import CommitLog
from ..record_kernels import ByteColumn, assemble_records, empty_column
from .append_types import EncodedRecords

#: Bytes assembled per ``pwrite`` by :func:`assemble_writes` (fits a CPU cache).
WRITE_CHUNK = 4 * 1024 * 1024
#: Bodies from this size on get their CRC from zlib rather than the kernel.
_ZLIB_CRC_BYTES = 16 * 1024
#: Byte offset of BODYCRC in a record (the kernel writes it).
_CRC_AT = codec.FIELD_OFFSET["body_crc"]


def assemble_writes(records: EncodedRecords, topics: list[bytes], topic_ids: np.ndarray,
                    starts: np.ndarray, sizes: np.ndarray, runs: list) -> Iterator:
    """The CommitLog writes of placed records, filled by the compiled
    :func:`~store.record_kernels.assemble_records` (body CRCs included).

    A generator of ``(offset, buffer)``: the records of a run go out in pieces of about
    :data:`WRITE_CHUNK` bytes through one scratch buffer, each piece written before the
    next is filled (so the bytes are still in the CPU cache when ``pwrite`` copies them).
    """
    n = len(sizes)
    hb = np.ascontiguousarray(records.headers).view(np.uint8).reshape(n, codec.HEADER_SIZE)
    bodies = ByteColumn.of(records.bodies)
    props = ByteColumn.of(records.properties)
    extra = (empty_column(n) if records.extra_properties is None
             else ByteColumn.of(records.extra_properties))
    names = ByteColumn.of(topics)
    ends = np.cumsum(sizes)
    # large bodies: zlib's CRC (faster per byte); small ones: the kernel (no call each)
    if records.body_crc_known:
        crcs = records.headers["body_crc"].astype(np.int64)
    else:
        crcs = np.full(n, -1, dtype=np.int64)
        lengths = bodies.lengths()
        for i in np.flatnonzero(lengths >= _ZLIB_CRC_BYTES).tolist():
            o = int(bodies.starts[i])
            crcs[i] = zlib.crc32(memoryview(bodies.data[o:o + int(lengths[i])]))
    scratch = np.empty(0, dtype=np.uint8)
    for off, i, j, blank in runs:
        if j <= i:  # a blank alone closes a segment
            yield off, blank
            continue
        while i < j:
            base = int(ends[i] - sizes[i])
            k = int(np.searchsorted(ends, base + WRITE_CHUNK, side="right"))
            k = min(j, max(k, i + 1))
            used = int(ends[k - 1]) - base
            tail = len(blank) if k == j else 0
            if len(scratch) < used + tail:
                scratch = np.empty(max(used + tail, WRITE_CHUNK), dtype=np.uint8)
            buf = scratch[:used + tail]
            assemble_records(buf, starts[i:k] - starts[i], hb[i:k], _CRC_AT, bodies.data,
                             bodies.starts[i:k], bodies.ends[i:k], names.data, names.offsets,
                             topic_ids[i:k], props.data, props.starts[i:k], props.ends[i:k],
                             extra.data, extra.starts[i:k], extra.ends[i:k], crcs[i:k])
            if tail:
                buf[used:] = np.frombuffer(blank, dtype=np.uint8)
            yield int(starts[i]), buf
            i = k

def place_batch(commit_log: CommitLog, file_size: int, offset: int,
                sizes: np.ndarray) -> tuple[np.ndarray, list, int]:
    """Where the records of a batch go when the log ends at ``offset``.

    RocketMQ's rule: a record of length L needs L + 8 bytes left in its segment, else an
    8-byte blank closes the segment; a batch that fits a segment moves to the next one
    whole.  Returns each record's offset, the writes as ``(offset, first, stop, blank)``
    (records ``[first, stop)`` then an optional blank, all in one segment) and the new end.
    """
    blank_size = codec.BLANK.size
    ends = np.cumsum(sizes)
    total = int(ends[-1])
    runs: list[tuple[int, int, int, bytes]] = []
    if total + blank_size <= file_size:
        start, blank = commit_log.place(offset, total)
        if blank is not None:
            runs.append((offset, 0, 0, blank))
        runs.append((start, 0, len(sizes), b""))
        return start + ends - sizes, runs, start + total
    n = len(sizes)
    starts = np.empty(n, dtype=np.int64)
    i, pos = 0, offset
    while i < n:
        segment_end = pos - pos % file_size + file_size
        base = int(ends[i] - sizes[i])
        # records i..j-1 fit when each ends at least 8 bytes before the segment end
        j = int(np.searchsorted(ends, segment_end - blank_size - pos + base, side="right"))
        if j > i:
            starts[i:j] = pos + ends[i:j] - sizes[i:j] - base
            runs.append((pos, i, j, b""))
            pos += int(ends[j - 1]) - base
            i = j
        if i < n:  # the next record does not fit: close the segment with a blank
            runs.append((pos, 0, 0, codec.encode_blank(segment_end - pos)))
            pos = segment_end
    return starts, runs, pos
