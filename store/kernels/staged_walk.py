"""A compiled walk over ranges of staged records: what an index commit's entries need.

:func:`staged_records` walks the records of byte ranges of one mapped CommitLog segment, back
to back (each range must end exactly at a record's end), checks that each one is a whole
record (magic code, sizes adding up, topic inside the record) and a staged one (transaction
type PREPARED in SYSFLAG, QUEUEOFFSET -1: :mod:`store.core.index_commit`) and reads, per
record, its position, size, QUEUEID, the tagsCode kept in PREPAREDTRANSACTIONOFFSET and its
topic, numbered with a small table of the distinct names (compared byte for byte: no name
is guessed from a hash).  No body CRC: the records were checked when staged.

Fields read (big-endian, :mod:`store.formats.record_codec`): TOTALSIZE, MAGICCODE,
QUEUEID, QUEUEOFFSET, SYSFLAG, PREPAREDTRANSACTIONOFFSET, BODYLENGTH, then TOPICLENGTH and
TOPIC after the body.
"""

from __future__ import annotations

import numpy as np

from ..base.jit import kernel_set
from ..formats.record_codec import (
    FIELD_OFFSET,
    FIXED_SIZE,
    HEADER_SIZE,
    MESSAGE_MAGIC_CODE_V1,
    STAGED_QUEUE_OFFSET,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
)
from .segment_walk import i32_loop

#: Distinct topics one walk numbers (more: the walk stops, the caller says so).
MAX_TOPICS = 256
#: Why a walk stopped early (``problem``): not a whole record, not a staged one, a range
#: not ending at a record's end, too many topics.
BAD_RECORD, NOT_STAGED, BAD_END, TOO_MANY_TOPICS = 1, 2, 3, 4
_AT = np.array([FIELD_OFFSET[n] for n in ("total_size", "magic", "queue_id", "queue_offset",
                                          "sys_flag", "prepared_transaction_offset",
                                          "body_length")], dtype=np.int64)
_CONSTS = np.array([MESSAGE_MAGIC_CODE_V1, FIXED_SIZE, HEADER_SIZE, TRANSACTION_TYPE_MASK,
                    TRANSACTION_PREPARED_TYPE, STAGED_QUEUE_OFFSET, MAX_TOPICS], dtype=np.int64)

_i32 = i32_loop


def _i64(buf, p):
    v = np.int64(0)
    for j in range(8):
        v = (v << 8) | np.int64(buf[p + j])
    return v


def _walk(buf, starts, ends, at, consts, out, names, name_at, name_len, state):
    """Fill ``out`` (rows: position, size, queue id, tagsCode, topic number) for the records
    of ``[starts[k], ends[k])``; ``state`` = [records, topics, problem, where]."""
    magic_v1, fixed, header, mask, prepared, staged, max_topics = (
        consts[0], consts[1], consts[2], consts[3], consts[4], consts[5], consts[6])
    n = np.int64(0)
    topics = np.int64(0)
    last = np.int64(-1)
    for k in range(len(starts)):
        p = starts[k]
        end = ends[k]
        while p < end:
            if end - p < fixed:
                state[0], state[1], state[2], state[3] = n, topics, 3, p
                return
            size = _i32(buf, p + at[0])
            body = _i32(buf, p + at[6])
            if (size < fixed or p + size > end or _i32(buf, p + at[1]) != magic_v1
                    or body < 0 or body > size - fixed):
                state[0], state[1], state[2], state[3] = n, topics, 1, p
                return
            t = p + header + body
            tl = np.int64(buf[t])
            if t + 3 + tl > p + size:
                state[0], state[1], state[2], state[3] = n, topics, 1, p
                return
            if (_i32(buf, p + at[4]) & mask) != prepared or _i64(buf, p + at[3]) != staged:
                state[0], state[1], state[2], state[3] = n, topics, 2, p
                return
            found = np.int64(-1)
            if last >= 0 and name_len[last] == tl:  # usually the record before's topic
                same = True
                for j in range(tl):
                    if names[name_at[last] + j] != buf[t + 1 + j]:
                        same = False
                        break
                if same:
                    found = last
            if found < 0:
                for g in range(topics):
                    if name_len[g] == tl:
                        same = True
                        for j in range(tl):
                            if names[name_at[g] + j] != buf[t + 1 + j]:
                                same = False
                                break
                        if same:
                            found = g
                            break
            if found < 0:
                if topics >= max_topics:
                    state[0], state[1], state[2], state[3] = n, topics, 4, p
                    return
                at_name = name_at[topics]
                for j in range(tl):
                    names[at_name + j] = buf[t + 1 + j]
                name_len[topics] = tl
                name_at[topics + 1] = at_name + tl
                found = topics
                topics += 1
            last = found
            out[0, n] = p
            out[1, n] = size
            out[2, n] = _i32(buf, p + at[2])
            out[3, n] = _i64(buf, p + at[5])
            out[4, n] = found
            n += 1
            p += size
    state[0], state[1], state[2], state[3] = n, topics, 0, -1


_KERNELS = kernel_set(globals(), helpers=("_i32", "_i64"), kernels=("_walk",))


def staged_records(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
                   ) -> tuple[np.ndarray, list[bytes], int, int]:
    """Walk the staged records of the ranges ``[starts[k], ends[k])`` (positions in ``buf``,
    one segment as uint8).

    Returns ``(columns, topics, problem, where)``: ``columns`` an int64 array of rows
    position, size, queue id, tagsCode and topic (an index into ``topics``, the names as
    bytes), one column per record walked; ``problem`` 0 when every range was walked, else
    why the walk stopped (:data:`BAD_RECORD`, :data:`NOT_STAGED`, :data:`BAD_END`,
    :data:`TOO_MANY_TOPICS`) at position ``where``.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    rows = int(((ends - starts) // FIXED_SIZE).sum()) + 1
    out = np.empty((5, rows), dtype=np.int64)
    names = np.empty(MAX_TOPICS * 256, dtype=np.uint8)
    name_at = np.zeros(MAX_TOPICS + 1, dtype=np.int64)
    name_len = np.zeros(MAX_TOPICS, dtype=np.int64)
    state = np.zeros(4, dtype=np.int64)
    _KERNELS(rows)["_walk"](buf, starts, ends, _AT, _CONSTS, out, names, name_at, name_len,
                            state)
    n, topics, problem, where = (int(v) for v in state)
    found = [names[name_at[g]:name_at[g] + name_len[g]].tobytes() for g in range(topics)]
    return out[:, :n], found, problem, where


__all__ = ["BAD_END", "BAD_RECORD", "MAX_TOPICS", "NOT_STAGED", "TOO_MANY_TOPICS",
           "staged_records"]
