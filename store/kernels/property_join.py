"""Properties strings of whole tables, joined in one compiled pass.

A record written by ``send_table`` or staged by the Spark sink carries, in this order (the
order a single send writes them, :mod:`store.formats.record_codec`)::

    user pairs    name 0x01 value 0x02 ...   (from the map column's entries, may be none)
    TAGS          "TAGS" 0x01 tag 0x02        when the row has a tag
    KEYS          "KEYS" 0x01 keys 0x02       when the row has keys (not empty)
    UNIQ_KEY      "UNIQ_KEY" 0x01 id 0x02     always: the 32-character message id

:func:`join_properties` sizes every row with NumPy, then one loop copies the parts of every
row into one buffer, the user pairs straight from the map column's names and values.  It
replaces five Arrow ``binary_join_element_wise`` / ``binary_join`` passes (each a buffer of
its own).

:func:`plain_keys` checks a keys column for what a single send would change or refuse with
one loop over the bytes: it flags the rows that need a closer look (see there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..formats.message import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from .property_scan import distinct_values
from ..base.jit import kernel_set
from ..formats.byte_columns import ByteColumn, empty_column, one_array
from .record_assembly import memcpy_function


@dataclass(frozen=True, slots=True)
class UserPairs:
    """Each row's user properties as (name, value) pairs, not yet joined: row ``i``'s pairs
    are entries ``starts[i]`` to ``ends[i]`` of ``names`` and ``values`` (a null map: none),
    as :func:`store.produce.table_properties.user_property_pairs` checks them out of a map column.
    :func:`join_properties` writes them as ``name 0x01 value 0x02 ...`` straight into the
    properties strings."""

    starts: np.ndarray
    ends: np.ndarray
    names: ByteColumn
    values: ByteColumn

    def __len__(self) -> int:
        return len(self.starts)

    @classmethod
    def empty(cls, n: int) -> UserPairs:
        none = np.zeros(n, np.int64)
        return cls(none, none, empty_column(0), empty_column(0))


_TAGS = np.frombuffer(f"{PROPERTY_TAGS}\x01".encode("ascii"), np.uint8)
_KEYS = np.frombuffer(f"{PROPERTY_KEYS}\x01".encode("ascii"), np.uint8)
_UNIQ = np.frombuffer(f"{PROPERTY_UNIQ_KEY}\x01".encode("ascii"), np.uint8)


def _join(u_starts, u_ends, name_data, name_offsets, value_data, value_offsets, tag_data,
          tag_offsets, tag_on, key_data, key_offsets, key_on, ids, out, out_offsets,
          tag_prefix, key_prefix, id_prefix, mc):
    """Row ``i`` of ``out`` (from ``out_offsets[i]``): its user pairs (entries
    ``u_starts[i]:u_ends[i]``, each ``name 0x01 value 0x02``), then its TAGS pair if
    ``tag_on[i]``, its KEYS pair if ``key_on[i]``, then its UNIQ_KEY pair (``ids[i]``, a
    C-contiguous ``(n, width)`` array; none when ids are 0 characters long).

    Every step is written out in the loop (no helper function) and the id is copied with C's
    ``memcpy`` (``mc``, :func:`~store.kernels.record_assembly.memcpy_function`): a helper per pair
    and a byte loop for the id measured 2x slower (51 against 26 ns per row of 67 bytes)."""
    po = out.ctypes.data
    pid = ids.ctypes.data
    width = ids.shape[1]
    for i in range(len(out_offsets) - 1):
        p = out_offsets[i]
        for e in range(u_starts[i], u_ends[i]):
            for j in range(name_offsets[e], name_offsets[e + 1]):
                out[p] = name_data[j]
                p += 1
            out[p] = 1
            p += 1
            for j in range(value_offsets[e], value_offsets[e + 1]):
                out[p] = value_data[j]
                p += 1
            out[p] = 2
            p += 1
        if tag_on[i]:
            for j in range(len(tag_prefix)):
                out[p + j] = tag_prefix[j]
            p += len(tag_prefix)
            for j in range(tag_offsets[i], tag_offsets[i + 1]):
                out[p] = tag_data[j]
                p += 1
            out[p] = 2
            p += 1
        if key_on[i]:
            for j in range(len(key_prefix)):
                out[p + j] = key_prefix[j]
            p += len(key_prefix)
            for j in range(key_offsets[i], key_offsets[i + 1]):
                out[p] = key_data[j]
                p += 1
            out[p] = 2
            p += 1
        if width:
            for j in range(len(id_prefix)):
                out[p + j] = id_prefix[j]
            p += len(id_prefix)
            mc(po + p, pid + i * width, width)
            out[p + width] = 2


def _plain_keys(data, offsets, out):
    """``out[i]``: 0 when row ``i`` is plainly valid keys (ASCII, space-separated parts with
    no other whitespace and no 0x01 / 0x02, no space at either end or twice in a row),
    1 when it holds a byte of 0x80 or more (to be checked as text), 2 when it is not plain."""
    n = len(offsets) - 1
    for i in range(n):
        a, b = offsets[i], offsets[i + 1]
        verdict = 0
        if b > a and (data[a] == 32 or data[b - 1] == 32):
            verdict = 2
        prev = 0
        for j in range(a, b):
            c = data[j]
            if c >= 128:
                verdict = max(verdict, 1)
            elif c < 32 or c == 127 or (c == 32 and prev == 32):
                verdict = 2
                break
            prev = c
        out[i] = verdict


def _row_lengths(u_starts, u_ends, name_offsets, value_offsets, tag_offsets, tag_on,
                 key_offsets, key_on, tag_fixed, key_fixed, id_fixed, out):
    """``out[i]``: the length of row ``i``'s properties string as :func:`_join` writes it
    (``*_fixed``: the bytes a pair adds around its value); clears ``key_on[i]`` for empty
    keys.  One pass, no temporary column (each NumPy temporary of a 2M-row table is 16 MB
    of fresh pages)."""
    for i in range(len(out)):
        size = id_fixed
        for e in range(u_starts[i], u_ends[i]):
            size += (name_offsets[e + 1] - name_offsets[e]
                     + value_offsets[e + 1] - value_offsets[e] + 2)
        if tag_on[i]:
            size += tag_offsets[i + 1] - tag_offsets[i] + tag_fixed
        key_len = key_offsets[i + 1] - key_offsets[i]
        if key_on[i] and key_len > 0:
            size += key_len + key_fixed
        else:
            key_on[i] = False
        out[i] = size


_kernels = kernel_set(globals(), kernels=("_join", "_plain_keys", "_row_lengths"))


def _parts(arr: pa.Array | None, n: int):
    """``(data, offsets, present)`` of an Arrow string array (``present``: not null and,
    for keys, not empty), or empty parts when there is no column."""
    if arr is None:
        return np.zeros(0, np.uint8), np.zeros(n + 1, np.int64), np.zeros(n, np.bool_)
    arr = one_array(arr)
    col = ByteColumn.from_arrow(arr)  # nulls read as empty
    if arr.null_count:
        present = arr.is_valid().to_numpy(zero_copy_only=False)
    else:
        present = np.ones(n, np.bool_)
    return col.data, col.offsets, present


@dataclass(frozen=True, slots=True)
class PropertyParts:
    """Each row's properties string, not joined yet: the parts :func:`join_properties`
    joins, sized already.  ``send_table`` keeps a table's properties so and joins each chunk
    on the thread that encodes it (:meth:`column`), rather than the whole table before its
    first append.  Used wherever a :class:`~store.formats.byte_columns.ByteColumn` of properties
    is sized or sliced (:meth:`lengths`, :meth:`slice`)."""

    users: UserPairs
    tag_data: np.ndarray
    tag_offsets: np.ndarray
    tag_on: np.ndarray
    key_data: np.ndarray
    key_offsets: np.ndarray
    key_on: np.ndarray
    ids: np.ndarray
    row_lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.row_lengths)

    def lengths(self) -> np.ndarray:
        return self.row_lengths

    def slice(self, lo: int, hi: int) -> PropertyParts:
        """Rows ``[lo, hi)`` (shares every buffer)."""
        u = self.users
        return PropertyParts(UserPairs(u.starts[lo:hi], u.ends[lo:hi], u.names, u.values),
                             self.tag_data, self.tag_offsets[lo:hi + 1], self.tag_on[lo:hi],
                             self.key_data, self.key_offsets[lo:hi + 1], self.key_on[lo:hi],
                             self.ids[lo:hi], self.row_lengths[lo:hi])

    def column(self) -> ByteColumn:
        """The rows' properties strings, joined by one compiled pass."""
        n = len(self)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(self.row_lengths, out=offsets[1:])
        out = np.empty(int(offsets[-1]), np.uint8)
        u = self.users
        _kernels(n)["_join"](u.starts, u.ends, u.names.data, u.names.offsets, u.values.data,
                            u.values.offsets, self.tag_data, self.tag_offsets, self.tag_on,
                            self.key_data, self.key_offsets, self.key_on,
                            np.ascontiguousarray(self.ids), out, offsets, _TAGS, _KEYS, _UNIQ,
                            memcpy_function())
        return ByteColumn(out, offsets)


