"""A served store seen from another process or host: :class:`RemoteStore`.

:func:`store.connect` (``connect("rmq://HOST:PORT")``) gives an object with the reading methods of a
:class:`~store.StoreReader` (``topics``, ``queue_ids``, ``min_offset``, ``max_offset``,
``offset_for_timestamp``, ``read_arrow``, ``pull``, ``follow``) and the writing ones of a
:class:`~store.MessageStore` that a client needs (``producer``, ``transaction_producer``,
``sink``, ``end_transaction(s)``, ``deliver_due``, ``flush``), with the same results and the
same typed errors: the server raises, the client raises the same class again (the
producers and the sink it gives out: :mod:`store.remote.remote_writers`).  A server that
cannot be reached, or does not answer within ``timeout_s``, raises
:class:`~store.base.errors.RemoteError` naming the address; a wrong token
:class:`~store.base.errors.AuthenticationError`.

The Flight client (gRPC underneath) is made at the first call, in the process making it, and
again after a ``fork`` (gRPC is not fork-safe; PySpark forks its Python workers), so a
``RemoteStore`` may be built on Spark's driver and used in a task.

Queue bounds (``topics``, ``queue_ids``, ``min_offset``, ``max_offset``) come from one
snapshot of every queue, taken at the first such call and again once it is older than
:data:`SNAPSHOT_MAX_AGE_S`: planning a query over many queues costs one round trip.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyarrow import flight

from ..core.following import follow_one
from ..core.message_columns import empty_batch, message_views, projected_schema
from ..base.errors import InvalidMessageError, OffsetOutOfRangeError, UnknownTopicError
from ..formats.message import MessageView
from ..produce.table_rows import as_table
from ..transaction.check_loop import parse_state
from ..base.remote_address import (
    DEFAULT_TIMEOUT_S,
    RemoteAddress,
    account_header,
    parse_replicas,
    read_token,
    replicas_url,
)
from .failover import FAILOVER_TIMEOUT_S, may_repeat, with_failover
from .remote_writers import RemoteProducer, RemoteSink, RemoteTransactionProducer
from .wire import END_OF_ROWS, dumps, loads, message_view, raise_remote, schedule_info

#: How long a snapshot of the queue bounds answers ``min_offset`` / ``max_offset``.
SNAPSHOT_MAX_AGE_S = 0.5


class RemoteStore:
    """A store served by ``rmq serve --listen`` (see the module docstring)."""

    def __init__(self, url: str, *, token: str | None = None, token_file: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 tls_root_certs: str | os.PathLike | None = None, account: str | None = None,
                 secret: str | None = None, secret_file: str | None = None,
                 failover_timeout_s: float = FAILOVER_TIMEOUT_S) -> None:
        #: the servers the URL names: one, or a replica set's replicas (:mod:`.failover`)
        self.addresses = parse_replicas(url)
        self.address = self.addresses[0]  # the one called
        self.root = replicas_url(self.addresses)  # where a local store has its directory
        self.timeout_s = float(timeout_s)
        self.failover_timeout_s = float(failover_timeout_s)
        self._leader_unknown = len(self.addresses) > 1
        self._token = read_token(token, token_file)
        self._credentials = account_header(account, read_token(secret, secret_file),
                                           self._token)
        self._root_certs = None
        if tls_root_certs is not None:
            with open(tls_root_certs, "rb") as fh:
                self._root_certs = fh.read()
        self._client: flight.FlightClient | None = None
        self._pid = -1
        self._snapshot: dict | None = None
        self._snapshot_at = 0.0
        self._info: dict | None = None
        #: accepted for the interface of a local store; encoding happens on the server
        self.encode_threads = 1

    # ------------------------------------------------------------------ plumbing
    def __repr__(self) -> str:
        return f"RemoteStore({self.root!r})"  # never the token

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        client, self._client = self._client, None
        if client is not None and self._pid == os.getpid():
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken channel
                pass

    def _connection(self) -> flight.FlightClient:
        if self._client is None or self._pid != os.getpid():
            kwargs = {}
            if self._root_certs is not None:
                kwargs["tls_root_certs"] = self._root_certs
            try:
                self._client = flight.FlightClient(self.address.location, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a bad location or TLS setting
                self._failed(exc)
            self._pid = os.getpid()
        return self._client

    def _failed(self, exc: BaseException) -> None:
        """Raise what a failed call means; after a transport failure (no answer from the
        server) the channel is dropped, so that the next call connects afresh instead of
        waiting out gRPC's reconnect back-off."""
        if not getattr(exc, "extra_info", None):
            self.close()
        raise_remote(exc, self.address.url)

    def _options(self, timeout_s: float | None = None) -> flight.FlightCallOptions:
        headers = [] if self._credentials is None else [(b"authorization", self._credentials)]
        return flight.FlightCallOptions(timeout=timeout_s or self.timeout_s, headers=headers)

    def _point(self, address: RemoteAddress) -> None:
        """Call ``address`` from now on (a replica set's leader, :mod:`.failover`)."""
        if address != self.address:
            self.close()
            self.address = address

    def _replicated(self, op: str, call, body: dict | None = None):
        """``call()``, through :func:`~.failover.with_failover` when the URL names several
        replicas."""
        if len(self.addresses) == 1:
            return call()
        return with_failover(self, op, call, may_repeat(op, body))

    def _action(self, name: str, body: dict | None = None) -> dict:
        return self._replicated(name, lambda: self._action_once(name, body), body)

    def _action_once(self, name: str, body: dict | None = None, *,
                     timeout_s: float | None = None) -> dict:
        try:
            results = list(self._connection().do_action(
                flight.Action(name, dumps(body or {})), self._options(timeout_s)))
        except flight.FlightError as exc:
            self._failed(exc)
        return loads(results[0].body.to_pybytes(), f"the answer of {name}")

    def _put(self, command: dict, table: pa.Table) -> bytes:
        return self._replicated(command["op"], lambda: self._put_once(command, table))

    def _put_once(self, command: dict, table: pa.Table) -> bytes:
        try:
            writer, answers = self._connection().do_put(
                flight.FlightDescriptor.for_command(dumps(command)), table.schema,
                self._options())
            try:
                writer.write_table(table)
                writer.write_metadata(dumps({END_OF_ROWS: table.num_rows}))
                writer.done_writing()
                answer = answers.read()
            finally:
                writer.close()
        except flight.FlightError as exc:
            self._failed(exc)
        return b"" if answer is None else answer.to_pybytes()

    def _exchange(self, command: dict, table: pa.Table) -> pa.Table:
        """A table in, a table out (``DoExchange``): ``send_table`` and its results."""
        return self._replicated(command["op"], lambda: self._exchange_once(command, table))

    def _exchange_once(self, command: dict, table: pa.Table) -> pa.Table:
        try:
            writer, reader = self._connection().do_exchange(
                flight.FlightDescriptor.for_command(dumps(command)), self._options())
            try:
                writer.begin(table.schema)
                writer.write_table(table)
                writer.write_metadata(dumps({END_OF_ROWS: table.num_rows}))
                writer.done_writing()
                return reader.read_all()
            finally:
                writer.close()
        except flight.FlightError as exc:
            self._failed(exc)

    # ------------------------------------------------------------------ what it serves
    def info(self) -> dict:
        """``version``, ``written_by_rmq`` and ``url`` of the served store."""
        if self._info is None:
            self._info = self._action("info")
        return self._info

    @property
    def written_by_rmq(self) -> bool:
        return bool(self.info()["written_by_rmq"])

    def refresh(self) -> None:
        """Forget the snapshot of queue bounds: the next call asks the server again."""
        self._snapshot = None

    def _queues(self) -> dict:
        now = time.monotonic()
        if self._snapshot is None or now - self._snapshot_at > SNAPSHOT_MAX_AGE_S:
            topics = self._action("snapshot")["topics"]
            self._snapshot = {t: {q: (lo, hi) for q, lo, hi in rows}
                              for t, rows in topics.items()}
            self._snapshot_at = now
        return self._snapshot

    def topics(self) -> list[str]:
        """The user topics of the served store."""
        return list(self._queues())

    def queue_ids(self, topic: str) -> list[int]:
        """The queue ids of ``topic``; :class:`UnknownTopicError` when it does not exist."""
        queues = self._queues().get(topic)
        if queues is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist in store "
                                    f"{self.address.url}; existing topics: {self.topics()}")
        return sorted(queues)

    def _bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        ids = self.queue_ids(topic)
        if queue_id not in ids:
            raise UnknownTopicError(f"queue_id {queue_id!r} does not exist for topic "
                                    f"{topic!r}; allowed: 0 to {len(ids) - 1}")
        return self._queues()[topic][queue_id]

    def queue_bounds(self, queues) -> dict[tuple[str, int], tuple[int, int]]:
        """``{(topic, queue_id): (min_offset, max_offset)}`` of many queues, from one
        snapshot (as :meth:`store.StoreReader.queue_bounds`)."""
        return {(t, q): self._bounds(t, q) for t, q in queues}

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest offset still readable."""
        return self._bounds(topic, queue_id)[0]

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the newest visible message of the queue."""
        return self._bounds(topic, queue_id)[1]

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset of the queue stored at or after ``timestamp_ms``."""
        return int(self._action("offset_for_timestamp", {
            "topic": topic, "queue_id": int(queue_id),
            "timestamp_ms": int(timestamp_ms)})["offset"])

    def query_messages(self, topic: str, key: str | None = None, begin_ms: int | None = None,
                       end_ms: int | None = None, max: int = 64) -> list[MessageView]:
        """Messages by key or store time, answered by the server as
        :meth:`MessageStore.query_messages <store.MessageStore.query_messages>` (only they
        cross the network; ``max`` at most 10,000)."""
        answer = self._action("query_messages", {"topic": topic, "key": key,
                                                 "begin_ms": begin_ms, "end_ms": end_ms,
                                                 "max": max})
        return [message_view(fields) for fields in answer["messages"]]

    def view_message(self, msg_id: str, *, topic: str | None = None) -> MessageView | None:
        """One message by id, as :meth:`MessageStore.view_message
        <store.MessageStore.view_message>`; ``None`` when the store has none."""
        fields = self._action("view_message", {"msg_id": msg_id, "topic": topic})["message"]
        return None if fields is None else message_view(fields)

    # ------------------------------------------------------------------ reading
    def read_batches(self, topic: str, queue_id: int, start: int, end: int, *,
                     tags: Iterable[str] | None = None, columns: Sequence[str] | None = None,
                     verify_crc: bool = False, skip_corrupt: bool = False):
        """Queue offsets ``[start, end)`` as ``pyarrow.RecordBatch``es, streamed by one call
        (each of at most 65,536 offsets)."""
        ticket = {"op": "read", "topic": topic, "queue_id": int(queue_id), "start": int(start),
                  "end": int(end), "tags": None if tags is None else list(tags),
                  "columns": None if columns is None else list(columns),
                  "verify_crc": bool(verify_crc), "skip_corrupt": bool(skip_corrupt)}
        def first():  # (a replica set: the stream is opened again until it starts)
            try:
                stream = self._connection().do_get(flight.Ticket(dumps(ticket)),
                                                   self._options())
                return stream, stream.read_chunk()
            except StopIteration:
                return None, None
            except flight.FlightError as exc:
                self._failed(exc)

        stream, chunk = self._replicated("read", first)
        if stream is None:
            return
        try:
            while True:
                yield chunk.data
                chunk = stream.read_chunk()
        except StopIteration:
            return
        except flight.FlightError as exc:
            self._failed(exc)

    def log_chunks(self, start: int, *, tail_crc: int, file_size: int, max_bytes: int,
                   wait_ms: int, replica: str | None = None, high_watermark: int | None = None,
                   epoch: int | None = None):
        """The served store's CommitLog from offset ``start`` as batches of whole records, for
        a replica set's follower (:mod:`store.remote.replication_stream`; ``replica``: the
        follower's URL, so that the leader counts ``start`` as what it holds;
        ``high_watermark``: the leader's as last heard; ``epoch``: the leader's epoch when
        the follower took its terms, so that a later term is refused until taken); the
        account needs the replication right."""
        ticket = {"op": "replicate", "from": int(start), "tail_crc": int(tail_crc),
                  "file_size": int(file_size), "max_bytes": int(max_bytes),
                  "wait_ms": int(wait_ms)}
        if replica is not None:
            ticket["replica"] = replica
        if high_watermark is not None:
            ticket["high_watermark"] = int(high_watermark)
        if epoch is not None:
            ticket["epoch"] = int(epoch)
        try:
            stream = self._connection().do_get(
                flight.Ticket(dumps(ticket)), self._options(self.timeout_s + wait_ms / 1000))
            for chunk in stream:
                yield chunk.data
        except flight.FlightError as exc:
            self._failed(exc)

    def replica_epochs(self) -> dict:
        """The served replica's ``epoch`` and terms (``epochs``: ``[epoch, start offset]``
        pairs, :mod:`store.files.epoch_file`); the replication right is needed."""
        return self._action("epochs")

    def consumer_progress(self, *, since: dict | None | object = ...) -> dict:
        """The served leader's saved consumer-group progress (offsets and acks of its gRPC
        consumer groups, with its epoch); the replication right is needed and only a leader
        answers.  Without ``since``, whole and in the older shape
        (:mod:`store.files.consumer_progress` checks it); with ``since`` (the leader's
        epoch, log and version of the copy held, ``None`` for none), as columns and only
        what changed since (:mod:`store.files.progress_table`)."""
        return self._action("consumer_progress", {} if since is ... else {"since": since})

    def read_arrow(self, topic: str, queue_id: int, start: int, end: int, *,
                   tags: Iterable[str] | None = None, columns: Sequence[str] | None = None,
                   verify_crc: bool = False, skip_corrupt: bool = False) -> pa.RecordBatch:
        """As :meth:`StoreReader.read_arrow <store.StoreReader.read_arrow>`: one batch."""
        batches = list(self.read_batches(topic, queue_id, start, end, tags=tags,
                                         columns=columns, verify_crc=verify_crc,
                                         skip_corrupt=skip_corrupt))
        if not batches:
            return empty_batch(projected_schema(columns))
        if len(batches) == 1:
            return batches[0]
        return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]

    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, *,
             verify_crc: bool = False) -> list[MessageView]:
        """Up to ``max_messages`` messages of a queue from ``offset`` on, as
        :meth:`MessageStore.pull <store.MessageStore.pull>`: ``[]`` at the end of the queue,
        :class:`OffsetOutOfRangeError` below :meth:`min_offset` or above :meth:`max_offset`.

        Built on :meth:`read_arrow` (one call, and one for fresh queue bounds when
        ``offset`` is at or past the snapshot's end): every field but ``sys_flag`` and
        ``system_properties`` (the broker's bookkeeping, which reads do not carry), which
        keep their defaults.
        """
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) \
                or max_messages <= 0:
            raise InvalidMessageError(f"max_messages={max_messages!r}; allowed: an int >= 1")
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            raise OffsetOutOfRangeError(f"offset={offset!r}; allowed: an int queue offset")
        offset = int(offset)
        lo, hi = self._bounds(topic, queue_id)
        if offset >= hi:  # the snapshot may be behind the queue's end: ask again
            self.refresh()
            lo, hi = self._bounds(topic, queue_id)
        if offset < lo or offset > hi:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}/{queue_id} is out of range; allowed: {lo} to {hi}"
                + (" (older messages were removed by retention)" if offset < lo else ""))
        if offset == hi:
            return []
        return message_views(self.read_arrow(topic, queue_id, offset,
                                             min(hi, offset + max_messages),
                                             verify_crc=verify_crc))

    def follow(self, topic: str, *, start: str = "latest", poll_interval_s: float = 0.2,
               stop: Callable[[], bool] | None = None, deliver_due: bool = False
               ) -> Iterator[MessageView]:
        """Every message of ``topic`` as it becomes visible, as
        :meth:`MessageStore.follow <store.MessageStore.follow>` (one snapshot of the queue
        bounds per round, then a read of each queue that grew).  The server delivers due
        messages itself; ``deliver_due`` asks it to once more per round."""
        return follow_one(self, topic, start=start, poll_interval_s=poll_interval_s,
                          stop=stop, deliver_due=deliver_due)

    # ------------------------------------------------------------------ writing
    def producer(self, group: str = "DEFAULT_PRODUCER") -> RemoteProducer:
        """A producer of ``group`` sending to the served store."""
        return RemoteProducer(self, group)

    def transaction_producer(self, group: str, listener) -> RemoteTransactionProducer:
        """A producer that sends half messages to the served store and runs ``listener``'s
        local transaction here."""
        return RemoteTransactionProducer(self, group, listener)

    def sink(self, sink_id: str, group: str = "rmq-sink", *,
             commit: str = "index") -> RemoteSink:
        """The exactly-once sink ``sink_id`` of the served store (``commit``: see
        :meth:`MessageStore.sink <store.facade.message_store.MessageStore.sink>`)."""
        return RemoteSink(self, sink_id, group, commit)

    def end_transaction(self, transaction_id: str, state) -> bool:
        """End one transaction (see :meth:`MessageStore.end_transaction`)."""
        return self.end_transactions([(transaction_id, state)])[0]

    def end_transactions(self, items, *, from_check: bool = False) -> list[bool]:
        """End many transactions in one append; each is checked before anything is written."""
        pairs = [[str(tx), parse_state(state).name] for tx, state in items]
        return list(self._action("end_transactions", {"items": pairs})["ended"])

    def ensure_topic(self, topic: str) -> int:
        """Create ``topic`` on the server when missing; return its queue count."""
        self.refresh()
        return int(self._action("ensure_topic", {"topic": topic})["queues"])

    def known_transactions(self, transaction_ids) -> list[bool]:
        """Whether the served store holds the half message of each transaction id."""
        ids = [str(t) for t in transaction_ids]
        return list(self._action("known_transactions", {"ids": ids})["known"]) if ids else []

    def check_table(self, data, *, topic: str | None = None) -> int:
        """Validate a table as ``send_table`` would, writing nothing; return its rows."""
        raw = self._put({"op": "check_table", "group": "check", "topic": topic},
                        as_table(data))
        return int(loads(raw, "the answer of check_table")["rows"])

    def schedules(self) -> list:
        """The served store's recurring schedules (``MessageStore.schedules``)."""
        return [schedule_info(f) for f in self._action("schedules", {})["schedules"]]

    def remove_schedule(self, key: str) -> bool:
        return bool(self._action("remove_schedule", {"key": key})["changed"])

    def pause_schedule(self, key: str) -> bool:
        return bool(self._action("pause_schedule", {"key": key})["changed"])

    def resume_schedule(self, key: str) -> bool:
        return bool(self._action("resume_schedule", {"key": key})["changed"])

    def deliver_due(self, max_messages: int | None = None) -> int:
        """Ask the server to deliver due delayed messages now (it does so on its own too)."""
        return int(self._action("deliver_due", {"max_messages": max_messages})["delivered"])

    def flush(self) -> None:
        """Make everything appended on the server durable now."""
        self._action("flush")

    # ------------------------------------------------------------------ check rounds
    def run_check_round(self, stream: str, number: int) -> bool:
        """Run a check round on the server for the check-loop query ``stream`` and keep its
        questions there as round ``number``; ``False`` when there was nothing to ask."""
        return bool(self._action("run_check_round", {"stream": stream,
                                                     "round": int(number)})["written"])

    def read_check_round(self, stream: str | None, number: int) -> pa.Table | None:
        """Round ``number`` of check-loop query ``stream`` (``None``: a round the server
        published); ``None`` once deleted or pruned."""
        ticket = ({"op": "server_round", "round": int(number)} if stream is None else
                  {"op": "query_round", "stream": stream, "round": int(number)})
        try:
            table = self._connection().do_get(flight.Ticket(dumps(ticket)),
                                              self._options()).read_all()
        except flight.FlightError as exc:
            self._failed(exc)
        return None if table.column_names == ["missing"] else table

    def drop_check_rounds(self, stream: str, last: int) -> None:
        """Delete the check-loop query's rounds up to ``last`` on the server."""
        self._action("drop_check_rounds", {"stream": stream, "last": int(last)})

    def last_check_round(self) -> int:
        """The newest check round the server published (``rmq serve --check-transactions``)."""
        return int(self._action("last_check_round")["round"])
