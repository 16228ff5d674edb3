"""What travels between :mod:`store.remote.flight_client` and :mod:`store.remote.flight_service`.

The transport is Arrow Flight (gRPC); nothing here is a protocol of its own, only the names
and bodies of the Flight calls the two sides agree on:

==============  ======================================================================
call            body (JSON unless said) -> answer
==============  ======================================================================
``DoGet``       ticket ``{"op": "read", "topic", "queue_id", "start", "end", "tags",
                "columns", "verify_crc", "skip_corrupt"}`` -> the ``messages`` batches
                (:data:`store.MESSAGE_SCHEMA`, or the columns asked for), in order;
                ``{"op": "query_round", "stream", "round"}`` or ``{"op":
                "server_round", "round"}`` -> a check round's questions
``DoPut``       descriptor command ``{"op": "sink_stage", "sink_id", "group", "topic"}`` or
                ``{"op": "check_table", "group", "topic"}`` with the rows as an Arrow
                stream -> one metadata message: ``{"transactions": [...]}``
                (``sink_stage``) or ``{"rows": n}`` (a dry run: validated, nothing written)
``DoExchange``  descriptor command ``{"op": "send_table" | "replace_table" | "schedule_table",
                "group", "topic"}``, the rows in as
                an Arrow stream -> the results table out as an Arrow stream
``DoAction``    :data:`ACTIONS`, each a JSON body -> one JSON result
==============  ======================================================================

A table's stream (``DoPut``, ``DoExchange``) ends with an ``app_metadata`` message
``{"end": rows}`` after its last batch: the server stores nothing of a stream without it (a
client cut off half-way), and refuses one whose Arrow buffers pass its bound on a request
(:data:`MAX_MESSAGE_BYTES` unless configured) as soon as they do.

An error raised by the store on the server reaches the client as a Flight error whose
``extra_info`` is ``{"type": <StoreError subclass name>, "message": ...}``; the client raises
that class again (:func:`raise_remote`), so a remote store fails as a local one does.  Bodies
are bytes as base64 inside JSON (single sends; tables travel as Arrow).
"""

from __future__ import annotations

import dataclasses

import base64
import json
from typing import Any

from ..base import errors as store_errors
from ..base.errors import RemoteError, StoreError

#: DoAction types and what each does (``list_actions`` shows them).
ACTIONS = {
    "info": "what the server serves: store path name, version, whether rmq wrote it",
    "snapshot": "every user topic with its queues' min and max offsets, in one answer",
    "offset_for_timestamp": "the first offset of a queue stored at or after a time",
    "send": "one message (Producer.send)",
    "send_batch": "messages of one topic to one queue (Producer.send_batch)",
    "cancel": "cancel a pending timer message (Producer.cancel: by id, or by key)",
    "cancel_keys": "cancel the pending messages of delay keys (Producer.cancel_keys)",
    "pending_keys": "whether delay keys name a pending message (Producer.pending_keys)",
    "schedule": "add or replace a recurring schedule (Producer.schedule)",
    "schedules": "every recurring schedule (MessageStore.schedules)",
    "remove_schedule": "remove a recurring schedule",
    "pause_schedule": "pause a recurring schedule",
    "resume_schedule": "resume a recurring schedule",
    "end_transactions": "end transactions: [[id, state], ...]",
    "send_half": "a transactional half message, left open for the caller's end",
    "sink_commit": "commit a sink batch (Sink.commit)",
    "sink_abort": "roll back a sink's open halves (Sink.abort)",
    "sink_open_halves": "a sink's open halves",
    "sink_committed_batches": "a sink's committed batch ids",
    "deliver_due": "deliver due delayed messages now",
    "ensure_topic": "create a topic when missing; its queue count",
    "known_transactions": "whether the store holds each transaction id's half message",
    "flush": "make everything appended durable",
    "run_check_round": "a check-loop query's round: bookkeeping, its questions kept here",
    "drop_check_rounds": "delete a check-loop query's rounds up to a number",
    "last_check_round": "the newest round the server published (--check-transactions)",
    "query_messages": "messages by key or store time (MessageStore.query_messages)",
    "view_message": "one message by id (MessageStore.view_message)",
    "epochs": "a replica's epoch and its terms' start offsets (replication right)",
    "consumer_progress": "the gRPC face's consumer groups' progress (replication right)",
    "leader": "who leads the replica set, as this server knows (clients with several URLs)",
}
#: The most messages one ``query_messages`` answer carries (what a client can make the
#: server hold).
MAX_QUERY_MESSAGES = 10_000
#: The :class:`~store.SendResult` fields an answer carries.
RESULT_FIELDS = ("msg_id", "topic", "queue_id", "queue_offset", "commitlog_offset",
                 "deliver_at_ms", "transaction_id", "stored_topic", "stored_queue_id",
                 "stored_queue_offset")
#: DoPut operations.
PUTS = ("sink_stage", "check_table")

#: Largest request the server takes, bytes (a sink task hands over at most 16 MiB tables):
#: an action's JSON body, and by default the Arrow buffers of one ``DoPut`` / ``DoExchange``
#: stream (``rmq serve --max-request-mib``).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: The key of the ``app_metadata`` message that ends a table's stream: ``{"end": rows}``.
#: A stream without it (a client cut off half-way) stores nothing.
END_OF_ROWS = "end"


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def loads(data, what: str) -> Any:
    """JSON of a request or answer; :class:`InvalidRequest` when it is not."""
    try:
        return json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest(f"{what} is not JSON") from None


