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
from collections import OrderedDict
from contextlib import contextmanager

import pyarrow as pa
from pyarrow import flight

from ..core.locking import WaitAfterLock
from ..core.message_columns import projected_schema
from ..base.errors import StoreError
from ..files.accounts import AccountRights
from ..files.progress_table import progress_log
from ..formats.message import (Message, validate_delay_key, validate_group, validate_msg_id,
                       validate_schedule_key, validate_sink_id, validate_topic)
from ..transaction.published_checks import (drop_query_rounds, last_check_round,
                                       read_check_round_table, read_query_round,
                                       write_query_round)
from ..produce.table_rows import prepare_rows
from ..facade.store_reader import StoreReader
from ..produce.transaction_producer import LeaveOpen
from ..base.remote_address import RemoteAddress
from .incoming import received_table
from .flight_limits import RateLimitedLog, StreamLimits
from .reader_pool import ReaderPool
from .rights import (AccountCheck, OpenedTransactions, caller_of, own_sink_id, require,
                     require_admin, require_replication, row_topics)
from .replication_calls import ReplicationCalls
from .replication_stream import EXCHANGE_OP
from .wire import (ACTIONS, MAX_MESSAGE_BYTES, PUTS, RESULT_FIELDS, InvalidRequest, dumps,
                   schedule_fields, MAX_QUERY_MESSAGES, view_fields,
                   error_info, error_text, field, loads, unb64)

log = logging.getLogger("store.remote")
#: Producer groups of half messages whose producers a server keeps (a client names any).
HALF_PRODUCER_GROUPS = 64

#: Actions only an admin account (or the server's token) may call (see :mod:`.rights`).
ADMIN_ACTIONS = frozenset({"cancel_keys", "pending_keys", "schedules", "deliver_due",
                           "known_transactions", "run_check_round", "drop_check_rounds"})

#: Queue offsets read per batch of a ``DoGet`` (the Spark source's batch size).
READ_CHUNK = 65536
#: How long a read past a replica's high watermark waits for it (s): a reader that planned
#: its range on the leader before a change of leader reads it once the new one's moves.
READ_BOUND_WAIT_S = 5.0
#: The version of the calls (:mod:`store.remote.wire`) this service answers.
WIRE_VERSION = 1


#: Calls refused for their token by their handler (:func:`_unless_quiet`), where the
#: client's address is known; any other call is refused by the middleware itself.
_HANDLED = frozenset({flight.FlightMethod.DO_GET, flight.FlightMethod.DO_PUT,
                      flight.FlightMethod.DO_ACTION, flight.FlightMethod.DO_EXCHANGE})
_TOKEN_REFUSED = "missing or wrong token; allowed: the server's token as 'Bearer <token>'"


