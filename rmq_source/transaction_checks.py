"""``view=transaction_checks``: the transaction check loop as a Spark stream.

Each trigger runs one round of the store's check loop (RocketMQ's check round: put-back
copies, discards after ``transaction_check_max`` checks, saved progress; see
:mod:`store.transaction.check_loop`), and the micro-batch holds the transactions the round asks
about.  Answer them by writing rows of ``transaction_id`` and ``state`` with
``.writeStream.format("rmq").option("action", "end_transaction")``
(:mod:`rmq_source.writer`); a transaction not answered stays open and is asked about again
in a later round (at most once per ``transaction_check_interval_ms``), until it is discarded.

Offsets are ``{"round": n, "stream": "<id>"}``: ``n`` counts the rounds of this query that
asked about something (rounds that found nothing plan no batch); ``stream`` is a random id
chosen when the query starts for the first time (it is kept in the checkpoint).  A round's
rows are written, before ``latestOffset`` returns, to
``<store>/transaction_checks/<stream>/<n:020d>.arrow`` (Arrow IPC file, written atomically),
so the executors of that batch, and a replay of it after a restart, read the same rows.
``commit`` deletes the files of finished batches.

With ``checkRounds=server`` the query runs no rounds: a server (``rmq serve
--check-transactions``, :class:`store.StoreServer`) does the bookkeeping and publishes each
round's questions (``store.read_check_round_table``); the query only reads them, so its resolvers
only answer.  Offsets are then ``{"round": n, "stream": "server"}`` with the server's round
numbers; a new query starts with the newest published round; rounds the server has pruned are
skipped (their open transactions are asked about again in later rounds); nothing is deleted
by the query.

Where things run: ``initialOffset``/``latestOffset``/``commit`` in Spark's long-lived
driver-side runner, which keeps one writable store open per path in this module (the reader
object itself holds only its options, so it pickles); ``read`` on executors, which only read
the round file.  With ``Trigger.AvailableNow`` the query runs exactly one round.

Over a served store (an ``rmq://`` path) the same happens on the server: it runs the round
and keeps its rows in its own store directory, the executors fetch them by round number, and
``commit`` asks it to delete them (:class:`_Rounds` hides which).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)

from store import (
    MessageStore,
    drop_query_rounds,
    is_remote,
    last_check_round,
    read_check_round_table,
    read_query_round,
    server_status,
    write_query_round,
)

from .errors import RmqSourceError
from .options import RmqOptions
from .stores import open_reader, open_writer

TRANSACTION_CHECKS_DDL = (
    "transaction_id string, producer_group string, topic string, queue_id int, "
    "msg_id string, tags string, keys array<string>, body binary, "
    "properties map<string,string>, born_timestamp timestamp, check_times int"
)

_TIMESTAMP = pa.timestamp("us", tz="UTC")
#: Exactly ``to_arrow_schema(<TRANSACTION_CHECKS_DDL>, timezone="UTC")`` (a test checks it).
TRANSACTION_CHECKS_SCHEMA = pa.schema([
    pa.field("transaction_id", pa.string()),
    pa.field("producer_group", pa.string()),
    pa.field("topic", pa.string()),
    pa.field("queue_id", pa.int32()),
    pa.field("msg_id", pa.string()),
    pa.field("tags", pa.string()),
    pa.field("keys", pa.list_(pa.field("element", pa.string()))),
    pa.field("body", pa.binary()),
    pa.field("properties", pa.map_(pa.field("key", pa.string(), nullable=False),
                                   pa.field("value", pa.string()))),
    pa.field("born_timestamp", _TIMESTAMP),
    pa.field("check_times", pa.int32()),
])

#: ``checkRounds`` values: who runs the rounds' bookkeeping.
CHECK_ROUNDS = ("query", "server")
SERVER_STREAM = "server"

log = logging.getLogger("rmq_source")
_lock = threading.Lock()
_stores: dict[str, MessageStore] = {}


class CheckLoopError(RmqSourceError):
    """The check loop could not run a round (the store could not be opened for writing)."""


def _writable_store(path: str) -> MessageStore:
    """A writable store for ``path`` kept open in this (driver-side runner) process."""
    with _lock:
        store = _stores.get(path)
        if store is None:
            store = _stores[path] = open_writer(
                path, error=CheckLoopError,
                needs="view=transaction_checks (a check round writes put-back copies)")
        return store


def close_kept_open(path: str) -> None:
    """Close the store this module keeps open for ``path`` (if any)."""
    with _lock:
        store = _stores.pop(path, None)
    if store is not None:
        store.close()


def rows_to_batch(views: Sequence) -> pa.RecordBatch:
    """Check views as Arrow rows: a round's ``plan.checks`` decoded as columns by the store
    (its ``to_arrow()``), or any sequence of
    :class:`store.transaction.check_loop.TransactionCheckView` one by one."""
    if hasattr(views, "to_arrow"):
        batch = views.to_arrow()
        return pa.RecordBatch.from_arrays(
            [batch.column(f.name) for f in TRANSACTION_CHECKS_SCHEMA],
            schema=TRANSACTION_CHECKS_SCHEMA)
    cols = {
        "transaction_id": [v.transaction_id for v in views],
        "producer_group": [v.producer_group for v in views],
        "topic": [v.topic for v in views],
        "queue_id": [v.queue_id for v in views],
        "msg_id": [v.msg_id for v in views],
        "tags": [v.tags for v in views],
        "keys": [list(v.keys) for v in views],
        "body": [bytes(v.body) for v in views],
        "properties": [sorted(v.properties.items()) for v in views],
        "born_timestamp": [v.born_timestamp_ms * 1000 for v in views],
        "check_times": [v.check_times for v in views],
    }
    arrays = [pa.array(cols[f.name], type=f.type) for f in TRANSACTION_CHECKS_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=TRANSACTION_CHECKS_SCHEMA)


class _Rounds:
    """Where a check-loop query's rounds are run and kept: in the store directory (a path),
    or on the server (an ``rmq://`` path: the server runs them and keeps their rows)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.remote = is_remote(path)

    def run(self, stream: str, number: int) -> bool:
        """One round's bookkeeping, its questions kept as round ``number``; ``False`` when
        it asked about nothing (driver-side runner)."""
        store = _writable_store(self.path)
        if self.remote:
            return store.run_check_round(stream, number)
        plan = store.prepare_transaction_checks()
        if not plan.checks:
            return False
        write_query_round(self.path, stream, number, rows_to_batch(plan.checks))
        return True

    def read(self, stream: str | None, number: int) -> pa.Table | None:
        """Round ``number`` of ``stream`` (``None``: a server-published round); ``None`` when
        it is gone (executors)."""
        if self.remote:
            store = open_reader(self.path)
            try:
                return store.read_check_round(stream, number)
            finally:
                store.close()
        if stream is None:
            return read_check_round_table(self.path, number)
        return read_query_round(self.path, stream, number)

    def drop(self, stream: str, last: int) -> None:
        if self.remote:
            _writable_store(self.path).drop_check_rounds(stream, last)
        else:
            drop_query_rounds(self.path, stream, last)

    def last_server_round(self) -> int:
        if self.remote:
            return _writable_store(self.path).last_check_round()
        return last_check_round(self.path)

    def server_attached(self) -> bool:
        if self.remote:
            return True  # the server answering is the server that publishes
        status = server_status(self.path)
        return bool(status and status.get("attached"))


@dataclass(frozen=True, slots=True)
class CheckRoundPartition(InputPartition):
    """The rows of one check round: round ``round_no`` of ``stream`` (see :class:`_Rounds`)."""

    path: str
    stream: str
    round_no: int


def _parse_offset(offset: dict) -> tuple[int, str]:
    try:
        return int(offset["round"]), str(offset["stream"])
    except (KeyError, TypeError, ValueError):
        raise CheckLoopError(
            f"offset {offset!r} is not a transaction_checks offset; allowed: "
            '{"round": n, "stream": id} (was the checkpoint written by another view?)') from None


class TransactionChecksStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader of ``view=transaction_checks`` (see the module docstring).

    Parameters
    ----------
    options : RmqOptions
        Parsed with ``streaming=True``; only ``path`` is used.
    """

    def __init__(self, options: RmqOptions) -> None:
        self.options = options
        self.path = options.path
        mode = options.raw.get("checkrounds", "query").strip().lower()
        if mode not in CHECK_ROUNDS:
            raise CheckLoopError(f"option checkRounds={options.raw['checkrounds']!r}; allowed: "
                                 "query (this query runs the check rounds) or server (a "
                                 "server started with --check-transactions runs them)")
        self.server_rounds = mode == "server"
        self.rounds = _Rounds(self.path)
        self._available_now: str | None = None  # None, "pending" or "done"
        self._target: int | None = None  # the server round AvailableNow stops at
        self._initial: dict | None = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "path": self.path,
                "server_rounds": self.server_rounds, "rounds": self.rounds,
                "_available_now": None, "_target": None, "_initial": None}

    # -- driver side -------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        # Spark may ask more than once: always give the same answer in this runner
        if self._initial is None:
            open_reader(self.options.path).close()  # a clear error for a path that is not a store
            if self.server_rounds:  # from the newest published round on
                first = max(0, self.rounds.last_server_round() - 1)
                self._initial = {"round": first, "stream": SERVER_STREAM}
            else:
                self._initial = {"round": 0, "stream": uuid.uuid4().hex}
        return dict(self._initial)

    def _check_stream(self, stream: str) -> None:
        if (stream == SERVER_STREAM) != self.server_rounds:
            raise CheckLoopError(
                f"this checkpoint was written with checkRounds="
                f"{'server' if stream == SERVER_STREAM else 'query'}; the query now has "
                f"checkRounds={'server' if self.server_rounds else 'query'}; allowed: the "
                "same value, or a new checkpointLocation")

    def _latest_server_round(self, start: dict) -> dict:
        round_no, stream = _parse_offset(start)
        self._check_stream(stream)
        if self._available_now == "pending":
            self._available_now, self._target = "done", self.rounds.last_server_round()
        latest = (self._target if self._available_now == "done"
                  else self.rounds.last_server_round())
        if latest <= round_no and not self.rounds.server_attached():
            log.warning("checkRounds=server but no server is attached to %s: start one with "
                        "`rmq serve --store %s --check-transactions`", self.path, self.path)
        return {"round": max(round_no, latest), "stream": SERVER_STREAM}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = "pending"

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self.server_rounds:
            return self._latest_server_round(start)
        round_no, stream = _parse_offset(start)
        self._check_stream(stream)
        if self._available_now == "done":
            return start
        if self._available_now == "pending":
            self._available_now = "done"
        nxt = round_no + 1
        if not self.rounds.run(stream, nxt):
            return start
        return {"round": nxt, "stream": stream}

    def partitions(self, start: dict, end: dict) -> list[CheckRoundPartition]:
        first, _ = _parse_offset(start)
        last, stream = _parse_offset(end)  # the rounds were written under end's stream id
        return [CheckRoundPartition(self.path, stream, r) for r in range(first + 1, last + 1)]

    def commit(self, end: dict) -> None:
        """Delete the round files of batches up to ``end`` (they will not be replayed); the
        server's rounds are the server's to prune."""
        last, stream = _parse_offset(end)
        if stream == SERVER_STREAM:
            return
        self.rounds.drop(stream, last)

    def stop(self) -> None:
        close_kept_open(self.path)

    # -- executor side -----------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        server = partition.stream == SERVER_STREAM
        table = _Rounds(partition.path).read(None if server else partition.stream,
                                             partition.round_no)
        if table is None:
            if server:
                return  # pruned: its open transactions are asked about again in a later round
            raise CheckLoopError(
                f"the rows of transaction check round {partition.round_no} (stream "
                f"{partition.stream} of {partition.path}) are gone; they are deleted once a "
                "batch is committed, so this batch was replayed after its commit or the "
                "directory was cleaned; allowed: restart the query from its checkpoint (open "
                "transactions are asked about again in a later round)")
        table = table.select([f.name for f in TRANSACTION_CHECKS_SCHEMA]).cast(
            TRANSACTION_CHECKS_SCHEMA)
        yield from table.to_batches()