def b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def unb64(text, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise InvalidRequest(f"{what} is not base64") from None


class InvalidRequest(StoreError, ValueError):
    """A request the server cannot take: not JSON, an unknown operation, a missing or
    mistyped field (the server answers it as a typed error and keeps serving)."""


class RequestTooLarge(InvalidRequest):
    """A request larger than the server's bound on one request (refused as it arrives)."""


class IncompleteRequest(InvalidRequest):
    """A table stream that ended without its end marker: the client went away half-way;
    nothing of it was stored."""


class Overloaded(StoreError):
    """The server has as many streams in progress as it allows (of this client, or in all):
    the call was not started; retry when one ends."""


def field(body: dict, name: str, kind, what: str, *, default=..., optional: bool = False):
    """``body[name]`` checked to be a ``kind``; :class:`InvalidRequest` names what is wrong."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"{what}: the request body must be a JSON object")
    if name not in body or body[name] is None:
        if optional:
            return None
        if default is not ...:
            return default
        raise InvalidRequest(f"{what}: field {name!r} is missing")
    value = body[name]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidRequest(f"{what}: field {name!r} must be {getattr(kind, '__name__', kind)}"
                             f", got {type(value).__name__}")
    return value


#: Longest error text sent back (a message may quote a request's field, which a client
#: chooses: gRPC's trailers hold a few KiB, and an answer larger than that is lost).
MAX_ERROR_CHARS = 1000


def error_text(exc: BaseException) -> str:
    """``str(exc)``, cut to :data:`MAX_ERROR_CHARS` (the cut said)."""
    text = str(exc)
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return f"{text[:MAX_ERROR_CHARS]}... ({len(text) - MAX_ERROR_CHARS} more characters)"


def error_info(exc: BaseException) -> bytes:
    """The ``extra_info`` of a Flight error carrying a store error."""
    kind = type(exc).__name__ if isinstance(exc, StoreError) else "StoreError"
    payload = {"type": kind, "message": error_text(exc)}
    if isinstance(exc, store_errors.CorruptRecordError):
        payload.update(file=exc.file, position=exc.position, reason=exc.reason)
    return dumps(payload)


def _error_class(name: str) -> type[StoreError]:
    found = getattr(store_errors, name, None)
    ours = {cls.__name__: cls for cls in (InvalidRequest, RequestTooLarge, IncompleteRequest,
                                          Overloaded)}
    if name in ours:
        return ours[name]
    if isinstance(found, type) and issubclass(found, StoreError):
        return found
    return StoreError


def raise_remote(exc: BaseException, address: str) -> None:
    """Raise the store error a Flight error carries, or a :class:`RemoteError` naming
    ``address`` for a transport failure (unreachable, timed out, cancelled)."""
    from pyarrow import flight

    info = getattr(exc, "extra_info", b"") or b""
    if info:
        try:
            payload = json.loads(bytes(info))
            kind, message = payload["type"], payload["message"]
        except (ValueError, KeyError, TypeError):
            pass
        else:
            cls = _error_class(kind)
            if cls is store_errors.CorruptRecordError:
                raise cls(f"{address}:{payload.get('file')}", int(payload.get("position", -1)),
                          str(payload.get("reason", message))) from None
            raise cls(message) from None
    if isinstance(exc, flight.FlightUnauthenticatedError):
        raise store_errors.AuthenticationError(
            f"the store server {address} refused the request: its token is missing or wrong; "
            "allowed: the server's token (option token or tokenFile, or "
            "connect(..., token=...))") from None
    if isinstance(exc, flight.FlightTimedOutError):
        raise RemoteError(f"the store server {address} did not answer in time ({exc})") from None
    if isinstance(exc, flight.FlightUnavailableError):
        raise RemoteError(f"the store server {address} cannot be reached ({_first_line(exc)}); "
                          "is `rmq serve --listen` running there?") from None
    raise RemoteError(f"the store server {address} failed: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def view_fields(view) -> dict:
    """A :class:`~store.MessageView` as a JSON object (the body in base64)."""
    fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(view)}
    fields["body"] = b64(view.body)
    fields["keys"] = list(view.keys)
    fields["properties"] = dict(view.properties)
    fields["system_properties"] = dict(view.system_properties)
    return fields


def message_view(fields: dict):
    """The :class:`~store.MessageView` of :func:`view_fields`."""
    from ..formats.message import MessageView

    names = {f.name for f in dataclasses.fields(MessageView)}
    values = {k: v for k, v in fields.items() if k in names}
    values["body"] = unb64(values["body"], "a message's body")
    values["keys"] = tuple(values["keys"])
    return MessageView(**values)


def schedule_fields(info) -> dict:
    """A :class:`~store.schedule.recurring_schedule.ScheduleInfo` as a JSON object."""
    return {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}


def schedule_info(fields: dict):
    """The :class:`~store.schedule.recurring_schedule.ScheduleInfo` of :func:`schedule_fields`."""
    from ..schedule.recurring_schedule import ScheduleInfo

    names = {f.name for f in dataclasses.fields(ScheduleInfo)}
    return ScheduleInfo(**{k: v for k, v in fields.items() if k in names})