class _Refusal(flight.ServerMiddleware):
    """A call without the right token (``why``: ``"no"`` or ``"wrong"``), which its handler
    refuses before doing anything."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self.why = why


class _TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call whose ``authorization`` header is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info, headers):
        given = headers.get("authorization") or headers.get("Authorization") or [""]
        if hmac.compare_digest(str(given[0]).encode(), self._expected):
            return None
        why = "wrong" if given[0] else "no"
        if info.method in _HANDLED:
            return _Refusal(why)
        _refused("refused a %s call: %s token", info.method.name, why)
        raise flight.FlightUnauthenticatedError(_TOKEN_REFUSED)


_REFUSED = RateLimitedLog(log)


def _refused(message: str, *args) -> None:
    """Log a refused call, at a bounded rate (:class:`.limits.RateLimitedLog`)."""
    _REFUSED.warning(message, *args)


def _unless_quiet(fn):
    """Run a Flight handler; store errors and bad requests become typed Flight errors.  A
    call without the right token is refused first, naming the client's address."""

    def handler(self, context, *args):
        refusal = context.get_middleware("token")
        if refusal is not None:
            _refused("refused a %s call from %s: %s token", fn.__name__, context.peer(),
                     refusal.why)
            raise flight.FlightUnauthenticatedError(_TOKEN_REFUSED)
        try:
            return fn(self, context, *args)
        except (flight.FlightError, flight.FlightCancelledError):
            raise
        except InvalidRequest as exc:
            _refused("refused a request from %s: %s", context.peer(), error_text(exc))
            raise flight.FlightServerError(error_text(exc), extra_info=error_info(exc)) from None
        except StoreError as exc:
            raise flight.FlightServerError(error_text(exc), extra_info=error_info(exc)) from None
        except MemoryError:  # one request too large for what is left: refuse it, keep serving
            log.error("a request from %s ran out of memory; refused", context.peer())
            raise flight.FlightServerError("the server ran out of memory for this request",
                                           extra_info=error_info(StoreError("out of memory"))
                                           ) from None
        except Exception as exc:  # noqa: BLE001 - a bug must not end the server
            if isinstance(exc, OSError) and context.is_cancelled():
                # the client went away before its answer (killed, or cut off): one line
                # within the refusals' rate, no stack (else one per call a client drops)
                _refused("the client %s of a %s call went away before its answer: %s",
                         context.peer(), fn.__name__, exc)
                raise flight.FlightCancelledError("the client went away") from None
            log.exception("request from %s failed", context.peer())
            raise flight.FlightInternalError(f"{type(exc).__name__}: {exc}") from None

    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


