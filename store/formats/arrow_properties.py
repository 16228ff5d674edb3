"""Vectorised parsing of CommitLog properties strings (for :mod:`store.arrow_decode`).

A record's PROPERTIES field is ``name 0x01 value 0x02`` repeated (see :mod:`store.formats.record_codec`).  RocketMQ
splits it on 0x02 (a trailing 0x02 may be missing) and keeps a segment as a pair only when
its first 0x01 is neither its first nor its last character: the name precedes that 0x01,
the value is everything after it.  :func:`parse_properties` applies the rule to a whole
column at once, with NumPy on the separator positions, and names every pair's name with a
code: its index in :data:`NAME_LOOKUP` (the system names, the five with a column of their
own first) or -1 for a user property.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .message import (
    PROPERTY_DELIVER_MS,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_UNIQ_KEY,
    SYSTEM_PROPERTY_NAMES,
)

__all__ = ["DELIVER", "KEYS", "NAME_LOOKUP", "SPECIAL_NAMES", "TAGS", "TRANSACTION", "UNIQ",
           "arrow_of", "parse_properties", "split_keys", "string_array"]

#: Property names with a column of their own; their codes are their positions here.
SPECIAL_NAMES = (PROPERTY_UNIQ_KEY, PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_DELIVER_MS,
                 PROPERTY_TRANSACTION_ID)
UNIQ, TAGS, KEYS, DELIVER, TRANSACTION = range(len(SPECIAL_NAMES))
#: Every system name (hidden from the user map); a pair's code indexes this list.
NAME_LOOKUP = (*SPECIAL_NAMES, *sorted(SYSTEM_PROPERTY_NAMES - set(SPECIAL_NAMES)))

_KEYS_TYPE = pa.list_(pa.field("element", pa.string()))
_ARROW_TYPES = {np.dtype(np.int32): pa.int32(), np.dtype(np.int64): pa.int64()}


def arrow_of(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A zero-copy Arrow view of a 1-D int32/int64 NumPy array (``valid``: null where False).

    Builds the array from its buffers: ``pa.array`` would import pandas (a second of start-up)
    to look for pandas types first.
    """
    values = np.ascontiguousarray(values)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(_ARROW_TYPES[values.dtype], len(values),
                                 [bitmap, pa.py_buffer(values)])


def string_array(texts) -> pa.Array:
    """A ``StringArray`` of Python strings, built from its buffers (no pandas import)."""
    data = [t.encode("utf-8") for t in texts]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, data), np.int64, len(data)), out=offsets[1:])
    return pa.StringArray.from_buffers(len(data), pa.py_buffer(offsets),
                                       pa.py_buffer(b"".join(data)))


_NAME_ARRAY = string_array(NAME_LOOKUP)

# System names are looked up by length and first 8 bytes (a little-endian word) in a small
# direct-mapped table.  A name of at most 8 bytes is known exactly by that; a longer name
# that hits the table is confirmed with index_in (a longer user name that misses is a user
# name without any lookup).
_MASK64 = (1 << 64) - 1
_PREFIX_MASK = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [_MASK64], np.uint64)
_SLOT_BITS = 12


def _name_table():
    """``(multipliers, prefixes, lengths, codes)`` of a collision-free table of system names."""
    keys: dict[tuple[int, int], int] = {}
    for code, name in enumerate(n.encode("utf-8") for n in NAME_LOOKUP):
        # names alike in length and first 8 bytes share an entry (only names over 8 bytes
        # can, and those are confirmed with index_in)
        keys.setdefault((int.from_bytes(name[:8].ljust(8, b"\0"), "little"), len(name)), code)
    for seed in range(1, 1000):  # odd multipliers until no two keys share a slot
        mix = (((0x9E3779B97F4A7C15 * seed) | 1) & _MASK64,
               ((0xC2B2AE3D27D4EB4F * seed) | 1) & _MASK64)
        slots = {((p * mix[0] + n * mix[1]) & _MASK64) >> (64 - _SLOT_BITS): (p, n, c)
                 for (p, n), c in keys.items()}
        if len(slots) == len(keys):
            break
    else:  # pragma: no cover - 60 names in 4096 slots
        raise AssertionError("no collision-free table for the system property names")
    size = 1 << _SLOT_BITS
    prefixes = np.zeros(size, np.uint64)
    lengths = np.full(size, -1, np.int32)  # -1: an empty slot (names are never empty)
    codes = np.full(size, -1, np.int32)
    for slot, (p, n, c) in slots.items():
        prefixes[slot], lengths[slot], codes[slot] = p, n, c
    return (np.uint64(mix[0]), np.uint64(mix[1])), prefixes, lengths, codes