def property_parts(users: UserPairs, tags: pa.Array | None = None,
                   keys: pa.Array | None = None, ids: np.ndarray | None = None) -> PropertyParts:
    """The parts of every row's properties string, sized (see :func:`join_properties` for
    the arguments)."""
    n = len(users)
    if ids is None:
        ids = np.zeros((n, 0), np.uint8)
    tag_data, tag_offsets, tag_on = _parts(tags, n)
    key_data, key_offsets, key_on = _parts(keys, n)
    lengths = np.empty(n, np.int64)
    _kernels(n)["_row_lengths"](users.starts, users.ends, users.names.offsets,
                               users.values.offsets, tag_offsets, tag_on, key_offsets, key_on,
                               len(_TAGS) + 1, len(_KEYS) + 1,
                               len(_UNIQ) + ids.shape[1] + 1 if ids.shape[1] else 0, lengths)
    return PropertyParts(users, tag_data, tag_offsets, tag_on, key_data, key_offsets, key_on,
                         ids, lengths)


def join_properties(users: UserPairs, tags: pa.Array | None = None,
                    keys: pa.Array | None = None, ids: np.ndarray | None = None) -> ByteColumn:
    """Every row's properties string (see the module doc).

    ``users``: each row's user pairs (:class:`~store.produce.table_properties.UserPairs`);
    ``tags`` / ``keys``: Arrow string arrays (a null tag writes no TAGS pair; null or empty
    keys no KEYS pair), or ``None``; ``ids``: the ``(n, 32)`` uint8 characters of the
    message ids (``None``: no UNIQ_KEY pair, the user pairs alone).
    """
    return property_parts(users, tags, keys, ids).column()


