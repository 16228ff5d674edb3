"""The ``properties`` column of a table of messages (``map<string, string>``): checked and
encoded as user-property strings with Arrow over the whole column.

Used by :mod:`store.table_rows` for both of its paths: the whole-column path takes
:func:`user_property_strings`; the per-row path falls back to :func:`property_dicts` to name
the first bad row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidMessageError
from .message import RESERVED_PROPERTY_NAMES


def _map_column(table: pa.Table) -> pa.ChunkedArray | None:
    """The ``properties`` column (``None`` when the table has none); a typed error when it
    is not a map."""
    if "properties" not in table.column_names:
        return None
    col = table.column("properties")
    if not pa.types.is_map(col.type):
        raise InvalidMessageError(
            f"column properties has type {col.type}; allowed: map<string, string>")
    return col


def property_dicts(table: pa.Table) -> list[dict]:
    """Each row's user properties as a dict (the per-row path; ``{}`` for a null map)."""
    col = _map_column(table)
    if col is None:
        return [{}] * table.num_rows
    return [dict(p) if p else {} for p in col.to_pylist()]


def holds_separator(text: pa.Array) -> bool:
    """Whether any value of a (non-null) string array holds a 0x01 or 0x02 byte: one NumPy
    pass over the values' bytes (a regex per value costs several times more).  ``True`` for
    a type other than string, so that the per-row path names it."""
    wide = pa.types.is_large_string(text.type)
    if not (wide or pa.types.is_string(text.type)):
        return True
    _, offsets, data = text.buffers()
    if data is None or not len(text):
        return False
    width = 8 if wide else 4
    bounds = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32, count=len(text) + 1,
                           offset=text.offset * width)
    raw = np.frombuffer(data, dtype=np.uint8)[int(bounds[0]):int(bounds[-1])]
    return bool(np.count_nonzero((raw == 1) | (raw == 2)))


def user_property_strings(table: pa.Table) -> pa.Array | None:
    """Each row's user properties as ``name 0x01 value 0x02 ...``, built and checked with
    Arrow over the whole map column; ``None`` when a row needs the per-row path (a name or
    value the rules refuse, or a name twice in one row), which then names the bad row."""
    n = table.num_rows
    col = _map_column(table)
    if col is None:
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(
            np.zeros(n + 1, np.int32)), pa.py_buffer(b"")])
    col = col.combine_chunks()
    offsets = col.offsets
    lo, hi = offsets[0].as_py(), offsets[-1].as_py()
    names, values = col.keys.slice(lo, hi - lo), col.items.slice(lo, hi - lo)
    if hi > lo:
        if names.null_count or values.null_count:
            return None
        for text in (names, values):
            if holds_separator(text) or pc.any(
                    pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0)).as_py():
                return None
        if pc.any(pc.is_in(names, value_set=pa.array(sorted(RESERVED_PROPERTY_NAMES)))).as_py() \
                or pc.any(pc.starts_with(names, "__RMQ")).as_py():
            return None
        rows = np.repeat(np.arange(n, dtype=np.int64),
                         np.diff(offsets.to_numpy(zero_copy_only=False)))
        enc = names.dictionary_encode()
        keys = rows * len(enc.dictionary) + enc.indices.to_numpy(zero_copy_only=False)
        keys.sort()
        if len(keys) > 1 and (keys[1:] == keys[:-1]).any():
            return None  # a name twice in one row: the per-row path keeps the last, as a dict
    pairs = pc.binary_join_element_wise(col.keys, col.items, "\x01")
    pairs = pc.binary_join_element_wise(pairs, pa.scalar(""), "\x02")
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, pairs), "")
    return joined.fill_null("")
