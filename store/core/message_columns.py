"""The Arrow columns of the ``messages`` view, built from decoded record fields.

:data:`MESSAGE_SCHEMA` is the view's schema; :func:`columns` turns the header fields, bodies,
topics and properties :mod:`store.core.arrow_decode` gathered into its columns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..formats.arrow_properties import (
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
from ..formats.record_codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from ..base.errors import CorruptRecordError
from ..formats.message import PROPERTY_DELIVER_MS, MessageView

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

#: Columns whose values come from the properties (the rest come from the header, the body
#: and the topic): a projection without them never parses a properties string.
PROPERTY_COLUMNS = frozenset({"msg_id", "tags", "keys", "properties", "deliver_timestamp",
                              "transaction_id"})


def projected_schema(names=None) -> pa.Schema:
    """:data:`MESSAGE_SCHEMA` (``names`` None) or its columns ``names``, in that order.

    Raises :class:`ValueError` naming the allowed columns for an unknown or repeated one.
    """
    if names is None:
        return MESSAGE_SCHEMA
    names = list(names)
    unknown = [n for n in names if n not in MESSAGE_SCHEMA.names]
    if unknown or len(set(names)) != len(names) or not names:
        raise ValueError(f"columns {names}; allowed: one or more distinct names of "
                         f"{', '.join(MESSAGE_SCHEMA.names)}")
    return pa.schema([MESSAGE_SCHEMA.field(n) for n in names])


def empty_batch(schema: pa.Schema = MESSAGE_SCHEMA) -> pa.RecordBatch:
    """A batch with ``schema`` (:data:`MESSAGE_SCHEMA` by default) and no rows."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def repeat_string(value: bytes, n: int) -> pa.Array:
    """A string column holding ``value`` ``n`` times (built without a per-row loop)."""
    offsets = np.arange(0, (n + 1) * len(value), len(value) or 1, dtype=np.int32)
    if not value:
        offsets[:] = 0
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(value * n))


# --------------------------------------------------------------------------- columns


def columns(header, phys, queue_offsets, body, topic_arr, props,
            names: frozenset | None = None) -> dict[str, pa.Array]:
    """The columns of :data:`MESSAGE_SCHEMA` for one block of records, by name: all 14, or
    the ``names`` asked for.  ``props``: the columns of :data:`PROPERTY_COLUMNS` by name
    (:func:`property_columns`, :func:`gathered_columns`), or ``None`` when none is asked
    for."""
    n = len(phys)
    plain = {
        "topic": lambda: topic_arr,
        "queue_id": lambda: arrow_of(header["queue_id"]),
        "queue_offset": lambda: arrow_of(queue_offsets),
        "commitlog_offset": lambda: arrow_of(phys),
        "body": lambda: body,
        "born_timestamp": lambda: _timestamps(header["born_timestamp"]),
        "store_timestamp": lambda: _timestamps(header["store_timestamp"]),
        "reconsume_times": lambda: arrow_of(header["reconsume_times"]),
    }
    if names is not None and not (names & PROPERTY_COLUMNS):
        return {name: plain[name]() for name in names}
    out = {name: make() for name, make in plain.items() if names is None or name in names}
    out.update(props)
    return out if names is None else {k: v for k, v in out.items() if k in names}


