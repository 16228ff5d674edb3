"""A compiled walk that indexes the records of a CommitLog segment: the recovery scan's columns.

:func:`index_records` walks records from a position of a mapped segment with the structural
checks of :func:`~store.kernels.segment_walk.walk_records` (magic, sizes adding up, topic, last byte)
and, in the same pass over the bytes, reads what the ConsumeQueue entry of each record needs:
queue id and offset, sys flag, store time, the topic and the ``TAGS`` property, each distinct
topic and tag numbered with a small table (no Python object per record), and the body CRC
checked (most of a recovery's work).  It stops where the checking walk stops, or at the
first record that starts at or after ``stop_at``, so that two threads can walk two halves
of a range (:func:`store.core.recovery.checked_walk`).

Fields read from each record (big-endian, :mod:`store.formats.record_codec`)::

    field              where
    TOTALSIZE          0 (i32)
    MAGICCODE          4 (i32)
    BODYCRC            8 (i32)
    QUEUEID            12 (i32)
    QUEUEOFFSET        20 (i64)
    SYSFLAG            36 (i32)
    STORETIMESTAMP     56 (i64)
    BODYLENGTH         84 (i32), then the body
    TOPIC              after the body: length (1 byte), name
    PROPERTIES         length (i16), ``name 0x01 value 0x02`` pairs (``TAGS`` is looked up)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import FunctionType

import numpy as np

from ..formats.record_codec import (
    BLANK_MAGIC_CODE,
    FIELD_OFFSET,
    FIXED_SIZE,
    HEADER_SIZE,
    MESSAGE_MAGIC_CODE_V1,
)
from .property_scan import distinct_values, next_pair_loop
from ..base.crc import crc_function
from ..base.jit import kernel_set
from .record_assembly import crc32_call
from .segment_walk import i32_loop, record_size_loop

#: Distinct topics (and tags) one walk numbers in its table; more fall back to hashing.
TABLE_SIZE = 32
_TAGS = np.frombuffer(b"TAGS", dtype=np.uint8)

_crc32, _i32, _next_pair = crc32_call, i32_loop, next_pair_loop
# the structural checks of scan_kernels, resolving the helpers they call (``_i32``) here
_record_size = FunctionType(record_size_loop.__code__, globals(), "_record_size")


def _same(data, a, b, length):
    for j in range(length):
        if data[a + j] != data[b + j]:
            return False
    return True


def _table_id(data, a, b, table, state):
    """The number of ``data[a:b]`` in ``table`` (rows: start, end), added when new; -1 when
    the table is full.  ``state`` holds how many are used and the last one matched."""
    length = b - a
    last = state[1]
    if last >= 0 and table[1, last] - table[0, last] == length \
            and _same(data, a, table[0, last], length):
        return last  # runs of one value are the usual case
    used = state[0]
    for k in range(used):
        if k != last and table[1, k] - table[0, k] == length \
                and _same(data, a, table[0, k], length):
            state[1] = k
            return k
    if used == table.shape[1]:
        return np.int64(-1)
    table[0, used] = a
    table[1, used] = b
    state[0] = used + 1
    state[1] = used
    return used


def _tag_value(data, p, end, key):
    """Start and end of the last non-empty value named ``key`` in the properties
    ``data[p:end]`` (-1, -1 when none), parsed as :func:`~store.kernels.property_scan.scan_properties`
    parses them."""
    found_a = np.int64(-1)
    found_b = np.int64(-1)
    klen = len(key)
    while p < end:
        q, v1 = _next_pair(data, p, end)
        if q >= end:
            break
        if v1 > q + 1 and q - p == klen:
            same = True
            for j in range(klen):
                if data[p + j] != key[j]:
                    same = False
                    break
            if same:
                found_a = q + 1
                found_b = v1
        p = v1 + 1
    return found_a, found_b


def _index_records(buf, pos, limit, stop_at, check_crc, crc, cols, topic_table, topic_state,
                   tag_table, tag_state, key, magic_v1, magic_blank, fixed, header, at):
    """Index valid records from ``pos`` into the rows of ``cols`` (see :data:`_ARRAYS`) until
    one starts at or after ``stop_at``; return ``(count, end position, how it stopped)`` as
    the walk of scan_kernels does (a full ``cols`` or ``stop_at`` is a stop of 2)."""
    count = 0
    cap = cols.shape[1]
    while True:
        if count == cap or pos >= stop_at:
            return count, pos, 2
        total = _record_size(buf, pos, limit, magic_v1, magic_blank, fixed, header, at[0])
        if total == -2:
            return count, pos, 1
        if total < 0:
            return count, pos, 0
        body_len = _i32(buf, pos + at[0])
        if check_crc:
            body_crc = np.int64(_crc32(buf, pos + header, pos + header + body_len, crc)
                                & np.uint32(0x7FFFFFFF))
            if body_crc != _i32(buf, pos + at[1]):
                return count, pos, 0
        cols[0, count] = pos
        cols[1, count] = total
        cols[2, count] = body_len
        cols[3, count] = _i32(buf, pos + at[1])
        cols[4, count] = _i32(buf, pos + at[2])
        cols[5, count] = _i32(buf, pos + at[3]) * 4294967296 + (_i32(buf, pos + at[3] + 4)
                                                                & 0xFFFFFFFF)
        cols[6, count] = _i32(buf, pos + at[4])
        cols[7, count] = _i32(buf, pos + at[5]) * 4294967296 + (_i32(buf, pos + at[5] + 4)
                                                                & 0xFFFFFFFF)
        tpos = pos + header + body_len
        ppos = tpos + 1 + np.int64(buf[tpos])
        cols[8, count] = _table_id(buf, tpos + 1, ppos, topic_table, topic_state)
        plen = (np.int64(buf[ppos]) << 8) | np.int64(buf[ppos + 1])
        a, b = _tag_value(buf, ppos + 2, ppos + 2 + plen, key)
        cols[9, count] = a
        cols[10, count] = b
        cols[11, count] = _table_id(buf, a, b, tag_table, tag_state) if a >= 0 else -1
        count += 1
        pos += total


_KERNELS = kernel_set(globals(), helpers=("_crc32", "_i32", "_next_pair", "_record_size", "_same",
                                        "_table_id", "_tag_value"),
                    kernels=("_index_records",))


@dataclass(slots=True)
class RecordIndex:
    """Columns (int64) of a run of structurally valid records of one segment.

    ``topic_ids`` number ``topics`` (names as bytes); ``tag_ids`` number ``tags`` (-1: no
    ``TAGS`` property); ``tag_starts`` / ``tag_ends`` locate the tag in the segment.
    """

    positions: np.ndarray
    sizes: np.ndarray
    body_lengths: np.ndarray
    body_crcs: np.ndarray
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    sys_flags: np.ndarray
    store_timestamps: np.ndarray
    topic_ids: np.ndarray
    tag_starts: np.ndarray
    tag_ends: np.ndarray
    tag_ids: np.ndarray
    topics: list[bytes]
    tags: list[bytes]

    def __len__(self) -> int:
        return len(self.positions)

    def take(self, rows) -> "RecordIndex":
        """The index of ``rows`` (a slice, a mask or indexes) only."""
        return RecordIndex(*(getattr(self, f.name)[rows] for f in _ARRAYS), self.topics, self.tags)


_ARRAYS = [f for f in fields(RecordIndex) if f.name not in ("topics", "tags")]
#: Rows of the array :func:`index_records` writes its columns into.
INDEX_COLUMNS = _COLUMNS = len(_ARRAYS)
_AT = np.array([FIELD_OFFSET[name] for name in ("body_length", "body_crc", "queue_id",
                                                 "queue_offset", "sys_flag", "store_timestamp")],
               dtype=np.int64)


def index_records(buf: np.ndarray, pos: int, limit: int, *, stop_at: int | None = None,
                  check_crc: bool = True, max_records: int = 1 << 18,
                  out: np.ndarray | None = None) -> tuple[RecordIndex, int, int]:
    """Index the records of ``buf`` (a segment as uint8) from ``pos`` up to ``limit`` that
    pass every check (the body CRC only with ``check_crc``).

    Returns ``(index, end, stop)`` as :func:`~store.kernels.segment_walk.walk_records` returns
    ``(positions, sizes, end, stop)``; reaching ``stop_at`` (or ``max_records``) is
    :data:`~store.kernels.segment_walk.STOP_FULL`.  ``out``: an int64 array of at least
    ``(INDEX_COLUMNS, max_records)`` to write the columns into (the index then views it).
    """
    rows = max(1, int(max_records))
    if out is None or out.shape[0] < _COLUMNS or out.shape[1] < rows:
        out = np.empty((_COLUMNS, rows), dtype=np.int64)
    cols = out[:_COLUMNS, :rows]
    topic_table = np.empty((2, TABLE_SIZE), dtype=np.int64)
    tag_table = np.empty((2, TABLE_SIZE), dtype=np.int64)
    topic_state = np.array([0, -1], dtype=np.int64)
    tag_state = np.array([0, -1], dtype=np.int64)
    work = min(rows, ((limit if stop_at is None else stop_at) - int(pos)) // FIXED_SIZE + 1)
    count, end, stop = _KERNELS(work)["_index_records"](
        buf, int(pos), int(limit), int(limit if stop_at is None else stop_at), bool(check_crc),
        crc_function(), cols, topic_table, topic_state, tag_table, tag_state, _TAGS,
        MESSAGE_MAGIC_CODE_V1, BLANK_MAGIC_CODE, FIXED_SIZE, HEADER_SIZE, _AT)
    cols = cols[:, :count]
    topics = _names(buf, topic_table, int(topic_state[0]))
    tags = _names(buf, tag_table, int(tag_state[0]))
    index = RecordIndex(*cols, topics, tags)
    if count and (index.topic_ids < 0).any():
        t0 = cols[0] + HEADER_SIZE + cols[2] + 1
        index.topic_ids = _numbered(buf, t0, t0 + buf[t0 - 1], index.topic_ids, topics)
    if count and ((index.tag_ids < 0) & (index.tag_starts >= 0)).any():
        index.tag_ids = _numbered(buf, index.tag_starts, index.tag_ends, index.tag_ids, tags,
                                  index.tag_starts >= 0)
    return index, int(end), int(stop)


def _names(buf: np.ndarray, table: np.ndarray, used: int) -> list[bytes]:
    return [buf[a:b].tobytes() for a, b in zip(table[0, :used].tolist(), table[1, :used].tolist())]


def _numbered(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, ids: np.ndarray,
              names: list[bytes], present: np.ndarray | None = None) -> np.ndarray:
    """``ids`` with the rows the table could not number (-1, where ``present``) numbered too,
    extending ``names`` in place; a value already in ``names`` keeps its number."""
    rows = np.flatnonzero((ids < 0) if present is None else (ids < 0) & present)
    values, inverse = distinct_values(buf, starts[rows], ends[rows])
    known = {name: i for i, name in enumerate(names)}
    number = np.empty(len(values), dtype=np.int64)
    for j, value in enumerate(values):
        if value not in known:
            known[value] = len(names)
            names.append(value)
        number[j] = known[value]
    ids = ids.copy()
    ids[rows] = number[inverse]
    return ids
