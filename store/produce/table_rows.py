"""A table of messages validated and encoded as columns: :class:`PreparedRows`.

:func:`prepare_rows` takes a ``pyarrow.Table``, ``RecordBatch`` or ``pandas.DataFrame`` with
the columns of :mod:`store.produce.table_producer` and checks and encodes whole columns with Arrow
compute (topics, bodies, tags, keys, property maps, delays; message ids as one NumPy
array; the properties strings sized, joined per chunk as it is encoded).  Only when a column
is not plainly valid are the rows checked one by one, to raise the typed error a single
send would raise for the first bad row.  Nothing is written here:
:func:`store.produce.table_producer.append_prepared` appends prepared rows, and :mod:`store.sink.sink`
stages them.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..formats.batch_encoding import normalized_columns, properties_column, validated_columns
from ..core.pipeline import prepared_in_order
from ..core.ports import StorePort
from ..base.errors import InvalidDelayError, InvalidMessageError
from ..formats.message import Message, check_tags, validate_message, validate_topic
from ..kernels.property_join import (
    PropertyParts,
    UserPairs,
    distinct_strings,
    join_properties,
    plain_keys,
    property_parts,
)
from ..formats.byte_columns import ByteColumn, empty_column, one_array
from .table_properties import any_blank, property_dicts, user_property_pairs
from .table_queues import QUEUE_COLUMNS, chosen_queues

COLUMNS = ("topic", "body", "tags", "keys", "properties", "delay_ms", "deliver_at",
           "delay_level", *QUEUE_COLUMNS)

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
    delayed row (added when appended), joined or still in parts
    (:meth:`properties_column`); ``tags_codes``: the tag hashes; ``msg_ids``: the
    UNIQ_KEYs (32 characters); ``levels``: delay level (0: none); ``deliver_ms``: timer
    deliver time (-1: none); ``born_ms``: when the rows were taken (delays count from it;
    an int, or one per row for rows of several staged halves); ``queue_ids``: each row's
    queue (-1, or no array: round robin; :mod:`store.produce.table_queues`); ``topic_values`` /
    ``id_values``: the user's topic column, the ids as Arrow strings (the results reuse them).
    """

    topic_names: list
    topic_ids: np.ndarray
    bodies: ByteColumn
    properties: ByteColumn | PropertyParts
    tags_codes: np.ndarray
    msg_ids: ByteColumn
    levels: np.ndarray
    deliver_ms: np.ndarray
    born_ms: int
    queue_ids: np.ndarray | None = None
    topic_values: pa.Array | None = None
    id_values: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.topic_ids)

    def slice(self, lo: int, hi: int) -> PreparedRows:
        return PreparedRows(self.topic_names, self.topic_ids[lo:hi], self.bodies.slice(lo, hi),
                            self.properties.slice(lo, hi), self.tags_codes[lo:hi],
                            self.msg_ids.slice(lo, hi), self.levels[lo:hi],
                            self.deliver_ms[lo:hi],
                            self.born_ms[lo:hi] if isinstance(self.born_ms, np.ndarray)
                            else self.born_ms,
                            None if self.queue_ids is None else self.queue_ids[lo:hi],
                            None if self.topic_values is None
                            else self.topic_values.slice(lo, hi - lo),
                            None if self.id_values is None else self.id_values.slice(lo, hi - lo))

    def properties_column(self) -> ByteColumn:
        """The rows' properties strings, joined now if they were kept in parts."""
        props = self.properties
        return props.column() if isinstance(props, PropertyParts) else props

    def topic_array(self) -> pa.Array:
        """Each row's topic as an Arrow string array: the user's column when there was one,
        else the names taken by id (a dictionary cast took 2-8x as long)."""
        if self.topic_values is not None:
            return self.topic_values
        return pa.array(self.topic_names, pa.string()).take(pa.array(self.topic_ids))

    @classmethod
    def empty(cls, now: int) -> PreparedRows:
        z = np.zeros(0, np.int64)
        return cls([], z, empty_column(0), empty_column(0), z, empty_column(0), z, z, now)


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
    rows = _prepare_columns(store, table, topic, now) or _prepare_by_rows(store, table, topic, now)
    rows.queue_ids = chosen_queues(store, table, rows.topic_names, rows.topic_ids)
    return rows


def _prepare_by_rows(store: StorePort, table: pa.Table, topic: str | None,
                     now: int) -> PreparedRows:
    """Row-by-row validation (names the first bad row) and encoding."""
    n = table.num_rows
    topics = [topic] * n if topic is not None else _strings(table, "topic")
    for t in set(topics):
        validate_topic(t)
    bodies, tags, keys = _bodies(table), _strings(table, "tags"), _keys(table)
    limit = store.config.max_message_size_bytes
    pairs = user_property_pairs(table)
    users = (join_properties(pairs).to_arrow(pa.string()).to_pylist() if pairs is not None
             else None)
    properties = [{}] * n if users is not None else property_dicts(table)
    try:
        bodies, tags, keys, plain = validated_columns(bodies, tags, keys, properties, limit)
        users = users if users is not None else plain
    except (TypeError, InvalidMessageError):  # name the first bad row, as single sends would
        properties = property_dicts(table)
        for i in range(n):
            validate_message(Message(topics[i], bodies[i], tags[i], keys[i], properties[i]),
                             limit)
        bodies, tags, keys, users = normalized_columns(bodies, tags, keys, properties)
    levels, deliver = _delays(table, now, store)
    ids = store.id_generator.next_ids(n, now)
    props = properties_column(users, tags, keys, ids)
    names = sorted(set(topics))
    index = {t: i for i, t in enumerate(names)}
    topic_ids = np.fromiter(map(index.__getitem__, topics), dtype=np.int64, count=n)
    return PreparedRows(names, topic_ids, ByteColumn.of(bodies), ByteColumn.of(props),
                        store.tag_hashes(tags), ByteColumn.of([i.encode() for i in ids]),
                        levels, deliver, now)


