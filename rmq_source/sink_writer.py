"""``df.write.format("rmq")`` and ``df.writeStream.format("rmq")``: the exactly-once sink.

Columns, by name (anything else is refused when the query starts, naming the column):

=============  ======================================  =======================================
column         Spark type                              meaning
=============  ======================================  =======================================
topic          string                                  destination (or option ``topic``)
body / value   binary or string                        the payload (required)
tags           string                                  one tag
keys           string or array<string>                 business keys
properties     map<string,string>                      user properties
delay_ms       integer types                           deliver after this many ms
deliver_at     timestamp (or epoch ms as long)         deliver at this time
delay_level    integer types                           a 4.x delay level
queue_id       integer types                           the row's queue (ordered messages)
sharding_key   string                                  rows with one key share a queue
key            string                                  a delay key: the row replaces the
                                                       pending message of its key (with
                                                       delay_ms or deliver_at); with a null
                                                       body it cancels the key's message
schedule_key   string                                  the row defines the recurring schedule
                                                       of this key (with cron or every_ms, a
                                                       copy of the row's message each time);
                                                       with neither, it removes the schedule
cron           string                                  five cron fields or a macro
every_ms       integer types                           a fixed interval
tz             string                                  the cron's time zone (default UTC)
catch_up       string                                  missed fires: latest_once (default,
                                                       null), all or skip
catch_up_      integer types                           missed fires older than this are
window_ms                                              dropped (null: none is too old)
=============  ======================================  =======================================

Rows with a ``schedule_key`` and rows cancelling a key are *operations*, not messages: a task
hands them to the driver in its commit message, and the driver applies them (cancels first,
then schedules) just before it commits the batch's messages, unless the batch is committed
already (a replay).  Applying them again after a crash between the two changes nothing (a
cancelled key names nothing; a schedule identical to the one under its key is kept as it
is), so they too take effect once.  With ``guarantee=at_least_once`` the task applies them.

At most one delay column may be set per row (null: not delayed), and at most one of
``queue_id`` and ``sharding_key`` per DataFrame (null: round robin); rows of one queue keep
the order in which the task wrote them.  Rows arrive as Arrow
batches (``DataSourceArrowWriter`` / ``DataSourceStreamArrowWriter``) and are validated and
encoded by the store's columnar write path (:func:`store.produce.table_producer.prepare_rows`).

**Exactly once** (``guarantee=exactly_once``, the default): each task stages its rows as half
messages of the sink (:class:`store.Sink`), invisible to every reader, and returns their
transaction ids; the driver's ``commit`` makes the whole batch visible in one atomic group
with a marker for (sink, batch id).  A batch Spark re-runs after a failure finds the marker
and rolls its new halves back; halves of failed task attempts and of batches that never
committed are rolled back by the next commit (or ``abort``) of the same sink.  Delayed rows
become delayed messages at the commit, due from when their task staged them.

The sink is identified by option ``sinkId`` or else, for a streaming query, by its
checkpoint location (so a restarted query is the same sink and its replays are recognised).
A batch job is a sink of its own (a fresh id per job).  Two queries writing at the same time
with the same identity are not supported: one of them fails its commit with
``SinkCommitError`` and writes nothing of that batch.

``guarantee=at_least_once``: tasks append their rows directly (no halves, no commit step);
a re-run task or batch appends its rows again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from store import SinkCommitError, StoreError, StoreGroup

from .errors import RmqSourceError
from .options import RmqOptions
from .stores import ensure_store, open_writable

_INTS = (ByteType, ShortType, IntegerType, LongType)
#: column -> (allowed Spark types, how the allowed types are named in errors)
COLUMN_TYPES = {
    "topic": ((StringType,), "string"),
    "body": ((BinaryType, StringType), "binary or string"),
    "value": ((BinaryType, StringType), "binary or string"),
    "tags": ((StringType,), "string"),
    "keys": ((StringType, ArrayType), "string or array<string>"),
    "properties": ((MapType,), "map<string,string>"),
    "delay_ms": (_INTS, "an integer type"),
    "deliver_at": ((TimestampType, TimestampNTZType, LongType), "timestamp or long epoch ms"),
    "delay_level": (_INTS, "an integer type"),
    "queue_id": (_INTS, "an integer type"),
    "sharding_key": ((StringType,), "string"),
    "key": ((StringType,), "string"),
    "schedule_key": ((StringType,), "string"),
    "cron": ((StringType,), "string"),
    "every_ms": (_INTS, "an integer type"),
    "tz": ((StringType,), "string"),
    "catch_up": ((StringType,), "string"),
    "catch_up_window_ms": (_INTS, "an integer type"),
}
#: Columns of the schedule operations (their rows go to ``producer.schedule_table``).
SCHEDULE_COLUMNS = ("schedule_key", "topic", "body", "tags", "keys", "properties", "cron",
                    "every_ms", "tz", "catch_up", "catch_up_window_ms")
_OP_ONLY = ("schedule_key", "cron", "every_ms", "tz", "catch_up", "catch_up_window_ms")


class SinkWriteError(RmqSourceError):
    """The rows given to the ``rmq`` sink cannot be written (columns, types, values)."""


def check_sink_schema(schema: StructType, options: RmqOptions) -> None:
    """Refuse a DataFrame the sink cannot write, before any task runs."""
    names = [f.name for f in schema.fields]
    allowed = ", ".join(c for c in COLUMN_TYPES)
    for f in schema.fields:
        if f.name not in COLUMN_TYPES:
            raise SinkWriteError(
                f"the DataFrame written to rmq has a column {f.name!r} the sink does not know; "
                f"allowed columns: {allowed} (select or rename the columns first, e.g. "
                f"df.selectExpr('order_id AS keys', ...))")
        types, described = COLUMN_TYPES[f.name]
        if not isinstance(f.dataType, types):
            raise SinkWriteError(
                f"column {f.name!r} has type {f.dataType.simpleString()}; allowed: {described}")
        if isinstance(f.dataType, ArrayType) and not isinstance(f.dataType.elementType,
                                                                StringType):
            raise SinkWriteError(f"column keys has type {f.dataType.simpleString()}; allowed: "
                                 "string or array<string>")
        if isinstance(f.dataType, MapType) and not (
                isinstance(f.dataType.keyType, StringType)
                and isinstance(f.dataType.valueType, StringType)):
            raise SinkWriteError(f"column properties has type {f.dataType.simpleString()}; "
                                 "allowed: map<string,string>")
    if "body" not in names and "value" not in names:
        raise SinkWriteError(f"the DataFrame written to rmq has no body column (columns: "
                             f"{names}); allowed: a binary or string column body (or value)")
    if "body" in names and "value" in names:
        raise SinkWriteError("the DataFrame written to rmq has both body and value; give one")
    if "topic" not in names and options.topic is None:
        raise SinkWriteError(f"no topic for the rows written to rmq (columns: {names}); give a "
                             "topic column or .option('topic', ...)")
    if "topic" in names and options.topic is not None:
        raise SinkWriteError(f"both a topic column and option topic={options.topic!r} were "
                             "given; give one of them")


@dataclass(frozen=True, slots=True)
class SinkCommitMessage(WriterCommitMessage):
    """One task's staged halves (exactly once) and its row count; over a store group,
    ``by_store`` holds the halves of each member instead.  ``cancel_keys`` and
    ``schedules`` are the task's operations, applied by the driver's commit."""

    transactions: tuple[str, ...]
    rows: int
    by_store: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cancel_keys: tuple[str, ...] = ()
    schedules: pa.Table | None = None


#: A task hands rows to the store in tables of about this many rows / bytes (Spark's Arrow
#: batches are 10,000 rows; fewer, larger calls amortise the per-call work).
TASK_BATCH_ROWS = 65536
TASK_BATCH_BYTES = 16 * 1024 * 1024


def _open(options: RmqOptions):
    """The store, or the store group, that ``path`` names, writable."""
    return open_writable(options.path, needs="writing to rmq", error=SinkWriteError)


def _write_task(options: RmqOptions, sink_id: str, iterator: Iterator) -> SinkCommitMessage:
    store = _open(options)
    # Spark runs a task per core already: a task encodes on its own thread (a helper
    # thread would only compete with the other tasks for the same cores)
    store.encode_threads = 1
    grouped = isinstance(store, StoreGroup)
    transactions: list[str] = []
    by_store: dict[str, list[str]] = {}
    ops = _Operations()
    rows = 0
    try:
        producer = store.producer(options.producer_group)
        if options.guarantee == "at_least_once":
            ops.apply_now = lambda keys, table: _apply(options, producer, keys, table)

            def write(table, topic):
                if "key" in table.column_names:
                    producer.replace_table(table, topic=topic)
                else:
                    producer.send_table(table, topic=topic)
        else:
            sink = store.sink(sink_id, options.producer_group, commit=options.sink_commit)

            def write(table, topic):
                staged = sink.stage(table, topic=topic)
                if not grouped:
                    transactions.extend(staged)
                    return
                for name, txs in staged.items():
                    by_store.setdefault(name, []).extend(txs)

        pending: list = []
        size = count = 0
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            pending.append(batch)
            count += batch.num_rows
            size += batch.nbytes
            if count >= TASK_BATCH_ROWS or size >= TASK_BATCH_BYTES:
                rows += _hand_over(options, write, pending, ops)
                pending, size, count = [], 0, 0
        if pending:
            rows += _hand_over(options, write, pending, ops)
    finally:
        store.close()
    return SinkCommitMessage(tuple(transactions), rows,
                             tuple((name, tuple(txs)) for name, txs in by_store.items()),
                             tuple(ops.cancel_keys), ops.table())


class _Operations:
    """A task's schedule rows and key cancels, gathered for the commit."""

    def __init__(self) -> None:
        self.cancel_keys: list[str] = []
        self.schedules: list[pa.Table] = []
        #: at least once: applied by the task as they come, before the rows beside them
        self.apply_now = None

    def flush(self) -> None:
        if self.apply_now is not None and (self.cancel_keys or self.schedules):
            self.apply_now(self.cancel_keys, self.table())
            self.cancel_keys, self.schedules = [], []

    def table(self) -> pa.Table | None:
        return pa.concat_tables(self.schedules) if self.schedules else None


