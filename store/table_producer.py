"""Sending a whole table of messages at once: the columnar write path.

:meth:`Producer.send_table <store.producer.Producer.send_table>` takes a ``pyarrow.Table``,
``pyarrow.RecordBatch`` or ``pandas.DataFrame`` whose columns are, by name:

=============  ====================================  ==========================================
column         type                                  meaning
=============  ====================================  ==========================================
topic          string                                the destination (or ``topic=`` for all)
body           binary or string (``value`` too)      the payload (required)
tags           string                                one tag, nullable
keys           string or list<string>                business keys, nullable
properties     map<string, string>                   user properties, nullable
delay_ms       integer                               deliver after this many ms (timer wheel)
deliver_at     timestamp or integer (epoch ms)       deliver at this time (timer wheel)
delay_level    integer                               a 4.x delay level
=============  ====================================  ==========================================

At most one of the three delay columns may be set in a row (null: not delayed).  Any other
column is refused with an error naming it.  Every row is validated as a single send would
validate it (the same typed errors) before anything is written: a bad row means nothing of the
table is stored.

The rows are encoded as columns and appended with the core's columnar append
(:meth:`StoreCore.append_encoded <store.core.store_core.StoreCore.append_encoded>`) in chunks
of :data:`CHUNK_ROWS`: headers as one NumPy array, the properties strings built column by
column, the CommitLog bytes written with one ``pwrite`` per segment and chunk, the ConsumeQueue
entries in one block per queue.  As in a RocketMQ batch, the rows of one topic in one chunk go
to one queue (the next of the topic's round robin) and keep their order; delayed rows are
routed to their real queue now, as single sends are.  The bytes on disk are exactly what
:meth:`~store.producer.Producer.send` writes for the same message.

The result is a ``pyarrow.Table`` with one row per input row: ``msg_id``, ``topic`` (the
user's), ``queue_id`` (the queue it surfaces in), ``queue_offset`` (null for a delayed row:
its offset is known once delivered), ``commitlog_offset`` (of the stored record) and
``deliver_at_ms`` (null unless delayed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .batch_encoding import normalized_columns, paused_gc, properties_strings, validated_columns
from .codec import HEADER_DTYPE, LOCALHOST, MESSAGE_MAGIC_CODE_V1, STORE_PORT
from .core.append_types import EncodedRecords
from .core.ports import StorePort
from .delayed.routing import DELIVERY_HEADROOM
from .errors import InvalidDelayError, InvalidMessageError, MessageTooLargeError
from .message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_UNIQ_KEY,
    RESERVED_PROPERTY_NAMES,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    Message,
    check_tags,
    validate_message,
    validate_topic,
)
from .record_kernels import ByteColumn, empty_column

#: Rows appended per chunk (one commit each).
CHUNK_ROWS = 8192
COLUMNS = ("topic", "body", "tags", "keys", "properties", "delay_ms", "deliver_at",
           "delay_level")
RESULT_SCHEMA = pa.schema([
    ("msg_id", pa.string()), ("topic", pa.string()), ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()), ("commitlog_offset", pa.int64()),
    ("deliver_at_ms", pa.int64()),
])


def as_table(data) -> pa.Table:
    """A ``pyarrow.Table`` of ``data`` (a Table, RecordBatch or pandas DataFrame)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if type(data).__name__ == "DataFrame" and hasattr(data, "to_dict"):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise InvalidMessageError(
        f"send_table got {type(data).__name__}; allowed: a pyarrow.Table, a pyarrow.RecordBatch "
        "or a pandas.DataFrame")


def _check_columns(table: pa.Table, topic: str | None) -> pa.Table:
    names = table.column_names
    if "value" in names and "body" not in names:  # Kafka's name for the payload
        table = table.rename_columns(["body" if n == "value" else n for n in names])
        names = table.column_names
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise InvalidMessageError(
            f"unknown column(s) {unknown}; allowed: {', '.join(COLUMNS)} (or value for body)")
    if "body" not in names:
        raise InvalidMessageError(f"no body column in {names}; a body (or value) is required")
    if topic is None and "topic" not in names:
        raise InvalidMessageError("no topic column and no topic=...; give one of them")
    if topic is not None and "topic" in names:
        raise InvalidMessageError("both a topic column and topic=... were given; give one")
    return table