_MIX, _TABLE_PREFIX, _TABLE_LENGTH, _TABLE_CODE = _name_table()


def parse_properties(props: pa.Array):
    """Split every row's properties string into pairs with RocketMQ's rule.

    Parameters
    ----------
    props : pyarrow.StringArray
        One properties string per row (valid UTF-8).

    Returns
    -------
    pairs : pyarrow.StringArray
        Elements name, 0x01, value, gap, name, ... : pair ``k``'s name at ``4k``, its value
        at ``4k + 2`` (a view of ``props``' bytes; ``take`` copies what is needed).
    row : ndarray
        The row of each pair.
    code : ndarray
        Each pair's name as an index in :data:`NAME_LOOKUP`, or -1 for a user name.
    map_offsets : ndarray
        ``n + 1`` offsets of each row's user pairs (for the map column).
    user_index : ndarray
        Index in ``pairs`` of each user pair's name, in row order.
    """
    n = len(props)
    _, offsets_buf, data_buf = props.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=props.offset * 4)
    base, stop = int(offsets[0]), int(offsets[-1])
    if stop == base:  # no row has properties
        return (pa.nulls(0, pa.string()), np.empty(0, np.int32), np.empty(0, np.int32),
                np.zeros(n + 1, np.int32), np.empty(0, np.int32))
    data_buf = data_buf.slice(base, stop - base)
    data = np.frombuffer(data_buf, dtype=np.uint8)
    offsets = offsets - base  # int32 positions into data
    sep = np.flatnonzero(data < 3)
    kind = data[sep]
    # The store writes every pair as name 0x01 value 0x02: separators alternate 1, 2, 1, 2
    # and every non-empty row ends in 0x02.  Then pair k lies between sep[2k-1] and sep[2k+1].
    closed = (data[offsets[1:] - 1] == 2) | (offsets[1:] == offsets[:-1])
    regular = (len(sep) % 2 == 0 and (kind.view("<u2") == 0x0201).all() and closed.all())
    per_row = 0  # pairs in every row, when all rows have as many
    if regular:
        ends = sep[1::2]
        per_row = len(ends) // n
        if per_row and len(ends) == per_row * n and (
                ends[per_row - 1::per_row] == offsets[1:] - 1).all():
            # every row holds per_row pairs (its last one ends the row): no search needed
            row_first_segment = np.arange(0, len(ends) + 1, per_row)
        else:
            per_row = 0
            row_first_segment = np.searchsorted(ends, offsets, side="left")
    # every name and value non-empty: separators at least 2 apart, the first one past 0
    if regular and sep[0] >= 1 and (np.diff(sep) >= 2).all():
        # offsets 0, sep0, sep0 + 1, sep1, sep1 + 1, ...: name, 0x01, value, 0x02, name, ...
        sep32 = sep.astype(np.int32)
        pair_offsets = np.empty(2 * len(sep) + 1, dtype=np.int32)
        pair_offsets[0] = 0
        pair_offsets[1::2] = sep32
        pair_offsets[2::2] = sep32 + 1
        row_first_pair = row_first_segment
    else:
        per_row = 0
        if regular:
            split_at = sep[0::2]
            starts = np.zeros(len(ends), dtype=np.int64)
            starts[1:] = ends[:-1] + 1
        else:
            starts, split_at, ends, row_first_segment = _segments(data, offsets, sep, kind)
        valid = (split_at > starts) & (split_at < ends - 1)
        v = np.flatnonzero(valid)
        pair_offsets = np.empty(4 * len(v) + 1, dtype=np.int32)
        pair_offsets[0:-1:4] = starts[v]
        pair_offsets[1:-1:4] = split_at[v]
        pair_offsets[2:-1:4] = split_at[v] + 1
        pair_offsets[3:-1:4] = ends[v]
        pair_offsets[-1] = pair_offsets[-2] if len(v) else 0
        valid_before = np.zeros(len(valid) + 1, dtype=np.int64)
        np.cumsum(valid, out=valid_before[1:])
        row_first_pair = valid_before[row_first_segment]
    n_pairs = int(row_first_pair[-1])
    pairs = pa.StringArray.from_buffers(max(4 * n_pairs - 1, 0), pa.py_buffer(pair_offsets),
                                        data_buf)
    row = np.repeat(np.arange(n, dtype=np.int32), np.diff(row_first_pair))
    name_start = pair_offsets[0:4 * n_pairs:4]
    name_length = pair_offsets[1:4 * n_pairs:4] - name_start
    code = None
    if per_row and n > 1:  # messages of one producer usually repeat one list of names
        code = _repeated_name_codes(data, pairs, name_start, name_length, n, per_row)
    if code is None:
        code = _name_codes(data, pairs, name_start, name_length)
    user = code < 0
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    if user.any():
        np.cumsum(np.bincount(row[user], minlength=n), out=map_offsets[1:])
    return pairs, row, code, map_offsets, np.flatnonzero(user).astype(np.int32) * 4


