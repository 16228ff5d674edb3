"""A compiled walk that reads the index keys of CommitLog records: the key index's dispatch.

:func:`record_keys` walks the records of a mapped segment from a position (the structural
checks of :func:`~store.kernels.segment_walk.walk_records`, no CRC: the records were just
written, or checked by recovery) and, for each record that is not a ROLLBACK transaction
record, gives one row per key RocketMQ's IndexService indexes, in its order: the
``UNIQ_KEY`` property, then each non-empty part of ``KEYS`` split on single spaces.  A row
is the keyHash of ``topic#key`` (Java's ``String.hashCode`` over UTF-16 code units, the
value's UTF-8 decoded in the loop, made non-negative as RocketMQ does), the record's
position and its store time.  No Python object is made per record or key.
"""

from __future__ import annotations

from types import FunctionType

import numpy as np

from ..base.jit import kernel_set
from ..formats.record_codec import (
    BLANK_MAGIC_CODE,
    FIELD_OFFSET,
    FIXED_SIZE,
    HEADER_SIZE,
    MESSAGE_MAGIC_CODE_V1,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from .segment_walk import record_size_loop

_record_size = FunctionType(record_size_loop.__code__, globals(), "_record_size")

_UNIQ_KEY = np.frombuffer(b"UNIQ_KEY", dtype=np.uint8)
_KEYS = np.frombuffer(b"KEYS", dtype=np.uint8)
#: Rows one record can need at most: its UNIQ_KEY and a KEYS of one-character parts in a
#: properties block of at most 32,767 bytes.
MAX_ROWS_PER_RECORD = 1 + 32768 // 2
#: The kernel's constants: rows per record, the transaction type mask and ROLLBACK, the two
#: magic codes, the fixed record size, the header size, then where body length, sys flag
#: and store time sit in a record.
_CONSTS = np.array([MAX_ROWS_PER_RECORD, TRANSACTION_TYPE_MASK, TRANSACTION_ROLLBACK_TYPE,
                    MESSAGE_MAGIC_CODE_V1, BLANK_MAGIC_CODE, FIXED_SIZE, HEADER_SIZE]
                   + [FIELD_OFFSET[name] for name in ("body_length", "sys_flag",
                                                      "store_timestamp")], dtype=np.int64)


def _at(buf, i):
    """``buf[i]`` as an int64, indexed unsigned: numba checks a signed index for a negative
    one (Python's wrap-around) with a branch per access, most of a byte loop's time."""
    return np.int64(buf[np.uint64(i)])


def _i32(buf, p):
    """The big-endian signed 32-bit int at ``p`` (:func:`~store.kernels.segment_walk.i32_loop`
    with unsigned indices)."""
    v = (_at(buf, p) << 24) | (_at(buf, p + 1) << 16) | (_at(buf, p + 2) << 8) | _at(buf, p + 3)
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


def _hash_steps(buf, a, b, h, ascii_only):
    """``h`` continued over ``buf[a:b]`` as Java's hashCode, a unit a byte, four bytes a
    step: ``h * 31**4 + c0 * 31**3 + c1 * 31**2 + c2 * 31 + c3`` (mod 2**32) is the same
    value, with one multiplication on the chain from one step to the next rather than four.
    ``ascii_only``: stop before four bytes one of which is not ASCII.  Returns ``(h, where
    it stopped)`` (at most three bytes before ``b``, or before a non-ASCII byte)."""
    i = a
    while i + 4 <= b:
        c0, c1, c2, c3 = _at(buf, i), _at(buf, i + 1), _at(buf, i + 2), _at(buf, i + 3)
        if ascii_only and (c0 | c1 | c2 | c3) >= 0x80:
            break
        h = (h * 923521 + c0 * 29791 + c1 * 961 + c2 * 31 + c3) & 0xFFFFFFFF
        i += 4
    return h, i


def _hash_bytes(buf, a, b, h):
    """``h`` continued over the bytes ``buf[a:b]``, one unit each (a topic's name)."""
    h, i = _hash_steps(buf, a, b, h, False)
    for j in range(i, b):
        h = (h * 31 + _at(buf, j)) & 0xFFFFFFFF
    return h


def _hash_utf8(buf, a, b, h):
    """``h`` continued over ``buf[a:b]`` (UTF-8) as Java's hashCode over its UTF-16 units
    (ASCII four bytes a step, :func:`_hash_steps`)."""
    h, i = _hash_steps(buf, a, b, h, True)
    while i < b:
        c = _at(buf, i)
        n = 1
        cp = c
        if c >= 0xF0 and i + 3 < b:
            cp = ((c & 0x07) << 18) | ((_at(buf, i + 1) & 0x3F) << 12) \
                | ((_at(buf, i + 2) & 0x3F) << 6) | (_at(buf, i + 3) & 0x3F)
            n = 4
        elif c >= 0xE0 and i + 2 < b:
            cp = ((c & 0x0F) << 12) | ((_at(buf, i + 1) & 0x3F) << 6) | (_at(buf, i + 2) & 0x3F)
            n = 3
        elif c >= 0xC0 and i + 1 < b:
            cp = ((c & 0x1F) << 6) | (_at(buf, i + 1) & 0x3F)
            n = 2
        if cp >= 0x10000:  # a surrogate pair in UTF-16
            cp -= 0x10000
            h = (h * 31 + (0xD800 + (cp >> 10))) & 0xFFFFFFFF
            h = (h * 31 + (0xDC00 + (cp & 0x3FF))) & 0xFFFFFFFF
        else:
            h = (h * 31 + cp) & 0xFFFFFFFF
        i += n
    return h


def _named(data, p, q, name):
    """Whether ``data[p:q]`` is ``name``."""
    if q - p != len(name):
        return False
    for j in range(len(name)):
        if _at(data, p + j) != name[j]:
            return False
    return True


def _find(data, i, end, byte):
    """Where ``byte`` is first in ``data[i:end]`` (``end``: nowhere), four bytes a step."""
    while i + 4 <= end:
        if ((_at(data, i) == byte) | (_at(data, i + 1) == byte) | (_at(data, i + 2) == byte)
                | (_at(data, i + 3) == byte)):
            break
        i += 4
    while i < end and _at(data, i) != byte:
        i += 1
    return i


def _value_end_hashing(data, i, end, h):
    """``(v, h, j)``: where the value from ``i`` ends (its 0x02, or ``end``), and ``h``
    continued over its bytes to ``j``, as far as they are ASCII (four a step, as
    :func:`_hash_steps`): the value's bytes are read once for both."""
    while i + 4 <= end:
        c0, c1, c2, c3 = _at(data, i), _at(data, i + 1), _at(data, i + 2), _at(data, i + 3)
        if ((c0 == 2) | (c1 == 2) | (c2 == 2) | (c3 == 2) | ((c0 | c1 | c2 | c3) >= 0x80)):
            break
        h = (h * 923521 + c0 * 29791 + c1 * 961 + c2 * 31 + c3) & 0xFFFFFFFF
        i += 4
    j = i
    while i < end and _at(data, i) != 2:
        if j == i and _at(data, i) < 0x80:
            h = (h * 31 + _at(data, i)) & 0xFFFFFFFF
            j = i + 1
        i += 1
    return i, h, j


def _two_values(data, p, end, name1, name2, h):
    """:func:`~store.kernels.recovery_scan._tag_value` of two names in one pass over the
    properties ``data[p:end]`` (the last non-empty value of each counts): ``(h1, a2, b2)``,
    ``h1`` the hash ``h`` continued over the value of ``name1`` (:func:`_hash_utf8`; -1: no
    value), ``data[a2:b2]`` the value of ``name2`` (-1: none)."""
    h1 = a2 = b2 = np.int64(-1)
    while p < end:
        q = _find(data, p, end, 1)  # (a pair: its name up to 0x01, its value up to 0x02)
        if q >= end:
            break
        if _named(data, p, q, name1):
            v, g, j = _value_end_hashing(data, q + 1, end, h)
            if v > q + 1:
                h1 = _hash_utf8(data, j, v, g)
        else:
            v = _find(data, q + 1, end, 2)
        if v > q + 1 and _named(data, p, q, name2):
            a2, b2 = q + 1, v
        p = v + 1
    return h1, a2, b2


def _key_hash(h):
    """RocketMQ's keyHash of an unsigned 32-bit hash: abs of the signed value, MIN_VALUE 0."""
    if h >= 0x80000000:
        h = 0x100000000 - h
        if h == 0x80000000:
            return np.int64(0)
    return np.int64(h)


def _record_keys(buf, pos, limit, out, uniq_name, keys_name, consts):
    """Rows of the records from ``pos`` (see the module doc) until ``limit``, an invalid
    record or a blank, into ``out`` (keyHash, position, store time); returns ``(rows, end
    position, stop)``, stop as in scan_kernels (2: ``limit`` reached or no room left for
    another record's rows).  ``consts``: see :data:`_CONSTS` (one array: a call with few
    arguments costs less to dispatch)."""
    per_record, type_mask, rollback = consts[0], consts[1], consts[2]
    magic_v1, magic_blank, fixed, header = consts[3], consts[4], consts[5], consts[6]
    at = consts[7:]
    count = 0
    cap = out.shape[1]
    while True:
        if pos >= limit or cap - count < per_record:
            return count, pos, 2
        total = _record_size(buf, pos, limit, magic_v1, magic_blank, fixed, header, at[0])
        if total == -2:
            return count, pos, 1
        if total < 0:
            return count, pos, 0
        if (_i32(buf, pos + at[1]) & type_mask) != rollback:
            body_len = _i32(buf, pos + at[0])
            stamp = _i32(buf, pos + at[2]) * 4294967296 + (_i32(buf, pos + at[2] + 4)
                                                           & 0xFFFFFFFF)
            tpos = pos + header + body_len
            ppos = tpos + 1 + _at(buf, tpos)
            prefix = (_hash_bytes(buf, tpos + 1, ppos, np.int64(0)) * 31 + 35) & 0xFFFFFFFF
            pend = ppos + 2 + ((_at(buf, ppos) << 8) | _at(buf, ppos + 1))  # ('#' above)
            h, a, b = _two_values(buf, ppos + 2, pend, uniq_name, keys_name, prefix)
            if h >= 0:
                out[0, count] = _key_hash(h)
                out[1, count] = pos
                out[2, count] = stamp
                count += 1
            while a >= 0 and a < b:
                e = a
                while e < b and _at(buf, e) != 32:
                    e += 1
                if e > a:
                    out[0, count] = _key_hash(_hash_utf8(buf, a, e, prefix))
                    out[1, count] = pos
                    out[2, count] = stamp
                    count += 1
                a = e + 1
        pos += total


def _put_be(buf, p, v, width):
    """Write ``v`` big-endian in ``width`` bytes at ``p``."""
    for j in range(width):
        buf[p + j] = (v >> (8 * (width - 1 - j))) & 0xFF


def _chain_entries(buf, slot_base, entry_base, slot_count, count, hashes, phys, stamps,
                   begin_ts, max_diff):
    """Write the entries ``count, count + 1, ...`` of an index file mapped as ``buf`` and
    chain each into its slot (see :func:`chain_entries`); returns how many slots were empty.
    One pass: each slot is read once (a cache miss each in a file's megabytes of slots)."""
    k = hashes.shape[0]
    fresh = 0
    for i in range(k):
        n = count + i
        s = hashes[i] % slot_count
        at = slot_base + 4 * s
        prev = _i32(buf, at)
        # past indexCount: an earlier entry of this put (its entry is in this slot) or a
        # torn write's, when the slot is empty (what ``prev`` would be had every head past
        # indexCount been set to 0 before this put)
        if prev < 0 or (prev > count and (prev >= n or hashes[prev - count] % slot_count != s)):
            prev = 0
        if prev == 0:
            fresh += 1
        diff = (stamps[i] - begin_ts) // 1000
        diff = min(max(diff, 0), max_diff)
        e = entry_base + 20 * n
        _put_be(buf, e, hashes[i], 4)
        _put_be(buf, e + 4, phys[i], 8)
        _put_be(buf, e + 12, diff, 4)
        _put_be(buf, e + 16, prev, 4)
        _put_be(buf, at, n, 4)  # after its entry: a head never points at an unwritten one
    return fresh


def _check_chains(buf, entry_base, slot_count, last, newest, slot_at, work_s, work_p, work_n,
                  starts, width):
    """Check the entries ``1 .. last`` of an index file mapped as ``buf`` against their
    slots' newest earlier entry, kept in ``newest`` (zeros, one per slot): see
    :func:`check_chains`.  In blocks of ``len(slot_at)`` entries, each block's entries are
    first laid out by slot range (``len(starts)`` ranges of ``width`` slots, entry order kept
    within each) so that the pass over ``newest`` touches one range at a time: a slot per
    entry at random is a cache miss each, most of the time of a plain pass."""
    block = slot_at.shape[0]
    ranges = starts.shape[0]
    lo = 1
    while lo <= last:
        hi = min(last, lo + block - 1)
        starts[:] = 0
        for n in range(lo, hi + 1):
            h = _i32(buf, entry_base + 20 * n)
            if h < 0:
                return 1, n, h
            s = h % slot_count
            slot_at[n - lo] = s
            starts[s // width] += 1
        total = 0
        for r in range(ranges):
            c = starts[r]
            starts[r] = total
            total += c
        for n in range(lo, hi + 1):
            s = slot_at[n - lo]
            r = s // width
            k = starts[r]
            starts[r] = k + 1
            work_s[k] = s
            work_p[k] = _i32(buf, entry_base + 20 * n + 16)
            work_n[k] = n
        for k in range(hi - lo + 1):
            s = work_s[k]
            if work_p[k] != newest[s]:
                return 2, work_n[k], work_p[k]
            newest[s] = work_n[k]
        lo = hi + 1
    return 0, 0, 0


_KERNELS = kernel_set(globals(), helpers=("_at", "_find", "_i32", "_record_size", "_named",
                                        "_value_end_hashing", "_two_values", "_hash_steps",
                                        "_hash_bytes", "_hash_utf8", "_key_hash", "_put_be"),
                    kernels=("_record_keys", "_chain_entries", "_check_chains"))


#: Entries :func:`check_chains` lays out at a time, and the slot ranges it lays them out by.
_CHECK_BLOCK, _CHECK_RANGES = 1 << 21, 256


def check_chains(buf: np.ndarray, entry_base: int, slot_count: int, last: int
                 ) -> tuple[np.ndarray, int, int, int]:
    """The chains of an index file's entries ``1 .. last`` (``buf``: the file as uint8, the
    entries at ``entry_base``), compiled: each entry's ``prevIndex`` must be the newest
    earlier entry of its slot (``keyHash mod slot_count``), 0 for a slot's first.  Returns
    ``(newest, code, entry, value)``: ``newest``, each slot's newest entry (what its head
    must be), and ``code`` 0 when every link holds, 1 when ``entry`` has the negative
    keyHash ``value``, 2 when its prevIndex ``value`` is not its slot's newest before it
    (the first such entry of a block's slot range)."""
    slot_count, last = int(slot_count), int(last)
    newest = np.zeros(slot_count, dtype=np.int32)
    block = max(1, min(_CHECK_BLOCK, last))
    work = [np.empty(block, dtype=np.int32) for _ in range(4)]
    ranges = max(1, min(_CHECK_RANGES, slot_count))
    code, entry, value = _KERNELS(last)["_check_chains"](
        buf, int(entry_base), slot_count, last, newest, *work,
        np.zeros(ranges, dtype=np.int64), -(-slot_count // ranges))
    return newest, int(code), int(entry), int(value)


def chain_entries(buf: np.ndarray, slot_base: int, entry_base: int, slot_count: int,
                  count: int, hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray,
                  begin_ts: int, max_diff: int) -> int:
    """RocketMQ's IndexFile put of a batch, compiled: entry ``count + i`` gets keyHash
    ``hashes[i]``, ``phys[i]``, the whole seconds from ``begin_ts`` to ``stamps[i]`` (within
    0..``max_diff``) and, as ``prevIndex``, its slot's head, which then becomes it.  ``buf``:
    the file as writable uint8 (big-endian fields at ``slot_base`` and ``entry_base``).
    Returns how many entries found their slot empty (``hashSlotCount`` grows by that)."""
    return int(_KERNELS(len(hashes))["_chain_entries"](
        buf, int(slot_base), int(entry_base), int(slot_count), int(count),
        np.ascontiguousarray(hashes, dtype=np.int64), np.ascontiguousarray(phys, dtype=np.int64),
        np.ascontiguousarray(stamps, dtype=np.int64), int(begin_ts), int(max_diff)))


def record_keys(buf: np.ndarray, pos: int, limit: int, out: np.ndarray
                ) -> tuple[np.ndarray, int, int]:
    """Key rows of the records of ``buf`` (a segment as uint8) from ``pos`` up to ``limit``.

    ``out``: an int64 array of shape ``(3, rows)`` (``rows`` at least
    :data:`MAX_ROWS_PER_RECORD`) the rows are written into.  Returns ``(rows, end, stop)``:
    ``rows`` views ``out[:, :count]`` (keyHash, record position, store time), ``end`` where
    the walk stopped (a record boundary) and ``stop`` why (scan_kernels' ``STOP_*``).
    """
    work = min(out.shape[1], (int(limit) - int(pos)) // FIXED_SIZE + 1)
    count, end, stop = _KERNELS(work)["_record_keys"](buf, int(pos), int(limit), out,
                                                      _UNIQ_KEY, _KEYS, _CONSTS)
    return out[:, :count], int(end), int(stop)