_BAD_KEYS = "[\x01\x02]|  |^ | $|[^\\S ]"


@dataclass(frozen=True, slots=True)
class CheckedColumns:
    """Topics, bodies, tags and keys of a table, checked and encoded as whole columns."""

    names: list[str]          # the distinct topics
    topic_ids: np.ndarray     # each row's index into ``names``
    user_topics: pa.Array | None  # the table's topic column (``None``: one topic given)
    bodies: ByteColumn
    tags_codes: np.ndarray
    tags: pa.Array | None     # Arrow strings, or ``None`` for no tags column
    keys: pa.Array | None


@dataclass(frozen=True, slots=True)
class UserPairsOutcome:
    """The user property pairs of a table (``None``: not plainly valid), or the error they
    raise, and the rows' message ids (as ``(n, 32)`` characters and as an Arrow column)."""

    users: UserPairs | None = None
    error: InvalidMessageError | None = None
    ids: np.ndarray | None = None
    id_values: pa.Array | None = None


#: From this many rows on, the whole-column path checks the property maps on a helper thread
#: while the calling thread checks the other columns (Arrow compute releases the GIL).
PARALLEL_ROWS = 16384


def _prepare_columns(store: StorePort, table: pa.Table, topic: str | None,
                     now: int) -> PreparedRows | None:
    """The whole-column path: ``None`` when some column is not plainly valid (or of a shape
    this path does not take), so that :func:`_prepare_by_rows` names the bad row."""
    n = table.num_rows

    def users_outcome() -> UserPairsOutcome:
        # its error counts only if the other columns pass, as in sequence
        try:
            users = user_property_pairs(table)
        except InvalidMessageError as exc:
            return UserPairsOutcome(error=exc)
        ids = store.id_generator.next_id_chars(n, now)  # here: the others take longer
        buffers = [None, pa.py_buffer(np.arange(0, 32 * n + 1, 32, dtype=np.int32)),
                   pa.py_buffer(ids)]
        return UserPairsOutcome(users, None, ids,
                                pa.Array.from_buffers(pa.string(), n, buffers))

    tasks = (lambda: _checked_columns(store, table, topic), users_outcome)
    if n >= PARALLEL_ROWS:
        with closing(prepared_in_order(2, lambda k: tasks[k](),
                                           threads=store.encode_threads)) as done:
            checked, outcome = list(done)
    else:
        checked = tasks[0]()
        outcome = tasks[1]() if checked is not None else UserPairsOutcome()
    if checked is None:
        return None
    if outcome.error is not None:
        raise outcome.error
    if outcome.users is None:
        return None
    c = checked
    levels, deliver = _delays(table, now, store)
    # joined per chunk, as it is encoded
    props = property_parts(outcome.users, c.tags, c.keys, outcome.ids)
    msg_ids = ByteColumn.from_arrow(outcome.id_values)  # the ids' bytes and offsets, shared
    return PreparedRows(c.names, c.topic_ids, c.bodies, props, c.tags_codes, msg_ids, levels,
                        deliver, now, topic_values=c.user_topics, id_values=outcome.id_values)


def _checked_columns(store: StorePort, table: pa.Table, topic: str | None
                     ) -> CheckedColumns | None:
    """Topics, bodies, tags and keys checked and encoded as whole columns, or ``None`` when
    a column is not plainly valid."""
    n = table.num_rows
    # topics: one check per distinct name
    if topic is not None:
        names, topic_ids, user_topics = [validate_topic(topic)], np.zeros(n, np.int64), None
    else:
        col = table.column("topic")
        if not pa.types.is_string(col.type) or col.null_count:
            return None
        user_topics = one_array(col)
        names, topic_ids = distinct_strings(user_topics)
        for t in names:
            validate_topic(t)
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
        distinct, idx = distinct_strings(one_array(tags))
        try:
            for t in distinct:
                check_tags(t)
        except InvalidMessageError:
            return None
        tags_codes = np.append(store.tag_hashes(distinct), 0)[idx]  # 0 for a null tag
    else:
        tags_codes = np.zeros(n, np.int64)
        tags = None
    # keys: a string (space-separated) or a list of strings, each without spaces
    keys = None
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
        elif len(keys) - keys.null_count and not _plain_keys(keys):
            return None
    return CheckedColumns(names, topic_ids, user_topics, bodies, tags_codes, tags, keys)


def _plain_keys(keys) -> bool:
    """Whether a keys column is what single sends would write unchanged and accept: ASCII
    rows are checked by one compiled pass, rows with other text by Arrow (no separators,
    no space at either end or twice in a row, no part that is only whitespace)."""
    verdict = plain_keys(keys)
    if (verdict == 2).any():
        return False
    text = np.flatnonzero(verdict == 1)
    if len(text):
        sub = keys.take(pa.array(text))
        if pc.any(pc.match_substring_regex(sub, _BAD_KEYS)).as_py():
            return False
        if any_blank(pc.list_flatten(pc.split_pattern(sub, " "))):
            return False
    return True
