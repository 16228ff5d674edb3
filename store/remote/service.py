"""A store served over Arrow Flight: what ``rmq serve --listen`` runs beside its loop.

The service answers the calls of :mod:`store.remote.wire` for one open
:class:`~store.MessageStore`:

* **reads** (``DoGet``) run on a :class:`~store.StoreReader` of the same directory, one per
  server thread, with the same vectorised decode as a local read; the batches are sent as
  they are decoded;
* **writes** (sends, tables, the sink's stages and commits, transaction ends, cancels) go
  through the server's store, one at a time (the store's own lock orders them against the
  server's delivery and retention);
* a request never names a file: topics, queues, offsets, sink ids and transaction ids only.

Every request carries the token when the server has one (``authorization: Bearer <token>``,
compared in constant time); a missing or wrong one is refused before anything is read and
logged with the peer's address, never with the token.  A store error becomes a Flight error
carrying its type (the client raises the same class); a malformed request is refused with
:class:`~store.remote.wire.InvalidRequest`; the service keeps serving either way.
"""

from __future__ import annotations

import hmac
import logging
import threading

import pyarrow as pa
from pyarrow import flight

from ..core.message_columns import projected_schema
from ..errors import StoreError
from ..message import Message
from ..operations.check_rounds import (drop_query_rounds, last_check_round,
                                       read_check_round_table, read_query_round,
                                       write_query_round)
from ..produce.table_rows import prepare_rows
from ..reader import StoreReader
from ..transaction.producer import LeaveOpen
from .address import RemoteAddress
from .wire import (ACTIONS, MAX_MESSAGE_BYTES, PUTS, RESULT_FIELDS, InvalidRequest, dumps,
                   schedule_fields, MAX_QUERY_MESSAGES, view_fields,
                   error_info, field, loads, unb64)

log = logging.getLogger("store.remote")

#: Queue offsets read per batch of a ``DoGet`` (the Spark source's batch size).
READ_CHUNK = 65536
#: The version of the calls (:mod:`store.remote.wire`) this service answers.
WIRE_VERSION = 1


class _TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call whose ``authorization`` header is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info, headers):
        given = headers.get("authorization") or headers.get("Authorization") or [""]
        if not hmac.compare_digest(str(given[0]).encode(), self._expected):
            log.warning("refused a %s call: %s token", info.method.name,
                        "wrong" if given[0] else "no")
            raise flight.FlightUnauthenticatedError(
                "missing or wrong token; allowed: the server's token as 'Bearer <token>'")
        return None


