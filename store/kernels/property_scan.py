"""Compiled loops over the properties of whole batches of records (no Python per record).

A record's properties are ``name 0x01 value 0x02`` pairs (:mod:`store.formats.record_codec`).  The kernels
here work on a :class:`~store.formats.byte_columns.ByteColumn` of properties strings (row ``i`` is
``data[offsets[i]:offsets[i + 1]]``):

* :func:`scan_properties` finds the values of a few names in every row in one pass;
* :func:`hash_ranges`, :func:`parse_int_ranges`: a 64-bit FNV-1a hash, or the decimal value,
  of the located values;
* :func:`strip_pairs`: the rows without the pairs of some names;
* :func:`format_int_pairs`: rows of ``name 0x01 decimal 0x02`` pairs from an int matrix;

:func:`distinct_values` groups located values by hash and checks every row against its
group's first row byte by byte, so a hash collision can never merge two values.

The loops are JIT-compiled with numba on first use (see :mod:`store.kernels.record_assembly`).
"""

from __future__ import annotations

import numpy as np

from ..base.jit import kernel_set
from ..formats.byte_columns import ByteColumn, ByteSlices

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
#: Digits of the longest decimal an int64 holds.
_MAX_DIGITS = 19
_NO_BYTES = np.zeros(1, dtype=np.uint8)
#: Distinct values :func:`distinct_values` groups in one pass before it falls back to hashing.
_FEW = 32


def _next_pair(data, p, end):
    """The pair from ``p`` in ``data[:end]``: where its 0x01 is (``end`` when none: no more
    pairs) and where its value ends (its 0x02, or ``end`` for a last pair without one)."""
    q = p
    while q < end and data[q] != 1:
        q += 1
    v1 = q + 1
    while v1 < end and data[v1] != 2:
        v1 += 1
    return q, v1


#: The plain-Python pair parser, for other kernel modules to compile as their own helper.
next_pair_loop = _next_pair


def _scan_properties(data, starts, ends, keys_data, keys_offsets, found, vstart, vend):
    """For every row and key: the last non-empty value of that name (``found``, positions).

    The row's last pair may end without its 0x02 (RocketMQ writes properties that way); a
    name without its 0x01 ends the scan of that row.
    """
    n = len(starts)
    nk = len(keys_offsets) - 1
    for i in range(n):
        p = starts[i]
        end = ends[i]
        while p < end:
            q, v1 = _next_pair(data, p, end)
            if q >= end:
                break
            if v1 > q + 1:  # (the last pair may lack its 0x02, as RocketMQ writes it)
                for k in range(nk):
                    k0 = keys_offsets[k]
                    if keys_offsets[k + 1] - k0 != q - p:
                        continue
                    same = True
                    for j in range(q - p):
                        if data[p + j] != keys_data[k0 + j]:
                            same = False
                            break
                    if same:
                        found[k, i] = True
                        vstart[k, i] = q + 1
                        vend[k, i] = v1
            p = v1 + 1


def _hash_ranges(data, vstart, vend, out):
    for i in range(len(vstart)):
        h = np.uint64(0xCBF29CE484222325)
        for j in range(vstart[i], vend[i]):
            h = (h ^ np.uint64(data[j])) * np.uint64(0x100000001B3)
        out[i] = h


def _same_as_first(data, vstart, vend, first):
    """Whether each row's value equals that of row ``first[i]``."""
    n = len(vstart)
    out = np.ones(n, dtype=np.bool_)
    for i in range(n):
        f = first[i]
        a, b = vstart[i], vstart[f]
        length = vend[i] - a
        if length != vend[f] - b:
            out[i] = False
            continue
        for j in range(length):
            if data[a + j] != data[b + j]:
                out[i] = False
                break
    return out


def _distinct_few(data, vstart, vend, table_start, table_end, ids):
    """Group ranges by their bytes with a small table of distinct values (linear search of
    a table row picked by the value's length and first byte); return how many distinct
    values, or -1 when more than the table holds."""
    cap = len(table_start)
    used = 0
    last = -1
    for i in range(len(vstart)):
        a, b = vstart[i], vend[i]
        length = b - a
        if last >= 0 and table_end[last] - table_start[last] == length:
            same = True  # runs of one value are the usual case: try the last match first
            t = table_start[last]
            for j in range(length):
                if data[a + j] != data[t + j]:
                    same = False
                    break
            if same:
                ids[i] = last
                continue
        hit = -1
        for k in range(used):
            t = table_start[k]
            if table_end[k] - t != length:
                continue
            same = True
            for j in range(length):
                if data[a + j] != data[t + j]:
                    same = False
                    break
            if same:
                hit = k
                break
        if hit < 0:
            if used == cap:
                return -1
            table_start[used] = a
            table_end[used] = b
            hit = used
            used += 1
        ids[i] = hit
        last = hit
    return used