def _split(table: pa.Table, ops: _Operations) -> list[pa.Table]:
    """The message rows of ``table`` as tables the store's sink takes (keyed rows apart);
    its schedule rows and key cancels go to ``ops``."""
    names = table.column_names
    body = "body" if "body" in names else "value"
    message = pc.invert(pc.is_valid(table.column("schedule_key"))) \
        if "schedule_key" in names else None
    if "schedule_key" in names:
        sched = table.filter(pc.is_valid(table.column("schedule_key")))
        if sched.num_rows:
            cols = [c for c in SCHEDULE_COLUMNS if c in names]
            part = sched.select(cols)
            if body == "value":
                part = part.rename_columns(["body" if c == "value" else c for c in cols])
            ops.schedules.append(part.rename_columns(
                ["key" if c == "schedule_key" else c for c in part.column_names]))
        table = table.filter(message)
    if "key" in names:
        cancel = pc.and_(pc.is_valid(table.column("key")), pc.is_null(table.column(body)))
        ops.cancel_keys.extend(table.filter(cancel).column("key").to_pylist())
        table = table.filter(pc.invert(cancel))
    table = table.drop_columns([c for c in _OP_ONLY if c in table.column_names])
    if not table.num_rows:
        return []
    if "key" not in table.column_names:
        return [table]
    keyed = pc.is_valid(table.column("key"))
    out = []
    plain = table.filter(pc.invert(keyed)).drop_columns(["key"])
    if plain.num_rows:
        out.append(plain)
    with_key = table.filter(keyed)
    if with_key.num_rows:
        out.append(with_key)
    return out