def _strings(table: pa.Table, name: str) -> list:
    if name not in table.column_names:
        return [None] * table.num_rows
    col = table.column(name)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col.to_pylist()


def _bodies(table: pa.Table) -> list:
    col = table.column("body")
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.cast(col, pa.binary())
    elif not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise InvalidMessageError(f"column body has type {col.type}; allowed: binary or string")
    return col.to_pylist()


def _keys(table: pa.Table) -> list:
    if "keys" not in table.column_names:
        return [None] * table.num_rows
    col = table.column("keys")
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        return [None if k is None else list(k) for k in col.to_pylist()]
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.to_pylist()
    raise InvalidMessageError(f"column keys has type {col.type}; allowed: string or "
                              "list<string>")


def _properties(table: pa.Table) -> list[dict]:
    if "properties" not in table.column_names:
        return [{}] * table.num_rows
    col = table.column("properties")
    if not pa.types.is_map(col.type):
        raise InvalidMessageError(
            f"column properties has type {col.type}; allowed: map<string, string>")
    return [dict(p) if p else {} for p in col.to_pylist()]


def _user_property_strings(table: pa.Table) -> pa.Array | None:
    """Each row's user properties as ``name 0x01 value 0x02 ...``, built and checked with
    Arrow over the whole map column; ``None`` when a row needs the per-row path (a name or
    value the rules refuse, or a name twice in one row), which then names the bad row."""
    n = table.num_rows
    if "properties" not in table.column_names:
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(
            np.zeros(n + 1, np.int32)), pa.py_buffer(b"")])
    col = table.column("properties")
    if not pa.types.is_map(col.type):
        raise InvalidMessageError(
            f"column properties has type {col.type}; allowed: map<string, string>")
    col = col.combine_chunks()
    offsets = col.offsets
    lo, hi = offsets[0].as_py(), offsets[-1].as_py()
    names, values = col.keys.slice(lo, hi - lo), col.items.slice(lo, hi - lo)
    if hi > lo:
        if names.null_count or values.null_count:
            return None
        for text in (names, values):
            if pc.any(pc.match_substring_regex(text, "[\x01\x02]")).as_py() or pc.any(
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


_PER_MS = {"s": -1000, "ms": 1, "us": 1000, "ns": 1_000_000}


def _epoch_ms_ceil(col) -> pa.ChunkedArray:
    """Epoch ms of a timestamp column, rounded up (a time between two ms is never early)."""
    per_ms = _PER_MS[col.type.unit]
    raw = pc.cast(col, pa.int64())
    if per_ms < 0:
        return pc.multiply(raw, -per_ms)
    if per_ms == 1:
        return raw
    # ceil(v / per_ms) for v >= 0 (integer division; negative times are refused later)
    return pc.divide(pc.add(raw, per_ms - 1), per_ms)


def _delays(table: pa.Table, now: int, store: StorePort) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the delay level (0: none) and the timer deliver time (-1: none)."""
    n = table.num_rows
    config = store.config
    given = {}
    for name in ("delay_ms", "deliver_at", "delay_level"):
        if name in table.column_names:
            col = table.column(name)
            if name == "deliver_at" and pa.types.is_timestamp(col.type):
                col = _epoch_ms_ceil(col)
            if not pa.types.is_integer(col.type):
                raise InvalidDelayError(f"column {name} has type {col.type}; allowed: "
                                        + ("timestamp or epoch ms" if name == "deliver_at"
                                           else "an integer type"))
            given[name] = (col.is_valid().to_numpy(zero_copy_only=False),
                           col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64))
    levels = np.zeros(n, dtype=np.int64)
    deliver = np.full(n, -1, dtype=np.int64)
    if not given:
        return levels, deliver
    count = sum(valid.astype(np.int64) for valid, _ in given.values())
    if (count > 1).any():
        row = int(np.argmax(count > 1))
        raise InvalidDelayError(f"row {row} sets more than one of delay_ms, deliver_at, "
                                "delay_level; allowed: at most one per row")
    max_delay = config.timer_max_delay_ms
    if "delay_level" in given:
        valid, values = given["delay_level"]
        bad = valid & (values < 0)
        if bad.any():
            raise InvalidDelayError(f"delay_level={int(values[np.argmax(bad)])}; allowed: an int "
                                    ">= 0 (0 means no delay; levels above the table are clamped)")
        levels = np.where(valid, np.minimum(values, len(config.delay_levels_ms)), 0)
    if "delay_ms" in given:
        valid, values = given["delay_ms"]
        bad = valid & ((values < 0) | (values > max_delay))
        if bad.any():
            raise InvalidDelayError(f"delay_ms={int(values[np.argmax(bad)])}; allowed: an int "
                                    f"from 0 to timer_max_delay_ms={max_delay}")
        deliver = np.where(valid & (values > 0), now + values, deliver)
    if "deliver_at" in given:
        valid, values = given["deliver_at"]
        bad = valid & ((values < 0) | (values - now > max_delay))
        if bad.any():
            raise InvalidDelayError(f"deliver_at={int(values[np.argmax(bad)])} (epoch ms); "
                                    f"allowed: at most timer_max_delay_ms={max_delay} ahead")
        # a time in the past is delivered at once, as RocketMQ does
        deliver = np.where(valid & (values > now), values, deliver)
    return levels, deliver


@dataclass(slots=True)
class PreparedRows:
    """Rows validated and encoded as columns, ready to append (see :func:`prepare_rows`).

    ``topic_names`` / ``topic_ids``: each row's topic; ``properties``: each row's whole
    properties string (user properties, TAGS, KEYS, UNIQ_KEY), without the routing of a
    delayed row (added when appended); ``tags_codes``: the tag hashes; ``msg_ids``: the
    UNIQ_KEYs (32 characters); ``levels``: delay level (0: none); ``deliver_ms``: timer
    deliver time (-1: none); ``born_ms``: when the rows were taken (delays count from it;
    an int, or one per row for rows of several staged halves).
    """

    topic_names: list
    topic_ids: np.ndarray
    bodies: ByteColumn
    properties: ByteColumn
    tags_codes: np.ndarray
    msg_ids: ByteColumn
    levels: np.ndarray
    deliver_ms: np.ndarray
    born_ms: int

    def __len__(self) -> int:
        return len(self.topic_ids)

    def slice(self, lo: int, hi: int) -> PreparedRows:
        return PreparedRows(self.topic_names, self.topic_ids[lo:hi], self.bodies.slice(lo, hi),
                            self.properties.slice(lo, hi), self.tags_codes[lo:hi],
                            self.msg_ids.slice(lo, hi), self.levels[lo:hi],
                            self.deliver_ms[lo:hi],
                            self.born_ms[lo:hi] if isinstance(self.born_ms, np.ndarray)
                            else self.born_ms)

    def topic_array(self) -> pa.Array:
        """Each row's topic as an Arrow string array."""
        return pa.DictionaryArray.from_arrays(
            pa.array(self.topic_ids, pa.int32()),
            pa.array(self.topic_names, pa.string())).cast(pa.string())

    @classmethod
    def empty(cls, now: int) -> PreparedRows:
        z = np.zeros(0, np.int64)
        return cls([], z, empty_column(0), empty_column(0), z, empty_column(0), z, z, now)


def send_table(store: StorePort, data, *, topic: str | None = None) -> pa.Table:
    """Validate and append a table of messages; see the module docstring."""
    with paused_gc():
        rows = prepare_rows(store, data, topic=topic)
        return append_prepared(store, rows)


def prepare_rows(store: StorePort, data, *, topic: str | None = None) -> PreparedRows:
    """Validate a table of messages (nothing is written) and encode its columns.

    Whole columns are checked and encoded with Arrow compute; when a column is not plainly
    valid the rows are checked one by one, to raise the typed error a single send would
    raise for the first bad row.
    """
    table = _check_columns(as_table(data), topic)
    now = store.now_ms()
    if table.num_rows == 0:
        return PreparedRows.empty(now)
    fast = _prepare_columns(store, table, topic, now)
    return fast if fast is not None else _prepare_by_rows(store, table, topic, now)


def _prepare_by_rows(store: StorePort, table: pa.Table, topic: str | None,
                     now: int) -> PreparedRows:
    """Row-by-row validation (names the first bad row) and encoding."""
    n = table.num_rows
    topics = [topic] * n if topic is not None else _strings(table, "topic")
    for t in set(topics):
        validate_topic(t)
    bodies, tags, keys = _bodies(table), _strings(table, "tags"), _keys(table)
    limit = store.config.max_message_size_bytes
    users = _user_property_strings(table)
    users = users.to_pylist() if users is not None else None
    properties = [{}] * n if users is not None else _properties(table)
    try:
        bodies, tags, keys, plain = validated_columns(bodies, tags, keys, properties, limit)
        users = users if users is not None else plain
    except (TypeError, InvalidMessageError):  # name the first bad row, as single sends would
        properties = _properties(table)
        for i in range(n):
            validate_message(Message(topics[i], bodies[i], tags[i], keys[i], properties[i]),
                             limit)
        bodies, tags, keys, users = normalized_columns(bodies, tags, keys, properties)
    levels, deliver = _delays(table, now, store)
    ids = store.id_generator.next_ids(n, now)
    props = properties_strings(users, tags, keys, ids)
    names = sorted(set(topics))
    index = {t: i for i, t in enumerate(names)}
    topic_ids = np.fromiter(map(index.__getitem__, topics), dtype=np.int64, count=n)
    return PreparedRows(names, topic_ids, ByteColumn.of(bodies), ByteColumn.of(props),
                        store.tag_hashes(tags), ByteColumn.of([i.encode() for i in ids]),
                        levels, deliver, now)


_BAD_KEYS = "[\x01\x02]|  |^ | $|[^\\S ]"


def _prepare_columns(store: StorePort, table: pa.Table, topic: str | None,
                     now: int) -> PreparedRows | None:
    """The whole-column path: ``None`` when some column is not plainly valid (or of a shape
    this path does not take), so that :func:`_prepare_by_rows` names the bad row."""
    n = table.num_rows
    # topics: one check per distinct name
    if topic is not None:
        names, topic_ids = [validate_topic(topic)], np.zeros(n, np.int64)
    else:
        col = table.column("topic")
        if not pa.types.is_string(col.type) or col.null_count:
            return None
        enc = col.combine_chunks().dictionary_encode()
        names = enc.dictionary.to_pylist()
        for t in names:
            validate_topic(t)
        topic_ids = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    # bodies: binary, non-null, 1 byte to the limit
    body = table.column("body")
    if pa.types.is_string(body.type) or pa.types.is_large_string(body.type):
        body = pc.cast(body, pa.binary() if pa.types.is_string(body.type) else pa.large_binary())
    elif not (pa.types.is_binary(body.type) or pa.types.is_large_binary(body.type)):
        raise InvalidMessageError(f"column body has type {body.type}; allowed: binary or string")
    if body.null_count:
        return None
    bodies = ByteColumn.from_arrow(body)
    lengths = bodies.lengths()
    if int(lengths.min()) < 1 or int(lengths.max()) > store.config.max_message_size_bytes:
        return None
    # tags: one check per distinct tag
    if "tags" in table.column_names:
        tags = table.column("tags")
        if pa.types.is_dictionary(tags.type):
            tags = tags.cast(tags.type.value_type)
        if not pa.types.is_string(tags.type):
            return None
        enc = tags.combine_chunks().dictionary_encode()
        distinct = enc.dictionary.to_pylist()
        try:
            for t in distinct:
                check_tags(t)
        except InvalidMessageError:
            return None
        codes = np.append(store.tag_hashes(distinct), 0)
        idx = enc.indices.fill_null(len(distinct)).to_numpy(zero_copy_only=False)
        tags_codes = codes[idx.astype(np.int64)]
        tag_part = pc.binary_join_element_wise(f"{PROPERTY_TAGS}\x01", tags, "\x02", "")
    else:
        tags_codes = np.zeros(n, np.int64)
        tag_part = None
    # keys: a string (space-separated) or a list of strings, each without spaces
    key_part = None
    if "keys" in table.column_names:
        keys = table.column("keys")
        if pa.types.is_list(keys.type) or pa.types.is_large_list(keys.type):
            if not pa.types.is_string(keys.type.value_type):
                return None
            keys = keys.cast(pa.list_(pa.string()))  # Spark's elements are "not null"
            flat = pc.list_flatten(keys)
            if not pa.types.is_string(flat.type):
                return None
            if len(flat) and (flat.null_count or pc.any(pc.match_substring_regex(
                    flat, "^$| |[\x01\x02]|[^\\S ]")).as_py()):
                return None
            keys = pc.binary_join(keys, " ")
        elif not pa.types.is_string(keys.type):
            return None
        elif len(keys) - keys.null_count and pc.any(
                pc.match_substring_regex(keys, _BAD_KEYS)).as_py():
            return None
        keys = pc.if_else(pc.equal(keys, ""), pa.scalar(None, pa.string()), keys)
        key_part = pc.binary_join_element_wise(f"{PROPERTY_KEYS}\x01", keys, "\x02", "")
    users = _user_property_strings(table)
    if users is None:
        return None
    levels, deliver = _delays(table, now, store)
    ids = store.id_generator.next_id_chars(n, now)
    id_text = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(
        np.arange(0, 32 * (n + 1), 32, dtype=np.int32)), pa.py_buffer(ids)])
    parts = [users]
    for part in (tag_part, key_part):
        if part is not None:
            parts.append(pc.fill_null(part, ""))
    parts += [f"{PROPERTY_UNIQ_KEY}\x01", id_text, "\x02"]
    props = pc.binary_join_element_wise(*parts, "")
    return PreparedRows(names, topic_ids, bodies, ByteColumn.from_arrow(props), tags_codes,
                        ByteColumn.from_arrow(id_text), levels, deliver, now)