def _parse_int_ranges(data, vstart, vend, value, ok):
    for i in range(len(vstart)):
        a, b = vstart[i], vend[i]
        neg = False
        if a < b and data[a] == 45:  # '-'
            neg = True
            a += 1
        if b <= a or b - a > 19:
            continue
        v = 0
        good = True
        for j in range(a, b):
            d = np.int64(data[j]) - 48  # int64 in Python too (NumPy keeps uint8)
            if d < 0 or d > 9:
                good = False
                break
            v = v * 10 + d
        if good and v >= 0:  # 19 digits may overflow
            value[i] = -v if neg else v
            ok[i] = True


def _strip_pairs(data, starts, ends, keys_data, keys_offsets, drop, out, out_offsets):
    """Copy every row without the pairs of key ``k`` where ``drop[k, i]``; fills ``out_offsets``."""
    n = len(starts)
    nk = len(keys_offsets) - 1
    w = 0
    out_offsets[0] = 0
    for i in range(n):
        p = starts[i]
        end = ends[i]
        while p < end:
            q = p
            while q < end and data[q] != 2:
                q += 1
            stop = q + 1 if q < end else end  # the pair with its separator
            c = p
            while c < q and data[c] != 1:
                c += 1
            dropped = False
            if c < q:
                for k in range(nk):
                    k0 = keys_offsets[k]
                    if keys_offsets[k + 1] - k0 != c - p:
                        continue
                    same = True
                    for j in range(c - p):
                        if data[p + j] != keys_data[k0 + j]:
                            same = False
                            break
                    if same and drop[k, i]:
                        dropped = True
                        break
            if not dropped:
                out[w:w + (stop - p)] = data[p:stop]
                w += stop - p
            p = stop
        out_offsets[i + 1] = w


#: "00" .. "99" as ASCII, two bytes each, and the powers of ten an int64 holds.
_DIGIT_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode("ascii"),
                             dtype=np.uint8).copy()
_POWERS_OF_TEN = np.array([10 ** i for i in range(19)], dtype=np.int64)


def _write_decimal(out, w, v, pairs, powers):
    """Write ``v`` in decimal at ``out[w:]``; return the end (two digits per division)."""
    if v < 0:
        out[w] = 45
        w += 1
        v = -v
    d = 1
    while d < 19 and v >= powers[d]:
        d += 1
    e = w + d
    while v >= 100:
        r = v % 100
        v //= 100
        e -= 2
        out[e] = pairs[2 * r]
        out[e + 1] = pairs[2 * r + 1]
    if v >= 10:
        out[e - 2] = pairs[2 * v]
        out[e - 1] = pairs[2 * v + 1]
    else:
        out[e - 1] = 48 + v
    return w + d


def _format_int_pairs(names_data, names_offsets, values, present, prefix_data, prefix_starts,
                      prefix_ends, out, out_offsets, pairs, powers):
    """Row ``i``: its prefix, then ``name_k 0x01 values[k, i] 0x02`` for every ``k`` with
    ``present[k, i]``.

    A value equal to the last one written for its name (a run's time, the same enqueue
    time for a whole batch) is copied from where it was written rather than formatted.
    """
    nk, n = values.shape
    last_value = np.zeros(nk, dtype=np.int64)
    last_at = np.full(nk, -1, dtype=np.int64)  # where its digits start in ``out`` (-1: none)
    last_len = np.zeros(nk, dtype=np.int64)
    w = 0
    out_offsets[0] = 0
    for i in range(n):
        for p in range(prefix_starts[i], prefix_ends[i]):
            out[w] = prefix_data[p]
            w += 1
        for k in range(nk):
            if not present[k, i]:
                continue
            for p in range(names_offsets[k], names_offsets[k + 1]):
                out[w] = names_data[p]
                w += 1
            out[w] = 1
            w += 1
            v = values[k, i]
            if last_at[k] >= 0 and v == last_value[k]:
                a = last_at[k]
                for p in range(last_len[k]):
                    out[w + p] = out[a + p]
                e = w + last_len[k]
            else:
                e = _write_decimal(out, w, v, pairs, powers)
                last_value[k] = v
                last_len[k] = e - w
            last_at[k] = w
            out[e] = 2
            w = e + 1
        out_offsets[i + 1] = w


_KERNELS = kernel_set(globals(), helpers=("_write_decimal", "_next_pair"),
                    kernels=("_scan_properties", "_hash_ranges", "_same_as_first", "_distinct_few",
                             "_parse_int_ranges", "_strip_pairs", "_format_int_pairs"))


def _names(names) -> ByteColumn:
    return ByteColumn.of([n.encode("utf-8") if isinstance(n, str) else n for n in names])