def _hand_over(options: RmqOptions, write, batches: list, ops: _Operations) -> int:
    table = pa.Table.from_batches(batches)
    try:
        parts = _split(table, ops)
        ops.flush()  # (at least once: the operations first, as the driver's commit does)
        for part in parts:
            write(part, topic=options.topic)
    except StoreError as exc:
        raise SinkWriteError(f"writing to rmq store {options.path}: {exc} (nothing of this "
                             "batch becomes visible)") from None
    return table.num_rows


def _apply(options: RmqOptions, producer, cancel_keys, schedules: pa.Table | None) -> None:
    """The batch's operations: key cancels, then schedule definitions."""
    try:
        if cancel_keys:
            producer.cancel_keys(list(cancel_keys))
        if schedules is not None and schedules.num_rows:
            producer.schedule_table(schedules, topic=options.topic)
    except StoreError as exc:
        raise SinkWriteError(f"applying the batch's schedules and key cancels to rmq store "
                             f"{options.path}: {exc}") from None


def _commit(options: RmqOptions, sink_id: str, messages, batch_id: int) -> None:
    if options.guarantee == "at_least_once":
        return
    store = _open(options)
    if isinstance(store, StoreGroup):
        transactions: dict | list = {name: [] for name in store.names}
        for m in messages:
            for name, txs in (m.by_store if m is not None else ()):
                transactions[name].extend(txs)
    else:
        transactions = [tx for m in messages if m is not None for tx in m.transactions]
    cancel_keys = [k for m in messages if m is not None for k in m.cancel_keys]
    tables = [m.schedules for m in messages if m is not None and m.schedules is not None]
    try:
        sink = store.sink(sink_id, options.producer_group)
        if (cancel_keys or tables) and not _committed(sink, batch_id,
                                                      isinstance(store, StoreGroup)):
            _apply(options, store.producer(options.producer_group), cancel_keys,
                   pa.concat_tables(tables, promote_options="default") if tables else None)
        sink.commit(batch_id, transactions)
    except SinkCommitError as exc:
        raise SinkWriteError(str(exc)) from None
    finally:
        store.close()


