"""What the exactly-once sink stores: its half messages and its commit markers.

The sink (:mod:`store.sink`) writes the rows of a batch as *sink halves*: ordinary half
messages (:mod:`store.transaction.half`) in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, each holding
many rows, invisible until the batch commits.  On commit one *marker* record names the batch
and the halves it committed, in the same atomic group as the committed rows and the op
messages that end the halves.

Sink half (a CommitLog record, layout :mod:`store.codec`)::

    field / property        value
    body                    the staged records, framed (below); halves staged by earlier
                            versions hold an Arrow IPC stream of STAGED_RECORDS_SCHEMA or,
                            before it, of STAGED_SCHEMA (both still committed)
    __transactionId__       "SINK" + 12 hex of the sink key + 16 random hex (32 characters);
                            always the first property
    TRAN_MSG                "true"
    PGROUP                  the sink's producer group
    REAL_TOPIC, REAL_QID    the first row's topic, "0" (informational: rows carry their own)
    __RMQ_SINK              the sink id
    __RMQ_SINK_ROWS         number of rows in the body
    born timestamp          when the rows were taken (their delays count from it)

Framed body (the records in place, so that a task encodes them straight into the half)::

    off    size  type    field
    0      4     bytes   FRAME_MAGIC "RMQF" (an Arrow IPC stream starts with 0xFFFFFFFF)
    4      4     i32     H: length of the head
    8      H     -       head: an Arrow IPC stream of STAGED_HEAD_SCHEMA, one row per record
    8+H    -     -       zeros up to R = the next multiple of 8
    R      -     -       the records back to back, each as ``record`` below; their sizes
                         (the head's ``size``) add up to the rest of the body

STAGED_HEAD_SCHEMA is STAGED_RECORDS_SCHEMA with ``size`` (int32, the record's length in
bytes) in place of ``record``; decoded, a framed body is a table of STAGED_RECORDS_SCHEMA whose
``record`` column views the records (no copy).

STAGED_RECORDS_SCHEMA (one row per message: the record the commit writes, already encoded)::

    column        type                      meaning
    topic         dictionary<int32,string>  the topic the record goes to (SCHEDULE_TOPIC_XXXX
                                            or rmq_sys_wheel_timer for a delayed row); the
                                            dictionary also holds the rows' own topics, and
                                            the commit creates every topic it holds
    queue_id      int32                     its queue; -1: the commit's round robin
    tags_code     int64                     its ConsumeQueue tagsCode
    record        binary                    the whole CommitLog record (layout
                                            :mod:`store.codec`): sys flag COMMIT, born time
                                            of the half, body CRC set; MAGICCODE is 0
                                            (STAGED_MAGIC) so that no scan of the CommitLog
                                            can take it for a record; the commit sets the
                                            magic, PREPAREDTRANSACTIONOFFSET and the fields
                                            every append places (queue id and offset,
                                            physical offset, store time)

STAGED_SCHEMA (halves staged before STAGED_RECORDS_SCHEMA; still committed)::

    column        type      meaning
    topic         string    the destination topic
    body          binary    the payload
    properties    binary    the whole properties string (user properties, TAGS, KEYS,
                            UNIQ_KEY), without the routing of a delayed row
    tags_code     int64     the tag hash (ConsumeQueue tagsCode)
    msg_id        string    the message id (UNIQ_KEY)
    delay_level   int64     4.x delay level, 0: none
    deliver_ms    int64     timer deliver time (epoch ms), -1: none
    queue_id      int64     the queue the row asked for (queue_id / sharding_key), -1:
                            round robin (absent from halves staged before it existed)

Marker (``rmq_sys_sink_commit`` queue 0, a system topic: hidden from readers)::

    field / property        value
    body                    JSON {"sink": id, "batch": n, "transactions": [ids]}
    TAGS                    the sink key (12 hex)
    KEYS                    "<sink key>:<batch id>"
    __RMQ_SINK              the sink id
    __RMQ_SINK_BATCH        the batch id
    tagsCode                (31 bits of the sink key << 32) | (batch id & 0xFFFFFFFF):
                            a marker is found from its ConsumeQueue entries alone
"""