def gathered_columns(out: dict, n: int) -> dict[str, pa.Array]:
    """The columns of :data:`PROPERTY_COLUMNS` over the buffers the compiled gather filled
    (:func:`store.kernels.message_decode.gather_messages`; no copy).

    Raises ``pyarrow.ArrowInvalid`` when a string column is not UTF-8.
    """
    def strings(offsets, data, valid=None, count=n):
        bitmap = None
        if valid is not None and not valid.all():
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        array = pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data),
                                            bitmap)
        array.validate(full=True)
        return array

    pieces = strings(out["keys_offsets"], out["keys_data"], count=len(out["keys_offsets"]) - 1)
    pairs = len(out["map_key_offsets"]) - 1
    properties = pa.MapArray.from_arrays(
        arrow_of(out["map_offsets"]),
        strings(out["map_key_offsets"], out["map_key_data"], count=pairs),
        strings(out["map_value_offsets"], out["map_value_data"], count=pairs),
        type=_PROPERTIES_TYPE)
    valid = out["deliver_valid"]
    deliver = pa.Array.from_buffers(_TIMESTAMP, n, [
        None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little")),
        pa.py_buffer(out["deliver_us"])])
    return {"msg_id": strings(out["uniq_offsets"], out["uniq_data"]),
            "tags": strings(out["tags_offsets"], out["tags_data"], out["tags_valid"]),
            "keys": pa.ListArray.from_arrays(arrow_of(out["keys_lists"]), pieces,
                                             type=_KEYS_TYPE),
            "properties": properties, "deliver_timestamp": deliver,
            "transaction_id": strings(out["tx_offsets"], out["tx_data"], out["tx_valid"])}


def property_columns(sys_flag, phys, props_bin, n: int) -> dict[str, pa.Array]:
    """The columns of :data:`PROPERTY_COLUMNS` parsed out of the properties strings with
    NumPy (the reference the compiled gather is tested against)."""
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
    is_commit = (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE
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
    return {"msg_id": msg_id, "tags": special_column(TAGS),
            "keys": split_keys(keys_values, keys_rows, n), "properties": properties,
            "deliver_timestamp": deliver_us, "transaction_id": special_column(TRANSACTION)}


def _deliver_us(deliver: pa.Array, phys: np.ndarray) -> pa.Array:
    """``__RMQ_DELIVER_MS`` values (decimal ms) as µs timestamps."""
    try:
        ms = deliver.cast(pa.int64())
    except pa.ArrowInvalid:
        bad = next(i for i, v in enumerate(deliver.to_pylist())
                   if v is not None and not _is_int64(v))
        raise CorruptRecordError("commitlog", int(phys[bad]), f"property {PROPERTY_DELIVER_MS}="
                                 f"{deliver[bad].as_py()!r}; allowed: epoch ms") from None
    return pc.multiply(ms, 1000).cast(_TIMESTAMP)


def _is_int64(text: str) -> bool:
    """Whether Arrow reads ``text`` as an int64 (the cast's own rule, value by value)."""
    try:
        pa.array([text], pa.string()).cast(pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        return False
    return True


def _timestamps(us: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(_TIMESTAMP, len(us), [None, pa.py_buffer(us)])


# --------------------------------------------------------------------------- back to views


def message_views(batch: pa.RecordBatch) -> list[MessageView]:
    """The rows of a :data:`MESSAGE_SCHEMA` batch as :class:`~store.formats.message.MessageView`\\ s
    (what ``pull`` returns where only the ``messages`` columns travel: a served store).

    The 14 columns give every field but ``sys_flag`` and ``system_properties``, the
    broker's own bookkeeping, which the columns do not carry: they keep their defaults
    (``0``, ``{}``).  Timestamps become epoch milliseconds, ``keys`` a tuple.
    """
    if batch.num_rows == 0:
        return []
    data = {name: batch.column(name) for name in MESSAGE_SCHEMA.names}
    for name in ("born_timestamp", "store_timestamp", "deliver_timestamp"):
        data[name] = pc.divide(data[name].cast(pa.int64()), 1000)  # µs -> ms, nulls kept
    rows = zip(*(data[name].to_pylist() for name in MESSAGE_SCHEMA.names))
    return [MessageView(topic=topic, queue_id=queue_id, queue_offset=queue_offset,
                        commitlog_offset=commitlog_offset, msg_id=msg_id, tags=tags,
                        keys=tuple(keys or ()), body=body, properties=dict(properties or ()),
                        born_timestamp_ms=born, store_timestamp_ms=stored,
                        deliver_timestamp_ms=deliver, transaction_id=transaction_id,
                        reconsume_times=reconsume)
            for (topic, queue_id, queue_offset, commitlog_offset, msg_id, tags, keys, body,
                 properties, born, stored, deliver, transaction_id, reconsume) in rows]
