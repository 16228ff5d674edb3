"""A table of keyed timer messages for ``producer.replace_table``: the ``key`` column
becomes each row's ``RMQ_DELAY_KEY`` property and the delay a ``delay_ms`` of at least 1 ms.

Whole columns, no Python per row: the key pair is spliced into the ``properties`` map column
(or makes it) with one take over the map's entries, and the delays are one Arrow compute
expression.  A row due now (``delay_ms`` 0, a ``deliver_at`` not in the future) keeps 1 ms,
so it still goes through the timer and replaces.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..base.errors import InvalidBatchError, InvalidDelayError
from ..formats.message import PROPERTY_DELAY_KEY
from ..timer.delay_keys import checked_key_array
from .table_rows import _epoch_ms_ceil


def keyed_table(table: pa.Table, now: int) -> pa.Table:
    """A table with a ``key`` column (``replace_table``, the sink's keyed rows) checked
    whole and turned into what ``send_table`` takes (:func:`with_delay_key`); a typed error
    names what is wrong before anything is stored."""
    checked_key_column(table)
    if "delay_level" in table.column_names and \
            table.column("delay_level").null_count < table.num_rows:
        raise InvalidDelayError("rows with a key and a delay_level; allowed: delay_ms or "
                                "deliver_at (delay levels cannot be replaced)")
    delays = [c for c in ("delay_ms", "deliver_at") if c in table.column_names]
    if not delays:
        raise InvalidDelayError("rows with a key need one of the columns delay_ms, "
                                "deliver_at, with a value in every row")
    given = None
    for c in delays:
        valid = table.column(c).is_valid()
        given = valid if given is None else pc.or_(given, valid)
    if not pc.all(given).as_py():
        raise InvalidDelayError("a row with a key has no delay_ms or deliver_at; allowed: "
                                "one of them in every keyed row")
    if "delay_level" in table.column_names:
        table = table.drop_columns(["delay_level"])
    return with_delay_key(table, now)


def checked_key_column(table: pa.Table) -> pa.Array:
    """The table's ``key`` column, checked whole (there, strings, no nulls, each a valid
    key); a typed error names what is wrong."""
    if "key" not in table.column_names:
        raise InvalidBatchError("replace_table: no key column; allowed: the columns of "
                                "send_table plus a string column key")
    keys_col = table.column("key")
    if not (pa.types.is_string(keys_col.type) or pa.types.is_large_string(keys_col.type)):
        raise InvalidBatchError(f"column key has type {keys_col.type}; allowed: string")
    if keys_col.null_count:
        raise InvalidBatchError("column key has nulls; allowed: a key per row")
    return checked_key_array(keys_col)


def with_delay_key(table: pa.Table, now: int) -> pa.Table:
    """``table`` (checked by the caller: a string ``key`` column without nulls, one of
    ``delay_ms`` / ``deliver_at`` without nulls) as :func:`send_table` takes it."""
    keys = table.column("key").combine_chunks()
    if pa.types.is_large_string(keys.type):
        keys = keys.cast(pa.string())
    n = table.num_rows
    props = _spliced_properties(table, keys, n)
    delay = _delay_ms(table, now)
    drop = [c for c in ("key", "properties", "delay_ms", "deliver_at") if c in table.column_names]
    table = table.drop_columns(drop)
    return table.append_column("properties", props).append_column("delay_ms", delay)


def _spliced_properties(table: pa.Table, keys: pa.Array, n: int) -> pa.Array:
    """Each row's properties map with ``RMQ_DELAY_KEY = key`` appended (a pair of that name
    already there is dropped)."""
    names = pa.array(np.full(n, PROPERTY_DELAY_KEY, dtype=object), pa.string())
    if "properties" not in table.column_names:
        offsets = pa.array(np.arange(n + 1, dtype=np.int32))
        return pa.MapArray.from_arrays(offsets, names, keys)
    col = table.column("properties").combine_chunks()
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    col = col.cast(pa.map_(pa.string(), pa.string()))
    old_keys, old_items = col.keys, col.items
    offsets = np.frombuffer(col.offsets.buffers()[1], dtype=np.int32,
                            count=len(col) + 1 + col.offset)[col.offset:].astype(np.int64)
    lo = int(offsets[0])
    # the entries of the map, without pairs named RMQ_DELAY_KEY
    entry_keys = old_keys.slice(lo, int(offsets[-1]) - lo)
    entry_items = old_items.slice(lo, int(offsets[-1]) - lo)
    keep = ~np.asarray(pc.equal(entry_keys, PROPERTY_DELAY_KEY).fill_null(False)
                       .to_numpy(zero_copy_only=False), dtype=bool)
    row_of = np.repeat(np.arange(n), np.diff(offsets))
    keep &= valid[row_of]  # a null map has no pairs, wherever its offsets point
    kept_rows = row_of[keep]
    counts = np.bincount(kept_rows, minlength=n) + 1
    new_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    # positions: the kept entries in order, then each row's key pair at its row's end
    m = int(new_offsets[-1])
    take = np.empty(m, dtype=np.int64)
    key_at = new_offsets[1:] - 1
    is_key = np.zeros(m, dtype=bool)
    is_key[key_at] = True
    kept_idx = np.flatnonzero(keep)
    take[~is_key] = kept_idx
    take[key_at] = len(entry_keys) + np.arange(n)
    all_keys = pa.concat_arrays([entry_keys.cast(pa.string()), names])
    all_items = pa.concat_arrays([entry_items.cast(pa.string()), keys])
    idx = pa.array(take)
    return pa.MapArray.from_arrays(pa.array(new_offsets.astype(np.int32)),
                                   all_keys.take(idx), all_items.take(idx))


def _delay_ms(table: pa.Table, now: int) -> pa.Array:
    """Each row's delay from ``now`` in ms (its ``delay_ms``, or its ``deliver_at`` less
    ``now``), at least 1."""
    out = None
    if "delay_ms" in table.column_names:
        raw = table.column("delay_ms").combine_chunks().cast(pa.int64())
        low = pc.min(raw).as_py()
        if low is not None and low < 0:
            raise InvalidDelayError(f"delay_ms={low}; allowed: an int from 0 to "
                                    "timer_max_delay_ms")
        out = raw
    if "deliver_at" in table.column_names:
        col = table.column("deliver_at")
        if pa.types.is_timestamp(col.type):
            col = _epoch_ms_ceil(col)
        at = pc.subtract(col.combine_chunks().cast(pa.int64()), now)
        out = at if out is None else pc.if_else(out.is_valid(), out, at)
    return pc.max_element_wise(out, 1)