from __future__ import annotations

import hashlib
import json
import secrets
import struct

import numpy as np
import pyarrow as pa

from .errors import CorruptRecordError

SINK_COMMIT_TOPIC = "rmq_sys_sink_commit"
PROPERTY_SINK = "__RMQ_SINK"
PROPERTY_SINK_ROWS = "__RMQ_SINK_ROWS"
PROPERTY_SINK_BATCH = "__RMQ_SINK_BATCH"
#: Transaction ids of sink halves start with this, then the sink key.
SINK_TX_PREFIX = "SINK"
SINK_KEY_HEX = 12

_STAGED_V1 = pa.schema([
    ("topic", pa.string()), ("body", pa.binary()), ("properties", pa.binary()),
    ("tags_code", pa.int64()), ("msg_id", pa.string()), ("delay_level", pa.int64()),
    ("deliver_ms", pa.int64()),
])
STAGED_SCHEMA = _STAGED_V1.append(pa.field("queue_id", pa.int64()))
STAGED_RECORDS_SCHEMA = pa.schema([
    ("topic", pa.dictionary(pa.int32(), pa.string())), ("queue_id", pa.int32()),
    ("tags_code", pa.int64()), ("record", pa.binary()),
])
STAGED_HEAD_SCHEMA = pa.schema([
    ("topic", pa.dictionary(pa.int32(), pa.string())), ("queue_id", pa.int32()),
    ("tags_code", pa.int64()), ("size", pa.int32()),
])
#: MAGICCODE of a record staged in a sink half (the commit writes the real one).
STAGED_MAGIC = 0
FRAME_MAGIC = b"RMQF"
#: Magic and head length of a framed body.
FRAME_PREFIX = struct.Struct(">4si")


def sink_key(sink_id: str) -> str:
    """The 12 upper-case hex characters that stand for a sink id in ids and tags."""
    return hashlib.sha1(sink_id.encode("utf-8")).hexdigest()[:SINK_KEY_HEX].upper()


def new_transaction_id(sink_id: str) -> str:
    """A fresh transaction id of a half of ``sink_id`` (32 characters, see the module doc)."""
    return SINK_TX_PREFIX + sink_key(sink_id) + secrets.token_hex(8).upper()


def transaction_prefix(sink_id: str) -> bytes:
    """The first 16 bytes every transaction id of ``sink_id``'s halves shares."""
    return (SINK_TX_PREFIX + sink_key(sink_id)).encode("ascii")


def is_sink_transaction(transaction_id: str | None) -> bool:
    return bool(transaction_id) and transaction_id.startswith(SINK_TX_PREFIX) \
        and len(transaction_id) == 32


def marker_code(sink_id: str, batch_id: int) -> int:
    """The ConsumeQueue tagsCode of the marker of ``(sink_id, batch_id)``."""
    return (int(sink_key(sink_id)[:8], 16) >> 1) << 32 | (int(batch_id) & 0xFFFFFFFF)


def sink_code(sink_id: str) -> int:
    """The upper 32 bits every marker code of ``sink_id`` shares."""
    return int(sink_key(sink_id)[:8], 16) >> 1