def _first_words(data: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The 8 bytes from each ``start`` as a little-endian word (zeros past the data)."""
    if len(data) < 8:
        data = np.concatenate([data, np.zeros(8, np.uint8)])
    # word i = the 8 bytes from byte i: one unaligned gather reads every name's start
    words = np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    at = np.minimum(start, len(data) - 8)
    word = words[at]
    late = at != start  # a name in the last 8 bytes: its word starts earlier
    if late.any():
        word[late] >>= ((start - at)[late] * 8).astype(np.uint64)
    return word


def _repeated_name_codes(data: np.ndarray, pairs: pa.Array, start: np.ndarray,
                         length: np.ndarray, n: int, per_row: int) -> np.ndarray | None:
    """Codes when all ``n`` rows name their ``per_row`` pairs alike (else ``None``).

    Comparing each name with the first row's (length, first 8 bytes, and every byte of
    names longer than 8) is cheaper than looking every name up; the first row is looked up.
    """
    lengths = length.reshape(n, per_row)
    first = lengths[0]
    if not (lengths == first).all():
        return None
    prefixes = _first_words(data, start).reshape(n, per_row) & _PREFIX_MASK[np.minimum(first, 8)]
    if not (prefixes == prefixes[0]).all():
        return None
    long_names = np.flatnonzero(first > 8)
    if len(long_names):
        # the rest of each long name as 8-byte words (the last one ending with the name),
        # all gathered at once and compared with the first row's
        cols = [(j, k) for j in long_names.tolist()
                for k in [*range(8, int(first[j]) - 8, 8), int(first[j]) - 8]]
        at = start.reshape(n, per_row)[:, [j for j, _ in cols]] + np.array([k for _, k in cols])
        words = np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
        if not (words[at] == words[at[0]]).all():
            return None
    return np.tile(_name_codes(data, pairs, start[:per_row], length[:per_row]), n)


def _name_codes(data: np.ndarray, pairs: pa.Array, start: np.ndarray,
                length: np.ndarray) -> np.ndarray:
    """Code of each pair's name ``data[start:start + length]`` (see :func:`parse_properties`)."""
    if len(start) == 0:
        return np.empty(0, np.int32)
    prefix = _first_words(data, start) & _PREFIX_MASK[np.minimum(length, 8)]
    wide = length.astype(np.uint64)
    slot = ((prefix * _MIX[0] + wide * _MIX[1]) >> np.uint64(64 - _SLOT_BITS)).astype(np.intp)
    hit = (_TABLE_LENGTH[slot] == length) & (_TABLE_PREFIX[slot] == prefix)
    code = np.where(hit, _TABLE_CODE[slot], -1).astype(np.int32)
    check = np.flatnonzero(hit & (length > 8))
    if len(check):  # long names sharing a system name's length and first 8 bytes
        found = pc.index_in(pairs.take(arrow_of(check.astype(np.int32) * 4)),
                            value_set=_NAME_ARRAY)
        code[check] = found.fill_null(-1).to_numpy(zero_copy_only=False)
    return code


