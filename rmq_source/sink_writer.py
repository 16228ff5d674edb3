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
=============  ======================================  =======================================

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
}


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
    ``by_store`` holds the halves of each member instead."""

    transactions: tuple[str, ...]
    rows: int
    by_store: tuple[tuple[str, tuple[str, ...]], ...] = ()


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
    rows = 0
    try:
        if options.guarantee == "at_least_once":
            write = store.producer(options.producer_group).send_table
        else:
            sink = store.sink(sink_id, options.producer_group)

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
                rows += _hand_over(options, write, pending)
                pending, size, count = [], 0, 0
        if pending:
            rows += _hand_over(options, write, pending)
    finally:
        store.close()
    return SinkCommitMessage(tuple(transactions), rows,
                             tuple((name, tuple(txs)) for name, txs in by_store.items()))


def _hand_over(options: RmqOptions, write, batches: list) -> int:
    table = pa.Table.from_batches(batches)
    try:
        write(table, topic=options.topic)
    except StoreError as exc:
        raise SinkWriteError(f"writing to rmq store {options.path}: {exc} (nothing of this "
                             "batch becomes visible)") from None
    return table.num_rows


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
    try:
        store.sink(sink_id, options.producer_group).commit(batch_id, transactions)
    except SinkCommitError as exc:
        raise SinkWriteError(str(exc)) from None
    finally:
        store.close()


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