def append_prepared(store: StorePort, rows: PreparedRows, *, sys_flag: int = 0,
                    prepared_offsets: np.ndarray | None = None,
                    chunk_rows: int = CHUNK_ROWS) -> pa.Table:
    """Append prepared rows in chunks of :data:`CHUNK_ROWS`; return the results table.

    ``sys_flag`` and ``prepared_offsets`` (PREPAREDTRANSACTIONOFFSET per row) are for the
    records a transaction commit writes; ``born_ms`` of the rows may then be an array (one
    born time per row).  Each chunk is one append; inside
    :meth:`~store.core.store_core.StoreCore.atomic_append` they all land together.
    """
    n = len(rows)
    if n == 0:
        return RESULT_SCHEMA.empty_table()
    results = []
    for lo in range(0, n, chunk_rows):
        hi = min(n, lo + chunk_rows)
        results.append(_append_chunk(
            store, rows.slice(lo, hi), sys_flag,
            None if prepared_offsets is None else prepared_offsets[lo:hi]))
    return pa.concat_tables(results)


def _append_chunk(store: StorePort, rows: PreparedRows, sys_flag: int,
                  prepared: np.ndarray | None) -> pa.Table:
    config = store.config
    now = rows.born_ms
    names = rows.topic_names
    levels, deliver = rows.levels, rows.deliver_ms
    n = len(rows)
    user_topic_ids = rows.topic_ids
    # one queue per topic per chunk, as a RocketMQ batch: the next of the topic's round robin
    queue_of = np.zeros(len(names), dtype=np.int64)
    for t in np.unique(user_topic_ids).tolist():
        queue_of[t] = store.next_queue(names[t], store.ensure_topic(names[t]))
    real_qid = queue_of[user_topic_ids]
    by_level, by_timer = levels > 0, deliver >= 0
    delayed = by_level | by_timer
    codes = np.array(rows.tags_codes, dtype=np.int64)
    target_topics = list(names)
    target_ids = user_topic_ids.copy()
    queue_ids = real_qid.copy()
    suffix = None
    props_len = rows.properties.lengths()
    if delayed.any():
        suffix = _with_routing(n, names, user_topic_ids, real_qid, levels, deliver, by_level,
                               by_timer, codes, config.timer_precision_ms)
        props_len = props_len + suffix.lengths()
        if by_level.any():
            target_topics.append(SCHEDULE_TOPIC)
            target_ids[by_level] = len(target_topics) - 1
            queue_ids[by_level] = levels[by_level] - 1
            level_ms = np.array(config.delay_levels_ms, dtype=np.int64)
            born = now[by_level] if isinstance(now, np.ndarray) else now
            codes[by_level] = born + level_ms[levels[by_level] - 1]
        if by_timer.any():
            target_topics.append(TIMER_TOPIC)
            target_ids[by_timer] = len(target_topics) - 1
            queue_ids[by_timer] = 0
    headroom = config.max_properties_size_bytes - DELIVERY_HEADROOM
    too_long = delayed & (props_len > headroom)
    if too_long.any():
        raise MessageTooLargeError(
            f"properties of a delayed message are {int(props_len[np.argmax(too_long)])} bytes; "
            f"allowed: at most {headroom} (max_properties_size_bytes minus {DELIVERY_HEADROOM} "
            "for delivery bookkeeping)")
    headers = np.zeros(n, dtype=HEADER_DTYPE)
    headers["magic"] = MESSAGE_MAGIC_CODE_V1
    headers["sys_flag"] = sys_flag
    headers["born_timestamp"] = now
    headers["born_host"] = np.void(LOCALHOST)
    headers["store_host"] = np.void(LOCALHOST)
    headers["store_port"] = STORE_PORT
    headers["body_length"] = rows.bodies.lengths()  # BODYCRC: filled by the appender's kernel
    if prepared is not None:
        headers["prepared_transaction_offset"] = prepared
    placed = store.append_encoded(EncodedRecords(
        headers=headers, bodies=rows.bodies, properties=rows.properties,
        properties_length=props_len, topics=target_topics, topic_ids=target_ids,
        queue_ids=queue_ids, tags_codes=codes, extra_properties=suffix,
        store_timestamp_ms=None if prepared is not None else now))
    deliver_ms = np.where(by_level, now + np.array((0, *config.delay_levels_ms),
                                                   dtype=np.int64)[levels], deliver)
    return pa.table({
        "msg_id": rows.msg_ids.to_arrow(pa.string()),
        "topic": rows.topic_array(),
        "queue_id": pa.array(real_qid, pa.int32()),
        "queue_offset": pa.array(placed.queue_offsets, pa.int64(), mask=delayed),
        "commitlog_offset": pa.array(placed.commitlog_offsets, pa.int64()),
        "deliver_at_ms": pa.array(deliver_ms, pa.int64(), mask=~delayed),
    }, schema=RESULT_SCHEMA)


