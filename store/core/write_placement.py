"""Where the records of an append go, and the bytes written there.

:func:`place_batch` applies RocketMQ's placement rule to a batch of record sizes (a record
needs its length plus 8 bytes left in its segment, else an 8-byte blank closes the segment;
a batch that fits a segment moves to the next one whole).  :func:`assemble_unplaced` encodes
records given as columns with the compiled record kernel (:mod:`store.kernels.record_assembly`)
before any lock is taken; once placed, :func:`patch_placed` writes the four fields the
placement decides into those bytes and :func:`placed_writes` yields the CommitLog writes.
Used by :class:`~store.core.appender.Appender`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Iterator

import numpy as np

from ..formats import record_codec as codec
from ..files.commit_log import CommitLog
from ..base.crc import HARDWARE_CRC, LARGE_BODY_BYTES, crc32, crc_function
from ..formats.byte_columns import ByteColumn, empty_column
from ..kernels.record_assembly import assemble_records, memcpy_function, patch_placed_fields
from .append_types import AssembledRecords, EncodedRecords, Presumed

#: ``allocate(records, sizes) -> buffer`` for :func:`assemble_unplaced`.
Allocate = Callable[[EncodedRecords, np.ndarray], np.ndarray]

#: Byte offset of BODYCRC in a record (the kernel writes it).
_CRC_AT = codec.FIELD_OFFSET["body_crc"]


@lru_cache(maxsize=64)
def batch_template(sys_flag: int, born_host: bytes, born_port: int) -> np.ndarray:
    """The header every record of a batch starts from (one row of :data:`codec.HEADER_DTYPE`;
    callers copy it, e.g. with ``np.repeat``).  Cached: a producer's batches share it; the
    born time, flag and lengths are set per batch."""
    template = np.zeros(1, dtype=codec.HEADER_DTYPE)
    template["magic"] = codec.MESSAGE_MAGIC_CODE_V1
    template["sys_flag"] = sys_flag
    template["born_host"] = np.void(born_host)
    template["born_port"] = born_port
    template["store_host"] = np.void(codec.LOCALHOST)
    template["store_port"] = codec.STORE_PORT
    template.flags.writeable = False  # shared by every batch
    return template


def assemble_unplaced(records: EncodedRecords, sizes: np.ndarray, dispatched: bool,
                      allocate: Allocate | None = None,
                      presumed: Presumed | None = None) -> AssembledRecords:
    """Every record of ``records`` encoded back to back in one buffer, by the compiled
    :func:`~store.kernels.record_assembly.assemble_records` (body CRCs included), with the fields
    only the append knows left for it to write (:func:`patch_placed`).

    ``allocate(records, sizes)``, when given, returns that buffer: a writable uint8 array of
    exactly ``sizes.sum()`` bytes, e.g. a view into a larger record the caller builds around
    them (the sink's halves); else a new array.  Needs no lock: it reads only ``records``
    (whose headers get their ``total_size``).  ``presumed``: the placement the headers' four
    placement fields were written for (:mod:`store.core.placement_chain`), if any.
    """
    n = len(sizes)
    headers = records.headers
    headers["total_size"] = sizes
    hb = np.ascontiguousarray(headers).view(np.uint8).reshape(n, codec.HEADER_SIZE)
    bodies = ByteColumn.of(records.bodies)
    props = ByteColumn.of(records.properties)
    extra = (empty_column(n) if records.extra_properties is None
             else ByteColumn.of(records.extra_properties))
    names = ByteColumn.of([t.encode("ascii") for t in records.topics])
    topic_ids = np.asarray(records.topic_ids, dtype=np.int64)
    # the kernel copies with memcpy (no bounds checks): what it writes must be the sizes
    wrote = (codec.FIXED_SIZE + bodies.lengths() + np.diff(names.offsets)[topic_ids]
             + props.lengths() + extra.lengths())
    if not np.array_equal(wrote, sizes):
        raise ValueError("records whose parts do not add up to their sizes (properties_length "
                         "or body_length disagrees with the columns)")
    ends = np.cumsum(sizes)
    starts = ends - sizes
    if records.body_crc_known:
        crcs = headers["body_crc"].astype(np.int64)
    else:  # -1: the kernel computes it (ISA-L's CRC where installed)
        crcs = np.full(n, -1, dtype=np.int64)
        if not HARDWARE_CRC:  # large bodies: zlib here beats the kernel's fallback loop
            lengths = bodies.lengths()
            for i in np.flatnonzero(lengths >= LARGE_BODY_BYTES).tolist():
                o = int(bodies.starts[i])
                crcs[i] = crc32(memoryview(bodies.data[o:o + int(lengths[i])]))
    total = int(ends[-1])
    data = np.empty(total, dtype=np.uint8) if allocate is None else allocate(records, sizes)
    if data.dtype != np.uint8 or data.shape != (total,):
        raise ValueError(f"allocate returned {data.dtype} {data.shape}; the records need "
                         f"uint8 ({total},)")
    c = np.ascontiguousarray
    assemble_records(data, starts, hb, _CRC_AT, c(bodies.data), bodies.starts, bodies.ends,
                     names.data, names.offsets, topic_ids, c(props.data), props.starts,
                     props.ends, c(extra.data), extra.starts, extra.ends, crcs, crc_function(),
                     memcpy_function())
    return AssembledRecords(
        data=data, starts=starts, sizes=np.asarray(sizes, dtype=np.int64),
        topics=list(records.topics), topic_ids=topic_ids,
        queue_ids=np.asarray(records.queue_ids, dtype=np.int64),
        tags_codes=np.asarray(records.tags_codes, dtype=np.int64), dispatched=dispatched,
        store_timestamp_ms=records.store_timestamp_ms, presumed=presumed)


#: Where an append writes the fields the placement decides into assembled records.
PLACED_AT = np.array([codec.FIELD_OFFSET[name] for name in (
    "queue_id", "queue_offset", "physical_offset", "store_timestamp")], dtype=np.int64)


def patch_placed(records: AssembledRecords, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                 offsets: np.ndarray, store_timestamp_ms: int) -> None:
    """Write each record's queue id, queue offset, CommitLog offset and store time into its
    assembled bytes (big-endian, one compiled loop over the records)."""
    patch_placed_fields(records.data, records.starts, queue_ids, queue_offsets, offsets,
                        store_timestamp_ms, PLACED_AT)


def placed_writes(records: AssembledRecords, runs: list) -> Iterator:
    """The CommitLog writes of placed, patched records: ``(offset, buffer)`` per run of
    records (a view of the assembled bytes) and per segment-closing blank."""
    data, starts, sizes = records.data, records.starts, records.sizes
    for off, i, j, blank in runs:
        if j > i:
            lo, hi = int(starts[i]), int(starts[j - 1] + sizes[j - 1])
            yield off, data[lo:hi]
            off += hi - lo
        if blank:
            yield off, blank


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