def scan_properties(props: ByteColumn | ByteSlices, names
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(found, start, end)``, each ``(len(names), rows)``: the last non-empty value of each
    name in each row, as positions into ``props.data``."""
    n, k = len(props), len(names)
    found = np.zeros((k, n), dtype=np.bool_)
    vstart = np.zeros((k, n), dtype=np.int64)
    vend = np.zeros((k, n), dtype=np.int64)
    if n:
        keys = _names(names)
        _KERNELS(n)["_scan_properties"](props.data, np.ascontiguousarray(props.starts),
                                       np.ascontiguousarray(props.ends), keys.data,
                                       keys.offsets, found, vstart, vend)
    return found, vstart, vend


def hash_ranges(data: np.ndarray, vstart: np.ndarray, vend: np.ndarray) -> np.ndarray:
    """FNV-1a (64 bits) of each ``data[vstart[i]:vend[i]]``."""
    out = np.empty(len(vstart), dtype=np.uint64)
    if len(vstart):
        _KERNELS(len(vstart))["_hash_ranges"](data, np.ascontiguousarray(vstart), np.ascontiguousarray(vend),
                                   out)
    return out


def parse_int_ranges(data: np.ndarray, vstart: np.ndarray, vend: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(value, ok)``: each range as a decimal int64 (optional ``-``; ``ok`` False else)."""
    value = np.zeros(len(vstart), dtype=np.int64)
    ok = np.zeros(len(vstart), dtype=np.bool_)
    if len(vstart):
        _KERNELS(len(vstart))["_parse_int_ranges"](data, np.ascontiguousarray(vstart),
                                        np.ascontiguousarray(vend), value, ok)
    return value, ok


def distinct_values(data: np.ndarray, vstart: np.ndarray, vend: np.ndarray, *,
                    few_only: bool = False) -> tuple[list[bytes], np.ndarray] | None:
    """The distinct values among the ranges and each range's index into them.

    Up to 32 distinct values (the topics or tags of a batch, say) are grouped in one pass
    with a small table; more are grouped by hash (``None`` with ``few_only``), then every
    range is compared with its group's first one; only when two values share a hash (never
    seen in practice) are the rows grouped by their bytes.
    """
    if not len(vstart):
        return [], np.empty(0, np.int64)
    vstart, vend = np.ascontiguousarray(vstart), np.ascontiguousarray(vend)
    table_start, table_end = np.empty(_FEW, dtype=np.int64), np.empty(_FEW, dtype=np.int64)
    ids = np.empty(len(vstart), dtype=np.int64)
    used = _KERNELS(len(vstart))["_distinct_few"](data, vstart, vend, table_start, table_end, ids)
    if used >= 0:
        return ([data[a:b].tobytes() for a, b in zip(table_start[:used].tolist(),
                                                      table_end[:used].tolist())], ids)
    if few_only:
        return None
    hashes = hash_ranges(data, vstart, vend)
    uniq, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if _KERNELS(len(vstart))["_same_as_first"](data, vstart, vend, first[inverse]).all():
        values = [data[vstart[f]:vend[f]].tobytes() for f in first.tolist()]
        return values, inverse.astype(np.int64)
    rows = [data[a:b].tobytes() for a, b in zip(vstart.tolist(), vend.tolist())]
    index: dict[bytes, int] = {}
    ids = np.fromiter((index.setdefault(r, len(index)) for r in rows), np.int64, len(rows))
    return list(index), ids


def strip_pairs(props: ByteColumn | ByteSlices, names, drop: np.ndarray) -> ByteColumn:
    """The rows of ``props`` without the pairs of ``names[k]`` where ``drop[k, i]``."""
    out = np.empty(int(props.lengths().sum()), dtype=np.uint8)
    offsets = np.zeros(len(props) + 1, dtype=np.int64)
    keys = _names(names)
    if len(props):
        _KERNELS(len(props))["_strip_pairs"](props.data, np.ascontiguousarray(props.starts),
                                   np.ascontiguousarray(props.ends), keys.data, keys.offsets,
                                   np.ascontiguousarray(drop, dtype=np.bool_), out, offsets)
    return ByteColumn(out[:int(offsets[-1])], offsets)


def format_int_pairs(names, values: np.ndarray, present: np.ndarray,
                     prefix: ByteColumn | ByteSlices | None = None) -> ByteColumn:
    """Rows of ``name 0x01 decimal 0x02`` pairs: ``values[k, i]`` where ``present[k, i]``
    (``values`` and ``present`` are ``(len(names), rows)``), each after its ``prefix`` row
    (pairs of text values, say) when given."""
    keys = _names(names)
    values = np.ascontiguousarray(values, dtype=np.int64)
    present = np.ascontiguousarray(present, dtype=np.bool_)
    k, n = values.shape
    if prefix is None:
        prefix = ByteSlices(_NO_BYTES, np.zeros(n, np.int64), np.zeros(n, np.int64))
    name_len = np.diff(keys.offsets)
    room = int((present * (name_len + 3 + _MAX_DIGITS)[:, None]).sum()) if n else 0
    room += int(prefix.lengths().sum()) if n else 0
    out = np.empty(room, dtype=np.uint8)
    offsets = np.zeros(n + 1, dtype=np.int64)
    if n:
        _KERNELS(n)["_format_int_pairs"](keys.data, keys.offsets, values, present, prefix.data,
                                        np.ascontiguousarray(prefix.starts),
                                        np.ascontiguousarray(prefix.ends), out, offsets,
                                        _DIGIT_PAIRS, _POWERS_OF_TEN)
    return ByteColumn(out[:int(offsets[-1])], offsets)


def take_rows(column: ByteColumn | ByteSlices, rows: np.ndarray) -> ByteSlices:
    """The rows ``rows`` of ``column`` (in that order; the bytes are not copied)."""
    return ByteSlices(column.data, column.starts[rows], column.ends[rows])