def _unless_quiet(fn):
    """Run a Flight handler; store errors and bad requests become typed Flight errors."""

    def handler(self, *args):
        try:
            return fn(self, *args)
        except (flight.FlightError, flight.FlightCancelledError):
            raise
        except InvalidRequest as exc:
            log.warning("refused a request: %s", exc)
            raise flight.FlightServerError(str(exc), extra_info=error_info(exc)) from None
        except StoreError as exc:
            raise flight.FlightServerError(str(exc), extra_info=error_info(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a bug must not end the server
            log.exception("request failed")
            raise flight.FlightInternalError(f"{type(exc).__name__}: {exc}") from None

    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


class StoreService(flight.FlightServerBase):
    """Serves ``store`` (an open :class:`~store.MessageStore`) at ``address`` until
    :meth:`shutdown`.

    Parameters
    ----------
    store : MessageStore
        The store the server process has open.
    address : RemoteAddress
        Where to listen (port 0: any free port; :attr:`url` says which).
    token : str, optional
        The shared secret every request must carry.
    tls : (bytes, bytes), optional
        PEM certificate chain and private key (``rmqs://``).
    """

    def __init__(self, store, address: RemoteAddress, *, token: str | None = None,
                 tls: tuple[bytes, bytes] | None = None) -> None:
        if address.tls and tls is None:
            raise StoreError("an rmqs:// (TLS) address needs a certificate and a key")
        middleware = {"token": _TokenCheck(token)} if token else {}
        super().__init__(address.location, tls_certificates=[tls] if tls else [],
                         middleware=middleware)
        self.store = store
        self.path = store.root
        self.address = RemoteAddress(address.host, self.port, address.tls)
        self._local = threading.local()
        self._readers: list[StoreReader] = []
        self._readers_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._producers: dict[str, object] = {}
        self._half_producers: dict[str, object] = {}

    @property
    def url(self) -> str:
        return self.address.url

    # ------------------------------------------------------------------ helpers
    def _reader(self) -> StoreReader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = StoreReader.open(self.path)
            with self._readers_lock:
                self._readers.append(reader)
        return reader

    def _producer(self, group: str):
        found = self._producers.get(group)
        if found is None:
            found = self._producers[group] = self.store.producer(group)
        return found

    def close_readers(self) -> None:
        with self._readers_lock:
            for reader in self._readers:
                reader.close()
            self._readers.clear()

    # ------------------------------------------------------------------ reads
    @_unless_quiet
    def do_get(self, context, ticket):
        """One queue range as ``messages`` batches (the first decoded before the answer
        starts, so that its errors are typed)."""
        body = loads(ticket.ticket, "the ticket")
        what = "read"
        op = field(body, "op", str, what)
        if op in ("query_round", "server_round"):
            return self._round(body, op)
        if op != "read":
            raise InvalidRequest(f"unknown ticket op {op!r}; allowed: 'read', 'query_round', "
                                 "'server_round'")
        topic = field(body, "topic", str, what)
        queue_id = field(body, "queue_id", int, what)
        start = field(body, "start", int, what)
        end = field(body, "end", int, what)
        tags = field(body, "tags", list, what, optional=True)
        columns = field(body, "columns", list, what, optional=True)
        verify_crc = bool(field(body, "verify_crc", bool, what, default=False))
        skip_corrupt = bool(field(body, "skip_corrupt", bool, what, default=False))
        try:
            schema = projected_schema(columns)
        except ValueError as exc:
            raise InvalidRequest(f"read: {exc}") from None
        reader = self._reader()

        def read(lo: int, hi: int):
            return reader.read_arrow(topic, queue_id, lo, hi, tags=tags, columns=columns,
                                     verify_crc=verify_crc, skip_corrupt=skip_corrupt)

        first = read(start, min(end, start + READ_CHUNK))

        def batches():
            yield first
            lo = start + READ_CHUNK
            while lo < end:
                try:
                    batch = read(lo, min(end, lo + READ_CHUNK))
                except StoreError as exc:
                    raise flight.FlightServerError(str(exc), extra_info=error_info(exc)) from None
                if batch.num_rows:
                    yield batch
                lo += READ_CHUNK

        return flight.GeneratorStream(schema, batches())

    def _round(self, body: dict, op: str):
        """A check round's questions: a check-loop query's (kept by ``run_check_round``) or
        one the server published; no rows once it was deleted or pruned."""
        number = field(body, "round", int, op)
        if op == "query_round":
            try:
                table = read_query_round(self.path, field(body, "stream", str, op), number)
            except StoreError as exc:  # a stream that is no id
                raise InvalidRequest(str(exc)) from None
        else:
            table = read_check_round_table(self.path, number)
        if table is None:
            return flight.RecordBatchStream(pa.table({"missing": pa.array([], pa.bool_())}))
        return flight.RecordBatchStream(table)

    # ------------------------------------------------------------------ table writes
    @_unless_quiet
    def do_put(self, context, descriptor, reader, writer):
        """A table of rows: a sink's stage, or a dry run of ``send_table`` (see
        :mod:`.wire`)."""
        body = loads(descriptor.command or b"", "the descriptor command")
        op = field(body, "op", str, "put")
        if op not in PUTS:
            raise InvalidRequest(f"unknown put op {op!r}; allowed: {list(PUTS)}")
        group = field(body, "group", str, op)
        topic = field(body, "topic", str, op, optional=True)
        table = reader.read_all()
        if op == "check_table":  # a store group validates every share before any writes
            rows = prepare_rows(self.store, table, topic=topic)
            writer.write(pa.py_buffer(dumps({"rows": len(rows)})))
            return
        sink_id = field(body, "sink_id", str, op)
        with self._write_lock:
            staged = self.store.sink(sink_id, group).stage(table, topic=topic)
        writer.write(pa.py_buffer(dumps({"transactions": staged})))

    @_unless_quiet
    def do_exchange(self, context, descriptor, reader, writer):
        """``send_table``: the rows in, the results table out, both as Arrow streams."""
        body = loads(descriptor.command or b"", "the descriptor command")
        op = field(body, "op", str, "exchange")
        if op not in ("send_table", "replace_table", "schedule_table"):
            raise InvalidRequest(f"unknown exchange op {op!r}; allowed: 'send_table', "
                                 "'replace_table', 'schedule_table'")
        group = field(body, "group", str, op)
        topic = field(body, "topic", str, op, optional=True)
        table = reader.read_all()
        with self._write_lock:
            result = getattr(self._producer(group), op)(table, topic=topic)
        if op == "schedule_table":
            result = pa.table({name: [getattr(result, name)]
                               for name in ("changed", "unchanged", "removed")})
        writer.begin(result.schema)
        writer.write_table(result)

    # ------------------------------------------------------------------ actions
    def list_actions(self, context):
        return sorted(ACTIONS.items())

    @_unless_quiet
    def do_action(self, context, action):
        name = action.type
        handler = getattr(self, f"_action_{name}", None)
        if name not in ACTIONS or handler is None:
            raise InvalidRequest(f"unknown action {name!r}; allowed: {sorted(ACTIONS)}")
        raw = action.body.to_pybytes() if action.body is not None else b""
        if len(raw) > MAX_MESSAGE_BYTES:
            raise InvalidRequest(f"action {name}: body of {len(raw)} bytes; allowed: at most "
                                 f"{MAX_MESSAGE_BYTES}")
        body = loads(raw or b"{}", f"the body of action {name}")
        if not isinstance(body, dict):
            raise InvalidRequest(f"action {name}: the body must be a JSON object")
        return [flight.Result(pa.py_buffer(dumps(handler(body))))]

    def _action_info(self, body: dict) -> dict:
        reader = self._reader()
        return {"version": WIRE_VERSION, "written_by_rmq": reader.written_by_rmq,
                "url": self.url}

    def _action_snapshot(self, body: dict) -> dict:
        reader = self._reader()
        topics = {}
        for topic in reader.topics():
            topics[topic] = [[q, reader.min_offset(topic, q), reader.max_offset(topic, q)]
                             for q in reader.queue_ids(topic)]
        return {"topics": topics}

    def _action_query_messages(self, body: dict) -> dict:
        what = "query_messages"
        limit = field(body, "max", int, what, default=64)
        if not 1 <= limit <= MAX_QUERY_MESSAGES:
            raise InvalidRequest(f"{what}: max={limit}; allowed: 1 to {MAX_QUERY_MESSAGES}")
        views = self._reader().query_messages(
            field(body, "topic", str, what), key=field(body, "key", str, what, optional=True),
            begin_ms=field(body, "begin_ms", int, what, optional=True),
            end_ms=field(body, "end_ms", int, what, optional=True), max=limit)
        return {"messages": [view_fields(v) for v in views]}

    def _action_view_message(self, body: dict) -> dict:
        what = "view_message"
        view = self._reader().view_message(field(body, "msg_id", str, what),
                                           topic=field(body, "topic", str, what, optional=True))
        return {"message": None if view is None else view_fields(view)}

    def _action_offset_for_timestamp(self, body: dict) -> dict:
        what = "offset_for_timestamp"
        return {"offset": self._reader().offset_for_timestamp(
            field(body, "topic", str, what), field(body, "queue_id", int, what),
            field(body, "timestamp_ms", int, what))}

    @staticmethod
    def _message(body, what: str) -> Message:
        if not isinstance(body, dict):
            raise InvalidRequest(f"{what}: a message must be a JSON object")
        properties = field(body, "properties", dict, what, default={})
        keys = body.get("keys")
        if keys is not None and not isinstance(keys, (str, list)):
            raise InvalidRequest(f"{what}: field 'keys' must be a string or a list")
        return Message(field(body, "topic", str, what), unb64(field(body, "body", str, what),
                                                              f"{what}: body"),
                       tags=field(body, "tags", str, what, optional=True),
                       keys=keys, properties=properties,
                       flag=field(body, "flag", int, what, default=0))

    def _action_send(self, body: dict) -> dict:
        message = self._message(body.get("message"), "send")
        options = {k: field(body, k, int, "send", optional=True)
                   for k in ("delay_level", "delay_ms", "deliver_at_ms", "queue_id")}
        options["sharding_key"] = field(body, "sharding_key", str, "send", optional=True)
        options["key"] = field(body, "key", str, "send", optional=True)
        with self._write_lock:
            result = self._producer(field(body, "group", str, "send")).send(message, **options)
        return _result(result)

    def _action_send_batch(self, body: dict) -> dict:
        messages = field(body, "messages", list, "send_batch")
        batch = [self._message(m, "send_batch") for m in messages]
        with self._write_lock:
            results = self._producer(field(body, "group", str, "send_batch")).send_batch(
                batch, queue_id=field(body, "queue_id", int, "send_batch", optional=True),
                sharding_key=field(body, "sharding_key", str, "send_batch", optional=True))
        return {"results": [_result(r) for r in results]}

    def _action_cancel(self, body: dict) -> dict:
        key = field(body, "key", str, "cancel", optional=True)
        with self._write_lock:
            producer = self._producer(field(body, "group", str, "cancel"))
            if key is not None:
                found = producer.cancel(key=key)
            else:
                found = producer.cancel(field(body, "topic", str, "cancel"),
                                        field(body, "msg_id", str, "cancel"))
        return {"cancelled": bool(found)}

    def _keys(self, body: dict, what: str) -> list:
        keys = field(body, "keys", list, what)
        if not all(isinstance(k, str) for k in keys):
            raise InvalidRequest(f"{what}: field 'keys' must be a list of str")
        return keys

    def _action_cancel_keys(self, body: dict) -> dict:
        keys = self._keys(body, "cancel_keys")
        with self._write_lock:
            found = self._producer(field(body, "group", str, "cancel_keys")).cancel_keys(keys)
        return {"cancelled": [bool(v) for v in found]}

    def _action_pending_keys(self, body: dict) -> dict:
        keys = self._keys(body, "pending_keys")
        with self._write_lock:
            found = self._producer(field(body, "group", str, "pending_keys")).pending_keys(keys)
        return {"pending": [bool(v) for v in found]}

    def _action_schedule(self, body: dict) -> dict:
        message = self._message(body.get("message"), "schedule")
        options = {k: field(body, k, int, "schedule", optional=True)
                   for k in ("every_ms", "start_at_ms", "end_at_ms", "max_fires",
                             "catch_up_window_ms")}
        options["cron"] = field(body, "cron", str, "schedule", optional=True)
        options["catch_up"] = field(body, "catch_up", str, "schedule", default="latest_once")
        options["tz"] = field(body, "tz", str, "schedule", default="UTC")
        with self._write_lock:
            info = self._producer(field(body, "group", str, "schedule")).schedule(
                message, key=field(body, "key", str, "schedule"), **options)
        return {"schedule": schedule_fields(info)}

    def _action_schedules(self, body: dict) -> dict:
        return {"schedules": [schedule_fields(i) for i in self.store.schedules()]}

    def _schedule_change(self, body: dict, what: str) -> dict:
        key = field(body, "key", str, what)
        with self._write_lock:
            return {"changed": bool(getattr(self.store, what)(key))}

    def _action_remove_schedule(self, body: dict) -> dict:
        return self._schedule_change(body, "remove_schedule")

    def _action_pause_schedule(self, body: dict) -> dict:
        return self._schedule_change(body, "pause_schedule")

    def _action_resume_schedule(self, body: dict) -> dict:
        return self._schedule_change(body, "resume_schedule")

    def _action_end_transactions(self, body: dict) -> dict:
        items = field(body, "items", list, "end_transactions")
        pairs = []
        for item in items:
            if (not isinstance(item, list) or len(item) != 2
                    or not all(isinstance(v, str) for v in item)):
                raise InvalidRequest("end_transactions: each item must be [transaction id, "
                                     "state]")
            pairs.append((item[0], item[1]))
        with self._write_lock:
            ended = self.store.end_transactions(pairs)
        return {"ended": [bool(e) for e in ended]}

    def _action_send_half(self, body: dict) -> dict:
        group = field(body, "group", str, "send_half")
        message = self._message(body.get("message"), "send_half")
        with self._write_lock:
            producer = self._half_producers.get(group)
            if producer is None:  # the caller runs the local transaction and ends it
                producer = self._half_producers[group] = self.store.transaction_producer(
                    group, LeaveOpen())
            result = producer.send_in_transaction(message)
        out = _result(result)
        out["half_topic"] = result.half_topic
        return out

    def _sink(self, body: dict, what: str):
        return self.store.sink(field(body, "sink_id", str, what),
                               field(body, "group", str, what, default="rmq-sink"))

    def _action_sink_commit(self, body: dict) -> dict:
        txs = field(body, "transactions", list, "sink_commit")
        if not all(isinstance(t, str) for t in txs):
            raise InvalidRequest("sink_commit: transactions must be strings")
        with self._write_lock:
            done = self._sink(body, "sink_commit").commit(
                field(body, "batch_id", int, "sink_commit"), txs)
        return {"rows": done.rows, "halves": done.halves, "rolled_back": done.rolled_back,
                "replayed": done.replayed}

    def _action_sink_abort(self, body: dict) -> dict:
        with self._write_lock:
            return {"rolled_back": self._sink(body, "sink_abort").abort()}

    def _action_sink_open_halves(self, body: dict) -> dict:
        with self._write_lock:
            return {"transactions": self._sink(body, "sink_open_halves").open_halves()}

    def _action_sink_committed_batches(self, body: dict) -> dict:
        with self._write_lock:
            done = self._sink(body, "sink_committed_batches").committed_batches()
        return {"batches": {str(k): v for k, v in done.items()}}

    def _action_deliver_due(self, body: dict) -> dict:
        return {"delivered": self.store.deliver_due(
            field(body, "max_messages", int, "deliver_due", optional=True))}

    def _action_ensure_topic(self, body: dict) -> dict:
        with self._write_lock:
            return {"queues": self.store.ensure_topic(field(body, "topic", str, "ensure_topic"))}

    def _action_known_transactions(self, body: dict) -> dict:
        ids = field(body, "ids", list, "known_transactions")
        if not all(isinstance(t, str) for t in ids):
            raise InvalidRequest("known_transactions: ids must be strings")
        return {"known": self.store.known_transactions(ids)}

    def _action_run_check_round(self, body: dict) -> dict:
        stream = field(body, "stream", str, "run_check_round")
        number = field(body, "round", int, "run_check_round")
        with self._write_lock:
            plan = self.store.prepare_transaction_checks()
            if not plan.checks:
                return {"written": False}
            try:
                write_query_round(self.path, stream, number, plan.checks.to_arrow())
            except StoreError as exc:
                raise InvalidRequest(str(exc)) from None
        return {"written": True}

    def _action_drop_check_rounds(self, body: dict) -> dict:
        try:
            drop_query_rounds(self.path, field(body, "stream", str, "drop_check_rounds"),
                              field(body, "last", int, "drop_check_rounds"))
        except StoreError as exc:
            raise InvalidRequest(str(exc)) from None
        return {}

    def _action_last_check_round(self, body: dict) -> dict:
        return {"round": last_check_round(self.path)}

    def _action_flush(self, body: dict) -> dict:
        self.store.flush()
        return {}


def _result(result) -> dict:
    """A :class:`~store.SendResult` as JSON fields."""
    return {name: getattr(result, name) for name in RESULT_FIELDS}

