"""What the Flight server takes in as Arrow: every table a call hands over, read whole and
checked before the store (or any compiled kernel) sees it.

Arrow's IPC reader checks only the cheap invariants of what arrives (buffer counts and
sizes); the offsets of a string column may still point anywhere.  :func:`received_table` is
the one door every ``DoPut`` and ``DoExchange`` handler takes its rows through:

* it reads the stream a message at a time and refuses it as soon as its buffers pass the
  server's bound on one request (:class:`~store.remote.wire.RequestTooLarge`; nothing more
  is read or kept);
* each batch is validated fully (``RecordBatch.validate(full=True)``: offsets inside their
  buffers and rising, UTF-8, dictionary indices, child lengths);
* each column must be one the call takes, of a type of the families it allows, nested at
  most as deep as a ``keys`` list or a ``properties`` map
  (:class:`~store.remote.wire.InvalidRequest` naming the column, its type and what is
  allowed);
* the stream must end with the client's end marker (:data:`~store.remote.wire.END_OF_ROWS`,
  an ``app_metadata`` message carrying the row count) and the call must not be cancelled:
  a client cut off half-way (killed, timed out) ends its stream without it, and such a
  request is refused as :class:`~store.remote.wire.IncompleteRequest` before anything is
  stored.
"""

from __future__ import annotations

import pyarrow as pa

from ..produce.table_rows import COLUMNS as ROW_COLUMNS
from ..schedule.schedule_table import COLUMNS as SCHEDULE_COLUMNS
from .wire import END_OF_ROWS, IncompleteRequest, InvalidRequest, RequestTooLarge, loads

#: The columns each table-taking call accepts (``value`` is Kafka's name for ``body``).
CALL_COLUMNS = {
    "send_table": (*ROW_COLUMNS, "value"),
    "replace_table": (*ROW_COLUMNS, "value", "key"),
    "sink_stage": (*ROW_COLUMNS, "value"),
    "check_table": (*ROW_COLUMNS, "value"),
    "schedule_table": SCHEDULE_COLUMNS,
}

_ALLOWED_TYPES = ("string, binary (or their large forms), a dictionary of strings, an "
                  "integer, a timestamp, null, a list of strings or a map<string, string>")


def _flat(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_integer(t)
            or pa.types.is_timestamp(t) or pa.types.is_null(t))


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)


def type_allowed(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` may arrive at all (any call): flat scalars, strings
    dictionary-encoded, a list of strings (``keys``) or a string map (``properties``)."""
    if _flat(t):
        return True
    if pa.types.is_dictionary(t):
        return pa.types.is_integer(t.index_type) and _is_text(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _is_text(t.value_type)
    if pa.types.is_map(t):
        return _is_text(t.key_type) and _is_text(t.item_type)
    return False


def check_schema(schema: pa.Schema, op: str) -> None:
    """Refuse a schema the call ``op`` cannot take: unknown or repeated columns, a type
    outside :func:`type_allowed`."""
    allowed = CALL_COLUMNS[op]
    seen = set()
    for f in schema:
        if f.name not in allowed:
            raise InvalidRequest(f"{op}: unknown column {f.name[:100]!r}; allowed: "
                                 f"{', '.join(allowed)}")
        if f.name in seen:
            raise InvalidRequest(f"{op}: column {f.name!r} appears twice; allowed: once")
        seen.add(f.name)
        if not type_allowed(f.type):
            raise InvalidRequest(f"{op}: column {f.name!r} has type {f.type}; allowed: "
                                 f"{_ALLOWED_TYPES}")


def _checked_batch(batch: pa.RecordBatch, op: str) -> pa.RecordBatch:
    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        # Arrow's text names offsets and lengths, never the bytes of a buffer
        raise InvalidRequest(f"{op}: a malformed Arrow batch ({_first_line(exc)}); allowed: "
                             "valid Arrow arrays") from None
    return batch


def received_table(reader, context, op: str, max_bytes: int) -> pa.Table:
    """The whole table of a ``DoPut`` / ``DoExchange`` stream, checked (see the module
    docstring)."""
    try:
        schema = reader.schema
    except (pa.ArrowException, ValueError) as exc:
        raise InvalidRequest(f"{op}: no Arrow schema ({_first_line(exc)})") from None
    check_schema(schema, op)
    batches, total, ended = [], 0, None
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        except (pa.ArrowException, ValueError) as exc:
            raise InvalidRequest(f"{op}: a malformed Arrow stream ({_first_line(exc)})"
                                 ) from None
        if ended is not None:
            raise InvalidRequest(f"{op}: data after the end marker; allowed: the end marker "
                                 "last")
        if chunk.data is not None:
            total += chunk.data.get_total_buffer_size()
            if total > max_bytes:
                raise RequestTooLarge(
                    f"{op}: the request passed {max_bytes} bytes of Arrow buffers; allowed: "
                    f"at most {max_bytes} per request (the server's max_request_bytes; split "
                    "the table)")
            batches.append(_checked_batch(chunk.data, op))
        if chunk.app_metadata is not None:
            ended = _end_marker(chunk.app_metadata, op)
    rows = sum(b.num_rows for b in batches)
    if ended is None or context.is_cancelled():
        raise IncompleteRequest(f"{op}: the stream ended without its end marker (the client "
                                "went away half-way); nothing was stored")
    if ended != rows:
        raise IncompleteRequest(f"{op}: the end marker counts {ended} rows, {rows} arrived; "
                                "nothing was stored")
    return pa.Table.from_batches(batches, schema=schema)


def _end_marker(metadata, op: str) -> int:
    body = loads(metadata, f"{op}: the app_metadata")
    if not isinstance(body, dict) or END_OF_ROWS not in body:
        raise InvalidRequest(f"{op}: unknown app_metadata; allowed: {{{END_OF_ROWS!r}: rows}}")
    rows = body[END_OF_ROWS]
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise InvalidRequest(f"{op}: the end marker must count rows (an int >= 0)")
    return rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