def _committed(sink, batch_id: int, grouped: bool) -> bool:
    """Whether ``batch_id`` is committed already (in every member of a group)."""
    done = sink.committed_batches()
    if grouped:
        return all(batch_id in member for member in done.values())
    return batch_id in done


def _abort(options: RmqOptions, sink_id: str) -> None:
    if options.guarantee == "at_least_once":
        return
    store = _open(options)
    try:
        store.sink(sink_id, options.producer_group).abort()
    finally:
        store.close()


class RmqSinkWriter(DataSourceArrowWriter):
    """Batch: ``df.write.format("rmq")``; the whole job becomes visible at once."""

    def __init__(self, options: RmqOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        ensure_store(options.path)
        self.options = options
        self.sink_id = options.sink_id or f"batch-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator) -> SinkCommitMessage:
        return _write_task(self.options, self.sink_id, iterator)

    def commit(self, messages) -> None:
        _commit(self.options, self.sink_id, messages, 0)

    def abort(self, messages) -> None:
        _abort(self.options, self.sink_id)


class RmqSinkStreamWriter(DataSourceStreamArrowWriter):
    """Streaming: ``df.writeStream.format("rmq")``; each micro-batch exactly once."""

    def __init__(self, options: RmqOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        ensure_store(options.path)
        self.options = options
        sink_id = options.sink_id or options.raw.get("checkpointlocation")
        if not sink_id and options.guarantee == "exactly_once":
            raise SinkWriteError(
                "the rmq sink needs an identity for exactly-once streaming: give the query "
                ".option('checkpointLocation', ...) (the usual way) or .option('sinkId', ...), "
                "or write with .option('guarantee', 'at_least_once')")
        self.sink_id = sink_id or "at-least-once"

    def write(self, iterator: Iterator) -> SinkCommitMessage:
        return _write_task(self.options, self.sink_id, iterator)

    def commit(self, messages, batchId: int) -> None:
        _commit(self.options, self.sink_id, messages, batchId)

    def abort(self, messages, batchId: int) -> None:
        _abort(self.options, self.sink_id)