def encode_staged(table: pa.Table) -> pa.Buffer:
    """The body of a sink half: ``table`` (STAGED_RECORDS_SCHEMA, or STAGED_SCHEMA) as an
    Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def framed_head(head: pa.Table) -> tuple[bytes, int]:
    """The bytes a framed body starts with, for the head table ``head``
    (STAGED_HEAD_SCHEMA), and ``R``: where its records start (the prefix, padded)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, head.schema) as writer:
        writer.write_table(head)
    stream = sink.getvalue().to_pybytes()
    at = -(-(FRAME_PREFIX.size + len(stream)) // 8) * 8
    prefix = FRAME_PREFIX.pack(FRAME_MAGIC, len(stream)) + stream
    return prefix + bytes(at - len(prefix)), at


def _decode_framed(body, file: str, position: int) -> pa.Table:
    view = memoryview(body)
    _, length = FRAME_PREFIX.unpack_from(view, 0)
    at = -(-(FRAME_PREFIX.size + length) // 8) * 8
    if length <= 0 or at > len(view):
        raise CorruptRecordError(file, position, f"sink half whose head of {length} bytes "
                                 f"does not fit its body of {len(view)}")
    try:
        head = pa.ipc.open_stream(pa.py_buffer(view[FRAME_PREFIX.size:
                                                    FRAME_PREFIX.size + length])).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptRecordError(file, position,
                                 f"sink half whose head is no Arrow stream ({exc})") from None
    if not head.schema.equals(STAGED_HEAD_SCHEMA):
        raise CorruptRecordError(file, position, f"sink half whose head has schema "
                                 f"{head.schema}; expected {STAGED_HEAD_SCHEMA}")
    head = head.combine_chunks()
    sizes = head.column("size").to_numpy().astype(np.int64)
    if len(sizes) and int(sizes.min()) <= 0 or int(sizes.sum()) != len(view) - at:
        raise CorruptRecordError(file, position, f"sink half whose records' sizes add up to "
                                 f"{int(sizes.sum())} bytes where its body holds "
                                 f"{len(view) - at}")
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    record = pa.Array.from_buffers(pa.binary(), len(sizes), [
        None, pa.py_buffer(offsets), pa.py_buffer(view[at:])])
    return pa.table([head.column("topic"), head.column("queue_id"), head.column("tags_code"),
                     record], schema=STAGED_RECORDS_SCHEMA)


def is_staged_records(table: pa.Table) -> bool:
    """Whether a decoded half holds records (STAGED_RECORDS_SCHEMA) rather than rows."""
    return table.schema.equals(STAGED_RECORDS_SCHEMA)


def decode_staged(body, file: str, position: int) -> pa.Table:
    """The rows of a sink half's body (STAGED_RECORDS_SCHEMA, framed or as a stream, or
    STAGED_SCHEMA; bytes or a memoryview, not copied); :class:`CorruptRecordError` naming
    the half (its segment ``file`` and CommitLog offset ``position``) if the body is none
    of them."""
    if bytes(memoryview(body)[:len(FRAME_MAGIC)]) == FRAME_MAGIC:
        return _decode_framed(body, file, position)
    try:
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptRecordError(file, position,
                                 f"sink half whose body is no Arrow stream ({exc})") from None
    if is_staged_records(table):
        return table
    if table.schema.equals(_STAGED_V1):  # staged before rows could ask for a queue
        table = table.append_column("queue_id", pa.array([-1] * table.num_rows, pa.int64()))
    if not table.schema.equals(STAGED_SCHEMA):
        raise CorruptRecordError(
            file, position, f"sink half whose rows have schema {table.schema}; expected "
            f"{STAGED_RECORDS_SCHEMA} (or, staged by an older version, {STAGED_SCHEMA})")
    return table


def encode_marker(sink_id: str, batch_id: int, transactions: list[str]) -> bytes:
    return json.dumps({"sink": sink_id, "batch": int(batch_id),
                       "transactions": list(transactions)},
                      separators=(",", ":")).encode("utf-8")


def decode_marker(body: bytes) -> dict | None:
    """The marker's fields, or ``None`` when the body is not a marker."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("sink"), str) \
            or not isinstance(data.get("batch"), int) \
            or not isinstance(data.get("transactions"), list):
        return None
    return data


def marker_tags_code(properties, store_timestamp_ms: int) -> int | None:
    """TagsCode rule of the marker topic (for re-dispatch by recovery)."""
    sink_id = properties.get(PROPERTY_SINK)
    batch = properties.get(PROPERTY_SINK_BATCH)
    if sink_id is None or batch is None or not batch.lstrip("-").isdigit():
        return None
    return marker_code(sink_id, int(batch))