def plain_keys(keys: pa.Array) -> np.ndarray:
    """Per row of an Arrow string array: 0 plainly valid keys, 1 holds non-ASCII text (check
    it as text), 2 not plain (the per-row path normalises or refuses it).  Nulls are 0."""
    data, offsets, _ = _parts(keys, len(keys))
    out = np.empty(len(offsets) - 1, np.uint8)
    _kernels(len(out))["_plain_keys"](data, offsets, out)
    return out


def distinct_strings(arr: pa.Array) -> tuple[list[str], np.ndarray]:
    """The distinct values of a string array (one chunk) in order of first appearance, and
    each row's index into them (``len(values)`` for a null row).

    Up to 32 values in a column without nulls (a table's topics, its tags) are grouped in one
    compiled pass over the bytes, half of ``dictionary_encode``'s time (2M rows of one
    value: 11.6 against 22.2 ms); other columns are dictionary-encoded by Arrow.
    """
    if not arr.null_count:
        col = ByteColumn.from_arrow(arr)
        found = distinct_values(col.data, col.starts, col.ends, few_only=True)
        if found is not None:
            return [v.decode() for v in found[0]], found[1]
    enc = arr.dictionary_encode()
    values = enc.dictionary.to_pylist()
    ids = enc.indices.fill_null(len(values)).to_numpy(zero_copy_only=False).astype(np.int64)
    return values, ids