class StoreService(ReplicationCalls, flight.FlightServerBase):
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
    max_request_bytes : int, optional
        Bound on the Arrow buffers of one ``DoPut`` / ``DoExchange`` stream (refused as soon
        as it passes it; default :data:`~store.remote.wire.MAX_MESSAGE_BYTES`).
    stream_limits : StreamLimits, optional
        Bounds on streams in progress, per client host and in all (:mod:`.limits`).
    accounts : list of AccountRights, optional
        The accounts of an ACL file (:mod:`store.files.accounts`): each call is then made by
        an account (or with ``token``, as an admin) and checked by what it touches
        (:mod:`.rights`).
    replica : Replica, optional
        The replica-set member this store is (:mod:`store.replication.replica`): writes
        are refused unless it leads.
    """

    def __init__(self, store, address: RemoteAddress, *, token: str | None = None,
                 tls: tuple[bytes, bytes] | None = None,
                 max_request_bytes: int = MAX_MESSAGE_BYTES,
                 stream_limits: StreamLimits | None = None,
                 accounts: list[AccountRights] | None = None, replica=None) -> None:
        #: The replica-set member this store is (:mod:`store.replication.replica`): a
        #: follower refuses writes; ``None`` outside a replica set.  Set before the server
        #: listens, so that no request is taken as a lone store's.
        self.replica = replica
        if address.tls and tls is None:
            raise StoreError("an rmqs:// (TLS) address needs a certificate and a key")
        middleware = {"token": _TokenCheck(token)} if token else {}
        if accounts:
            middleware = {"access": AccountCheck(accounts, token, _refused)}
        super().__init__(address.location, tls_certificates=[tls] if tls else [],
                         middleware=middleware)
        self.store = store
        self.max_request_bytes = int(max_request_bytes)
        self.path = store.root
        self.address = RemoteAddress(address.host, self.port, address.tls)
        self._readers = ReaderPool(self._open_reader)
        self._streams = stream_limits or StreamLimits()
        self._call = threading.local()  # the account of the action a thread answers
        self._opened = OpenedTransactions()
        if not address.loopback and tls is None:
            log.warning("serving %s without TLS: tokens and messages travel in clear; give "
                        "--tls-cert and --tls-key to serve rmqs://", self.address.url)
        # (writes one at a time; a replica set's synchronous wait comes after the release)
        self._write_lock = WaitAfterLock(store)
        # (a producer of each group a client names: made per call, but for half messages,
        # whose producer registers its group's listener: at most HALF_PRODUCER_GROUPS kept)
        self._half_producers: OrderedDict[str, object] = OrderedDict()
        self._closing = threading.Event()

    @property
    def url(self) -> str:
        return self.address.url

    # ------------------------------------------------------------------ helpers
    def _producer(self, group: str):
        return self.store.producer(group)  # (two attributes: nothing worth keeping per group)

    def _half_producer(self, group: str):
        """The producer of half messages of ``group`` (called under the write lock); the
        least recently used of more than :data:`HALF_PRODUCER_GROUPS` is let go, with its
        listener (a ``LeaveOpen``: the same answer as none)."""
        producer = self._half_producers.pop(group, None)
        if producer is None:  # the caller runs the local transaction and ends it
            producer = self.store.transaction_producer(group, LeaveOpen())
        self._half_producers[group] = producer
        while len(self._half_producers) > HALF_PRODUCER_GROUPS:
            old_group, old = self._half_producers.popitem(last=False)
            self.store.transactions.forget_listener(old_group, old.listener)
        return producer

    @contextmanager
    def _stream(self, context, what: str):
        """One counted stream of the caller's (see :mod:`.limits`)."""
        release = self._streams.admit(context.peer(), what)
        try:
            yield
        finally:
            release()

    def close_readers(self) -> None:
        self._readers.close()

    def _open_reader(self) -> StoreReader:
        """A reader for the pool: a replica's readers see only below its high watermark
        (:meth:`~store.replication.replica.Replica.high_watermark`)."""
        reader = StoreReader.open(self.path, self.store.config)
        reader.read_bound, reader.read_bound_wait_s = self._read_bound, READ_BOUND_WAIT_S
        return reader

    def _read_bound(self) -> int | None:
        replica = self.replica
        return None if replica is None else replica.high_watermark()

    def shutdown(self) -> None:
        """Stop serving: waiting replication requests answer at once, then the calls in
        progress are waited for."""
        self._closing.set()
        super().shutdown()

    def _check_write(self, what: str) -> None:
        if self.replica is not None:
            self.replica.check_write(what)

    # ------------------------------------------------------------------ reads
    @_unless_quiet
    def do_get(self, context, ticket):
        """One queue range as ``messages`` batches (the first decoded before the answer
        starts, so that its errors are typed)."""
        body = loads(ticket.ticket, "the ticket")
        what = "read"
        op = field(body, "op", str, what)
        if op in ("query_round", "server_round"):
            require_admin(caller_of(context), op)
            return self._round(body, op)
        if op == "replicate":
            return self._replicate(context, body)
        if op != "read":
            raise InvalidRequest(f"unknown ticket op {op!r}; allowed: 'read', 'query_round', "
                                 "'server_round', 'replicate'")
        topic = _named(body, "topic", what, _any_topic)
        require(caller_of(context), [topic], "SUB", what)
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

        def read(reader, lo: int, hi: int):
            return reader.read_arrow(topic, queue_id, lo, hi, tags=tags, columns=columns,
                                     verify_crc=verify_crc, skip_corrupt=skip_corrupt)

        def rest(reader, first):
            yield first
            for lo in range(start + READ_CHUNK, end, READ_CHUNK):
                batch = read(reader, lo, min(end, lo + READ_CHUNK))
                if batch.num_rows:
                    yield batch

        return self._reading_stream(context, "read", schema,
                                    lambda r: read(r, start, min(end, start + READ_CHUNK)), rest)

    def _reading_stream(self, context, what: str, schema, first_of, rest):
        """A ``DoGet`` answer read by a reader lent from the pool: one counted stream of the
        caller's (:meth:`_stream`) for as long as it is sent.  ``first_of(reader)`` runs
        before the answer starts (its errors reach the client typed); ``rest(reader, first)``
        yields every batch, ``first`` included, as the client takes them.  The reader goes
        back and the stream's count ends once the last batch is sent, or when gRPC drops a
        stream cut off (the generator is started here, so it runs its ``finally`` then)."""
        release = self._streams.admit(context.peer(), what)
        try:
            reader = self._readers.borrow()
        except BaseException:
            release()
            raise

        def done() -> None:
            self._readers.give_back(reader)
            release()

        try:
            first = first_of(reader)
        except BaseException:
            done()
            raise

        def batches():
            try:
                yield None  # (primed below: a started generator runs its finally when dropped)
                yield from rest(reader, first)
            except StoreError as exc:
                raise flight.FlightServerError(error_text(exc), extra_info=error_info(exc)) from None
            finally:
                done()

        stream = batches()
        next(stream)
        return flight.GeneratorStream(schema, stream)

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
        self._check_write(op)
        group = _named(body, "group", op, validate_group)
        topic = _named(body, "topic", op, validate_topic, optional=True)
        with self._stream(context, op):
            table = received_table(reader, context, op, self.max_request_bytes)
        account = caller_of(context)
        if "key" in table.column_names:  # replaces pending messages by key, of any topic
            require_admin(account, f"{op} with a key column")
        require(account, lambda: row_topics(table, topic), "PUB", op)
        if op == "check_table":  # a store group validates every share before any writes
            rows = prepare_rows(self.store, table, topic=topic)
            writer.write(pa.py_buffer(dumps({"rows": len(rows)})))
            return
        sink_id = own_sink_id(account, _named(body, "sink_id", op, validate_sink_id))
        commit = field(body, "commit", str, op, default="index")  # (the Sink checks it)
        with self._write_lock:
            staged = self.store.sink(sink_id, group, commit=commit).stage(table, topic=topic)
        writer.write(pa.py_buffer(dumps({"transactions": staged})))

    @_unless_quiet
    def do_exchange(self, context, descriptor, reader, writer):
        """``send_table``: the rows in, the results table out, both as Arrow streams."""
        body = loads(descriptor.command or b"", "the descriptor command")
        op = field(body, "op", str, "exchange")
        if op == EXCHANGE_OP:  # (a follower's replication stream: reports up, chunks down)
            return self._replicate_exchange(context, body, reader, writer)
        if op not in ("send_table", "replace_table", "schedule_table"):
            raise InvalidRequest(f"unknown exchange op {op!r}; allowed: 'send_table', "
                                 "'replace_table', 'schedule_table'")
        self._check_write(op)
        group = _named(body, "group", op, validate_group)
        topic = _named(body, "topic", op, validate_topic, optional=True)
        with self._stream(context, op):
            table = received_table(reader, context, op, self.max_request_bytes)
        account = caller_of(context)
        if op == "replace_table":  # replaces pending messages by key, of any topic
            require_admin(account, op)
        require(account, lambda: row_topics(table, topic), "PUB", op)
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
        self._call.account = account = caller_of(context)
        if self.replica is not None:
            self.replica.check_action(name)
        if name in ADMIN_ACTIONS:
            require_admin(account, name)
        return [flight.Result(pa.py_buffer(dumps(handler(body))))]

    def _account(self) -> AccountRights:
        """The account of the action this thread answers."""
        return self._call.account

    def _action_info(self, body: dict) -> dict:
        with self._readers.reader() as reader:
            return {"version": WIRE_VERSION, "written_by_rmq": reader.written_by_rmq,
                    "url": self.url}

    def _action_snapshot(self, body: dict) -> dict:
        with self._readers.reader() as reader:
            bounds = _queue_bounds(reader)
        account = self._account()
        return {"topics": {t: q for t, q in bounds.items()
                           if account.may(t, "SUB") or account.may(t, "PUB")}}

    def _action_query_messages(self, body: dict) -> dict:
        what = "query_messages"
        limit = field(body, "max", int, what, default=64)
        if not 1 <= limit <= MAX_QUERY_MESSAGES:
            raise InvalidRequest(f"{what}: max={limit}; allowed: 1 to {MAX_QUERY_MESSAGES}")
        topic = _named(body, "topic", what, _any_topic)
        require(self._account(), [topic], "SUB", what)
        with self._readers.reader() as reader:
            views = reader.query_messages(
                topic, key=field(body, "key", str, what, optional=True),
                begin_ms=field(body, "begin_ms", int, what, optional=True),
                end_ms=field(body, "end_ms", int, what, optional=True), max=limit)
        return {"messages": [view_fields(v) for v in views]}

    def _action_view_message(self, body: dict) -> dict:
        what = "view_message"
        account = self._account()
        topic = field(body, "topic", str, what, optional=True)
        if topic is not None:
            require(account, [_named(body, "topic", what, _any_topic)], "SUB", what)
        with self._readers.reader() as reader:
            view = reader.view_message(field(body, "msg_id", str, what), topic=topic)
        if view is not None and not (account.admin or account.may(view.topic, "SUB")):
            view = None  # an id of a topic the account may not read is not found for it
        return {"message": None if view is None else view_fields(view)}

    def _action_offset_for_timestamp(self, body: dict) -> dict:
        what = "offset_for_timestamp"
        topic = _named(body, "topic", what, _any_topic)
        require(self._account(), [topic], "SUB", what)
        with self._readers.reader() as reader:
            return {"offset": reader.offset_for_timestamp(
                topic, field(body, "queue_id", int, what), field(body, "timestamp_ms", int, what))}

    def _message(self, body, what: str) -> Message:
        if not isinstance(body, dict):
            raise InvalidRequest(f"{what}: a message must be a JSON object")
        properties = field(body, "properties", dict, what, default={})
        keys = body.get("keys")
        if keys is not None and not isinstance(keys, (str, list)):
            raise InvalidRequest(f"{what}: field 'keys' must be a string or a list")
        require(self._account(), [field(body, "topic", str, what)], "PUB", what)
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
        options["key"] = _named(body, "key", "send", validate_delay_key, optional=True)
        if options["key"] is not None:  # a key names a pending message of any topic
            require_admin(self._account(), "send with a key")
        with self._write_lock:
            result = self._producer(_named(body, "group", "send", validate_group)).send(
                message, **options)
        return _result(result)

    def _action_send_batch(self, body: dict) -> dict:
        messages = field(body, "messages", list, "send_batch")
        batch = [self._message(m, "send_batch") for m in messages]
        with self._write_lock:
            results = self._producer(_named(body, "group", "send_batch", validate_group)
                                     ).send_batch(
                batch, queue_id=field(body, "queue_id", int, "send_batch", optional=True),
                sharding_key=field(body, "sharding_key", str, "send_batch", optional=True))
        return {"results": [_result(r) for r in results]}

    def _action_cancel(self, body: dict) -> dict:
        key = _named(body, "key", "cancel", validate_delay_key, optional=True)
        if key is not None:
            require_admin(self._account(), "cancel by key")
        else:
            require(self._account(), [_named(body, "topic", "cancel", validate_topic)], "PUB",
                    "cancel")
        with self._write_lock:
            producer = self._producer(_named(body, "group", "cancel", validate_group))
            if key is not None:
                found = producer.cancel(key=key)
            else:
                found = producer.cancel(_named(body, "topic", "cancel", validate_topic),
                                        _named(body, "msg_id", "cancel", validate_msg_id))
        return {"cancelled": bool(found)}

    def _keys(self, body: dict, what: str) -> list:
        keys = field(body, "keys", list, what)
        if not all(isinstance(k, str) for k in keys):
            raise InvalidRequest(f"{what}: field 'keys' must be a list of str")
        return keys

    def _action_cancel_keys(self, body: dict) -> dict:
        keys = self._keys(body, "cancel_keys")
        with self._write_lock:
            found = self._producer(_named(body, "group", "cancel_keys", validate_group)
                                   ).cancel_keys(keys)
        return {"cancelled": [bool(v) for v in found]}

    def _action_pending_keys(self, body: dict) -> dict:
        keys = self._keys(body, "pending_keys")
        with self._write_lock:
            found = self._producer(_named(body, "group", "pending_keys", validate_group)
                                   ).pending_keys(keys)
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
            info = self._producer(_named(body, "group", "schedule", validate_group)).schedule(
                message, key=_named(body, "key", "schedule", validate_schedule_key), **options)
        return {"schedule": schedule_fields(info)}

    def _action_schedules(self, body: dict) -> dict:
        return {"schedules": [schedule_fields(i) for i in self.store.schedules()]}

    def _schedule_change(self, body: dict, what: str) -> dict:
        key = _named(body, "key", what, validate_schedule_key)
        account = self._account()
        if not account.admin:
            require(account, [i.topic for i in self.store.schedules() if i.key == key], "PUB",
                    what)
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
        self._opened.require_own(self._account(), [p[0] for p in pairs], "end_transactions")
        with self._write_lock:
            ended = self.store.end_transactions(pairs)
        return {"ended": [bool(e) for e in ended]}

    def _action_send_half(self, body: dict) -> dict:
        group = _named(body, "group", "send_half", validate_group)
        message = self._message(body.get("message"), "send_half")
        with self._write_lock:
            result = self._half_producer(group).send_in_transaction(message)
        self._opened.opened(self._account(), result.transaction_id)
        out = _result(result)
        out["half_topic"] = result.half_topic
        return out

    def _sink(self, body: dict, what: str):
        return self.store.sink(own_sink_id(self._account(),
                                           _named(body, "sink_id", what, validate_sink_id)),
                               _named(body, "group", what, validate_group, default="rmq-sink"))

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
        if self.replica is not None and self.replica.is_follower:
            return {"delivered": 0}  # the leader delivers; its deliveries are copied here
        return {"delivered": self.store.deliver_due(
            field(body, "max_messages", int, "deliver_due", optional=True))}

    def _action_ensure_topic(self, body: dict) -> dict:
        with self._write_lock:
            topic = _named(body, "topic", "ensure_topic", validate_topic)
            require(self._account(), [topic], "PUB", "ensure_topic")
            return {"queues": self.store.ensure_topic(topic)}

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

    def _action_epochs(self, body: dict) -> dict:
        require_replication(self._account(), "epochs")
        if self.replica is None:
            return {"epoch": None, "epochs": []}
        return self.replica.epochs_answer()

    def _action_consumer_progress(self, body: dict) -> dict:
        """The gRPC face's consumer groups' progress as saved here, for a follower's copy:
        what changed since the follower's ``"since"``, or the older shape without it
        (:mod:`store.files.progress_table`); replication right, a leader's only."""
        require_replication(self._account(), "consumer_progress")
        if self.replica is not None:
            self.replica.check_source("consumer_progress")
        return progress_log(self.path).answer(
            None if self.replica is None else self.replica.epoch, body)

    def _action_leader(self, body: dict) -> dict:
        if self.replica is None:  # a store served alone leads itself
            return {"leader": self.url, "epoch": None, "self": self.url, "leading": True}
        return self.replica.leader_answer()

    def _action_flush(self, body: dict) -> dict:
        self.store.flush()
        return {}


def _queue_bounds(reader) -> dict:
    """Every user topic with its queues' min and max offsets (the ``snapshot`` answer)."""
    topics = {}
    for topic in reader.topics():
        try:
            topics[topic] = [[q, reader.min_offset(topic, q), reader.max_offset(topic, q)]
                             for q in reader.queue_ids(topic)]
        except StoreError as exc:  # one topic's damage never hides the others
            log.warning("snapshot: skipped topic %.60r: %s", topic, exc)
    return topics


def _any_topic(topic: str) -> str:
    """A topic a read may name: a user topic or a system one."""
    return validate_topic(topic, allow_system=True)


def _named(body: dict, name: str, what: str, validator, *, optional: bool = False,
           default=...):
    """``body[name]``, a string checked by ``validator`` (one of :mod:`store.formats.message`'s):
    every name a request gives passes the store's rules before anything is looked up or
    created by it."""
    value = field(body, name, str, what, optional=optional, default=default)
    return value if value is None else validator(value)


def _result(result) -> dict:
    """A :class:`~store.SendResult` as JSON fields."""
    return {name: getattr(result, name) for name in RESULT_FIELDS}