def _with_routing(n: int, names: list, topic_ids: np.ndarray, real_qid: np.ndarray,
                  levels: np.ndarray, deliver: np.ndarray, by_level: np.ndarray,
                  by_timer: np.ndarray, codes: np.ndarray, precision_ms: int) -> ByteColumn:
    """The routing properties of delayed rows, as the services' ``rewrite`` adds them (a
    suffix column: empty for rows that are not delayed).

    Level rows get ``REAL_TOPIC``, ``REAL_QID`` and ``DELAY``; timer rows ``REAL_TOPIC``,
    ``REAL_QID``, ``TIMER_OUT_MS`` (the rounded fire time, also their tagsCode, see
    :func:`store.timer.service.round_fire_time`) and ``TIMER_DELIVER_MS``.
    """
    out = np.where(deliver % precision_ms == 0, deliver - precision_ms,
                   deliver - deliver % precision_ms)
    codes[by_timer] = out[by_timer]
    route = f"{PROPERTY_REAL_TOPIC}\x01{{}}\x02{PROPERTY_REAL_QUEUE_ID}\x01{{}}\x02"
    level = route + f"{PROPERTY_DELAY_TIME_LEVEL}\x01{{}}\x02"
    timer = route + f"{PROPERTY_TIMER_OUT_MS}\x01{{}}\x02{PROPERTY_TIMER_DELIVER_MS}\x01{{}}\x02"
    column = [b""] * n
    for sel, template, *values in ((by_level, level, levels), (by_timer, timer, out, deliver)):
        idx = np.flatnonzero(sel)
        if len(idx):
            row_topics = [names[t] for t in topic_ids[idx].tolist()]
            added = map(str.encode, map(template.format, row_topics, real_qid[idx].tolist(),
                                        *(v[idx].tolist() for v in values)))
            for i, text in zip(idx.tolist(), added):
                column[i] = text
    return ByteColumn.of(column)
