"""The Arrow columns of the ``messages`` view, built from decoded record fields.

:data:`MESSAGE_SCHEMA` is the view's schema; :func:`columns` turns the header fields, bodies,
topics and properties :mod:`store.core.arrow_decode` gathered into its columns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..arrow_properties import (
    DELIVER,
    KEYS,
    SPECIAL_NAMES,
    TAGS,
    TRANSACTION,
    UNIQ,
    arrow_of,
    parse_properties,
    split_keys,
    string_array,
)
from ..codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from ..errors import CorruptRecordError
from ..message import PROPERTY_DELIVER_MS

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_KEYS_TYPE = pa.list_(pa.field("element", pa.string()))
_PROPERTIES_TYPE = pa.map_(pa.field("key", pa.string(), nullable=False),
                           pa.field("value", pa.string()))

#: The Arrow schema of the ``messages`` view: exactly what Spark makes of ``rmq_source``'s
#: ``MESSAGE_SPARK_DDL`` (``to_arrow_schema(..., timezone="UTC")``; a test checks it),
#: hard-coded so ``store`` never imports Spark.
MESSAGE_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("queue_id", pa.int32()),
    pa.field("queue_offset", pa.int64()),
    pa.field("commitlog_offset", pa.int64()),
    pa.field("msg_id", pa.string()),
    pa.field("tags", pa.string()),
    pa.field("keys", _KEYS_TYPE),
    pa.field("body", pa.binary()),
    pa.field("properties", _PROPERTIES_TYPE),
    pa.field("born_timestamp", _TIMESTAMP),
    pa.field("store_timestamp", _TIMESTAMP),
    pa.field("deliver_timestamp", _TIMESTAMP),
    pa.field("transaction_id", pa.string()),
    pa.field("reconsume_times", pa.int32()),
])

#: ConsumeQueue size of a filler unit in front of a queue that starts above 0 (no message).
#: Bytes of records scanned per step: what the header and tail passes find in L2 cache.

def empty_batch() -> pa.RecordBatch:
    """A batch with :data:`MESSAGE_SCHEMA` and no rows."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in MESSAGE_SCHEMA],
                                      schema=MESSAGE_SCHEMA)


def repeat_string(value: bytes, n: int) -> pa.Array:
    """A string column holding ``value`` ``n`` times (built without a per-row loop)."""
    offsets = np.arange(0, (n + 1) * len(value), len(value) or 1, dtype=np.int32)
    if not value:
        offsets[:] = 0
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(value * n))


# --------------------------------------------------------------------------- columns


def columns(header, phys, queue_offsets, body, topic_arr, props_bin) -> list[pa.Array]:
    """The 14 columns of :data:`MESSAGE_SCHEMA` for one block of records."""
    n = len(phys)
    props = props_bin.view(pa.string())
    try:
        props.validate(full=True)
    except pa.ArrowInvalid:
        # Not UTF-8 (damaged or foreign data): decode as record_view does, replacing errors.
        props = string_array(b.decode("utf-8", errors="replace") for b in props_bin.to_pylist())
    pairs, row, code, map_offsets, user_index = parse_properties(props)
    # Per special name, the pair holding its value in each row (-1: none).  Later pairs
    # overwrite earlier ones, as dict() does in decode_properties.
    special = np.flatnonzero((code >= 0) & (code < len(SPECIAL_NAMES)))
    index = np.full((len(SPECIAL_NAMES), n), -1, dtype=np.int32)
    index.reshape(-1)[code[special] * n + row[special]] = special * 4 + 2
    is_commit = (header["sys_flag"] & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE
    if (index[TRANSACTION] >= 0).any():
        index[TRANSACTION, ~is_commit] = -1
    keys_rows = np.flatnonzero(index[KEYS] >= 0)
    # One take copies every value the columns need: the special columns (null where absent),
    # the KEYS values of the rows having one, then the user map's names and values.
    present = [c for c in (UNIQ, TAGS, DELIVER, TRANSACTION) if (index[c] >= 0).any()]
    wanted = np.concatenate([*(index[c] for c in present), index[KEYS, keys_rows],
                             user_index, user_index + 2])
    missing = wanted < 0
    values = pairs.take(arrow_of(wanted, ~missing if missing.any() else None))
    special_columns = {c: values.slice(i * n, n) for i, c in enumerate(present)}
    at = len(present) * n
    keys_values = values.slice(at, len(keys_rows))
    at += len(keys_rows)
    properties = pa.MapArray.from_arrays(
        arrow_of(map_offsets), values.slice(at, len(user_index)),
        values.slice(at + len(user_index), len(user_index)), type=_PROPERTIES_TYPE)

    def special_column(c: int) -> pa.Array:
        column = special_columns.get(c)
        return pa.nulls(n, pa.string()) if column is None else column

    msg_id = special_column(UNIQ)
    if msg_id.null_count:
        msg_id = msg_id.fill_null("")
    deliver = special_columns.get(DELIVER)
    deliver_us = pa.nulls(n, _TIMESTAMP) if deliver is None else _deliver_us(deliver, phys)
    return [
        topic_arr,
        arrow_of(header["queue_id"]),
        arrow_of(queue_offsets),
        arrow_of(phys),
        msg_id,
        special_column(TAGS),
        split_keys(keys_values, keys_rows, n),
        body,
        properties,
        _timestamps(header["born_timestamp"]),
        _timestamps(header["store_timestamp"]),
        deliver_us,
        special_column(TRANSACTION),
        arrow_of(header["reconsume_times"]),
    ]


def _deliver_us(deliver: pa.Array, phys: np.ndarray) -> pa.Array:
    """``__RMQ_DELIVER_MS`` values (decimal ms) as µs timestamps."""
    try:
        ms = deliver.cast(pa.int64())
    except pa.ArrowInvalid:
        bad = next(i for i, v in enumerate(deliver.to_pylist()) if v is not None
                   and not v.strip().lstrip("+-").isdigit())
        raise CorruptRecordError("commitlog", int(phys[bad]), f"property {PROPERTY_DELIVER_MS}="
                                 f"{deliver[bad].as_py()!r}; allowed: epoch ms") from None
    return pc.multiply(ms, 1000).cast(_TIMESTAMP)


def _timestamps(us: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(_TIMESTAMP, len(us), [None, pa.py_buffer(us)])
