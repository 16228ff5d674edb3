"""The ``properties`` column of a table of messages (``map<string, string>``): checked over
the whole column (distinct names in Python, values and repeated names by compiled passes)
and handed on as pairs, which :mod:`store.kernels.property_join` writes into the properties strings.

Used by :mod:`store.produce.table_rows` for both of its paths: the whole-column path takes
:func:`user_property_pairs`; the per-row path falls back to :func:`property_dicts` to name
the first bad row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..base.errors import InvalidMessageError
from ..formats.record_codec import PROPERTIES_SEPARATOR, PROPERTY_SEPARATOR
from ..formats.message import RESERVED_PROPERTY_NAMES
from ..kernels.property_join import UserPairs, distinct_strings
from ..base.jit import kernel_set
from ..formats.byte_columns import ByteColumn, checked_offsets, one_array


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


def user_property_pairs(table: pa.Table) -> UserPairs | None:
    """Each row's user properties, checked over the whole map column; ``None`` when a row
    needs the per-row path (a name or value the rules refuse, or a name twice in one row),
    which then names the bad row.

    Distinct names (:func:`~store.kernels.property_join.distinct_strings`) are checked in Python
    (few); values by one compiled pass over their bytes, and with Arrow only those holding
    non-ASCII text; a name twice in a row by one compiled pass over the names' ids.
    """
    n = table.num_rows
    col = _map_column(table)
    if col is None:
        return UserPairs.empty(n)
    text = (pa.types.is_string, pa.types.is_large_string)
    if not any(f(col.type.key_type) for f in text) or not any(f(col.type.item_type)
                                                            for f in text):
        return None  # the per-row path names the row
    col = one_array(col)
    offsets = checked_offsets(col.offsets.to_numpy(zero_copy_only=False),  # int32: 16 MB less
                              len(col.keys), "column properties")
    starts = offsets[:-1]
    ends = offsets[1:]
    if col.null_count:  # a null map has no pairs, wherever its offsets point
        ends = np.where(col.is_valid().to_numpy(zero_copy_only=False), ends, starts)
    lo, hi = int(offsets[0]), int(offsets[-1])
    names, values = col.keys.slice(lo, hi - lo), col.items.slice(lo, hi - lo)
    if hi > lo:
        if names.null_count or values.null_count:
            return None
        distinct, name_ids = distinct_strings(names)
        for name in distinct:
            if (PROPERTY_SEPARATOR in name or PROPERTIES_SEPARATOR in name or not name.strip()
                    or name in RESERVED_PROPERTY_NAMES or name.startswith("__RMQ")):
                return None
        if not _plain_values(values):
            return None
        found = np.zeros(1, np.int64)
        _kernels(len(starts))["_twice"](starts - lo, ends - lo, name_ids, found)
        if found[0]:
            return None  # a name twice in one row: the per-row path keeps the last, as a dict
    return UserPairs(starts, ends, ByteColumn.from_arrow(col.keys),
                     ByteColumn.from_arrow(col.items))


def _plain_values(values: pa.Array) -> bool:
    """No value holds 0x01 / 0x02 or is only whitespace (as ``str.strip`` sees it)."""
    col = ByteColumn.from_arrow(values)
    verdict = np.empty(len(col), np.uint8)
    _kernels(len(col))["_value_verdicts"](col.data, col.offsets, verdict)
    if (verdict == 2).any():
        return False
    text = np.flatnonzero(verdict == 1)
    return not (len(text) and any_blank(values.take(pa.array(text))))


def any_blank(text) -> bool:
    """Whether any value of an Arrow string array is only whitespace (empty included), as
    ``str.strip`` sees whitespace (Arrow's ``utf8_trim_whitespace`` agrees with it on every
    code point)."""
    return bool(pc.any(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0)).as_py())


def _value_verdicts(data, offsets, out):
    """``out[i]``: 2 when value ``i`` holds 0x01 / 0x02 or is only ASCII whitespace (empty
    included), 1 when it is only whitespace and bytes of 0x80 or more (Arrow decides), else 0."""
    for i in range(len(offsets) - 1):
        blank, text, bad = True, False, False
        for j in range(offsets[i], offsets[i + 1]):
            c = data[j]
            if c == 1 or c == 2:
                bad = True
                break
            if c >= 128:
                text = True
            elif not (c == 32 or 9 <= c <= 13 or 28 <= c <= 31):
                blank = False
        out[i] = 2 if bad or (blank and not text) else (1 if blank else 0)


def _twice(starts, ends, ids, found):
    """``found[0] = 1`` when some row's entries ``starts[i]:ends[i]`` repeat an id."""
    for i in range(len(starts)):
        for a in range(starts[i], ends[i]):
            for b in range(a + 1, ends[i]):
                if ids[a] == ids[b]:
                    found[0] = 1
                    return


_kernels = kernel_set(globals(), kernels=("_value_verdicts", "_twice"))