def _segments(data: np.ndarray, offsets: np.ndarray, sep: np.ndarray, kind: np.ndarray):
    """Segments of irregular property strings: ``(starts, first 0x01, ends, row firsts)``.

    Handles NUL bytes, a missing trailing 0x02, several or no 0x01 in a segment.  A segment
    without 0x01 gets -1, which the caller's rule rejects.
    """
    n = len(offsets) - 1
    keep = kind != 0
    sep, kind = sep[keep], kind[keep]
    row_ends = offsets[1:].astype(np.int64)
    open_rows = np.flatnonzero((np.diff(offsets) > 0) & (data[row_ends - 1] != 2))
    real_ends = sep[kind == 2]
    # An open row's last segment ends at the row's end: a virtual end (kind 3) placed there,
    # before any separator at that same position (which belongs to the next row).
    if len(open_rows):
        at = np.searchsorted(sep, row_ends[open_rows], side="left")
        sep = np.insert(sep, at, row_ends[open_rows])
        kind = np.insert(kind, at, 3)
    is_end = kind >= 2
    ends = sep[is_end]
    virtual = kind[is_end] == 3
    # segments before each row: real 0x02 before the row's start, plus earlier open rows
    row_first_segment = np.searchsorted(real_ends, offsets, side="left")
    if len(open_rows):
        opened = np.zeros(n + 1, dtype=np.int64)
        opened[open_rows + 1] = 1
        row_first_segment = row_first_segment + np.cumsum(opened)
    starts = np.zeros(len(ends), dtype=np.int64)
    starts[1:] = ends[:-1] + 1
    after_virtual = np.flatnonzero(virtual[:-1]) + 1  # the first segment of the next row
    if len(after_virtual):
        segment_row = np.repeat(np.arange(n), np.diff(row_first_segment))
        starts[after_virtual] = offsets[segment_row[after_virtual]]
    # first 0x01 of each segment: a 0x01 belongs to the segment of the ends seen before it
    ends_before = np.cumsum(is_end) - is_end
    ones = np.flatnonzero(~is_end)
    one_segment = ends_before[ones]
    first = np.ones(len(ones), dtype=bool)
    first[1:] = one_segment[1:] != one_segment[:-1]
    split_at = np.full(len(ends), -1, dtype=np.int64)
    split_at[one_segment[first]] = sep[ones[first]]
    return starts, split_at, ends, row_first_segment


def split_keys(values: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """The ``keys`` column: ``values`` (the KEYS of ``rows``) split on spaces, empty pieces
    dropped; a row without KEYS gets ``[]``."""
    counts = np.zeros(n, dtype=np.int32)
    _, offsets_buf, data_buf = values.buffers()
    if len(values):
        offsets = np.frombuffer(offsets_buf, np.int32, count=len(values) + 1,
                                offset=values.offset * 4)
        data = np.frombuffer(data_buf, np.uint8)[offsets[0]:offsets[-1]]
    else:
        data = np.empty(0, np.uint8)
    if not (data == 0x20).any():  # one key per row (the usual case): no split needed
        counts[rows] = 1
    else:
        pieces = pc.split_pattern(values, " ")
        flat = pc.list_flatten(pieces)
        parent = pc.list_parent_indices(pieces).to_numpy()
        nonempty = pc.greater(pc.binary_length(flat), 0).to_numpy(zero_copy_only=False)
        counts = np.bincount(rows[parent[nonempty]], minlength=n).astype(np.int32)
        values = flat.filter(nonempty)
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    return pa.ListArray.from_arrays(arrow_of(list_offsets), values, type=_KEYS_TYPE)
