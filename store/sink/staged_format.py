"""What the exactly-once sink stores: its half messages and its commit markers.

The sink (:mod:`store.sink.sink`) keeps each staging of rows open as a *sink half*: an
ordinary half message (:mod:`store.transaction.half`) in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue
0, invisible until the batch commits.  On commit one *marker* record names the batch and
the halves it committed, in the same atomic group as the op messages that end the halves.
A half is one of two kinds, told by the first four bytes of its body:

* a *stage note* (``RMQR``, the default, index commits): the rows were appended as staged
  records in their real topics (:mod:`store.core.index_commit`); the note lists their
  CommitLog ranges and the commit makes them visible with one index-commit marker;
* a *framed half* (``RMQF``, ``commit="copy"``): the half holds the rows' records; the
  commit copies them into their topics.

Stage note body (integers big-endian, R ranges)::

    off     size   type      field
    0       4      bytes     NOTE_MAGIC "RMQR"
    4       4      i32       R
    8       16R    i64[2R]   start, end of each range of staged records (CommitLog offsets)
    8+16R   -      utf-8     the rows' own topics, each followed by "\n" (a delayed row's
                             record is in a delay topic: the commit creates its topic too)

Sink half (a CommitLog record, layout :mod:`store.formats.record_codec`)::

    field / property        value
    body                    the staged records, framed (below)
    __transactionId__       "SINK" + 12 hex of the sink key + 16 random hex (32 characters);
                            always the first property
    TRAN_MSG                "true"
    PGROUP                  the sink's producer group
    REAL_TOPIC, REAL_QID    the first row's topic, "0" (informational: rows carry their own)
    __RMQ_SINK              the sink id
    __RMQ_SINK_ROWS         number of rows in the body
    born timestamp          when the rows were taken (their delays count from it)

Framed body (the records in place, so that a task encodes them straight into the half;
integers big-endian, N records, T topics)::

    off        size  type     field
    0          4     bytes    FRAME_MAGIC "RMQF"
    4          4     i32      N
    8          4     i32      T
    12         4     i32      L: bytes of the topic names
    16         4T    i32[T]   where each topic name ends in the names
    16+4T      L     utf-8    the topic names back to back
    -          -     -        zeros up to A, the next multiple of 8
    A          8N    i64[N]   each record's tagsCode
    A+8N       4N    i32[N]   its topic (an index into the names)
    A+12N      4N    i32[N]   its queue; -1: the commit's round robin
    A+16N      4N    i32[N]   its size in bytes
    -          -     -        zeros up to R, the next multiple of 8
    R          -     -        the records back to back (each as ``record`` below); their
                              sizes add up to the rest of the body

Decoded, a framed body is a table of STAGED_RECORDS_SCHEMA whose ``record`` column views the
records (no copy).

STAGED_RECORDS_SCHEMA (one row per message: the record the commit writes, already encoded)::

    column        type                      meaning
    topic         dictionary<int32,string>  the topic the record goes to (SCHEDULE_TOPIC_XXXX
                                            or rmq_sys_wheel_timer for a delayed row); the
                                            dictionary also holds the rows' own topics, and
                                            the commit creates every topic it holds
    queue_id      int32                     its queue; -1: the commit's round robin
    tags_code     int64                     its ConsumeQueue tagsCode
    record        binary                    the whole CommitLog record (layout
                                            :mod:`store.formats.record_codec`): sys flag COMMIT, born time
                                            of the half, body CRC set; MAGICCODE is 0
                                            (STAGED_MAGIC) so that no scan of the CommitLog
                                            can take it for a record; the commit sets the
                                            magic, PREPAREDTRANSACTIONOFFSET and the fields
                                            every append places (queue id and offset,
                                            physical offset, store time)

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

from ..base.errors import CorruptRecordError
from ..formats.message import PROPERTY_SINK, SINK_TX_PREFIX

SINK_COMMIT_TOPIC = "rmq_sys_sink_commit"
PROPERTY_SINK_ROWS = "__RMQ_SINK_ROWS"
PROPERTY_SINK_BATCH = "__RMQ_SINK_BATCH"
SINK_KEY_HEX = 12

STAGED_RECORDS_SCHEMA = pa.schema([
    ("topic", pa.dictionary(pa.int32(), pa.string())), ("queue_id", pa.int32()),
    ("tags_code", pa.int64()), ("record", pa.binary()),
])
#: MAGICCODE of a record staged in a sink half (the commit writes the real one).
STAGED_MAGIC = 0
FRAME_MAGIC = b"RMQF"
NOTE_MAGIC = b"RMQR"
NOTE_PREFIX = struct.Struct(">4si")
#: Magic, record count, topic count and topic names' length of a framed body.
FRAME_PREFIX = struct.Struct(">4siii")


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


def _up8(n: int) -> int:
    return -(-n // 8) * 8


def framed_head(topics: list[str], topic_ids: np.ndarray, queue_ids: np.ndarray,
                tags_codes: np.ndarray, sizes: np.ndarray) -> tuple[bytes, int]:
    """The bytes a framed body starts with (everything before its records, see the module
    doc) and ``R``, their length: where the records start."""
    n = len(sizes)
    names = [t.encode("utf-8") for t in topics]
    ends = np.cumsum([len(b) for b in names], dtype=np.int64).astype(">i4")
    text = b"".join(names)
    lead = FRAME_PREFIX.pack(FRAME_MAGIC, n, len(names), len(text)) + ends.tobytes() + text
    at = _up8(len(lead))
    columns = b"".join([np.asarray(tags_codes, ">i8").tobytes(),
                        np.asarray(topic_ids, ">i4").tobytes(),
                        np.asarray(queue_ids, ">i4").tobytes(), np.asarray(sizes, ">i4").tobytes()])
    head = lead + bytes(at - len(lead)) + columns
    return head + bytes(_up8(len(head)) - len(head)), _up8(len(head))


def _decode_framed(body, file: str, position: int) -> pa.Table:
    view = memoryview(body)

    def refuse(what: str):
        return CorruptRecordError(file, position, f"sink half whose framed body {what}; its "
                                  "batch cannot commit")

    if len(view) < FRAME_PREFIX.size:
        raise refuse(f"of {len(view)} bytes is shorter than its prefix")
    _, n, t, length = FRAME_PREFIX.unpack_from(view, 0)
    names_at = FRAME_PREFIX.size + 4 * t
    at = _up8(names_at + length) if min(n, t, length) >= 0 else -1
    records_at = _up8(at + 20 * n)
    if at < 0 or records_at > len(view):
        raise refuse(f"says {n} records and {t} topics ({length} bytes of names), more "
                     f"than its {len(view)} bytes hold")
    raw = np.frombuffer(view, np.uint8, count=records_at)
    ends = raw[FRAME_PREFIX.size:names_at].view(">i4").astype(np.int64)
    if t and (ends[0] < 0 or (np.diff(ends) < 0).any() or ends[-1] != length):
        raise refuse("has topic names that do not add up")
    starts = np.concatenate(([0], ends[:-1])) if t else ends
    text = bytes(raw[names_at:names_at + length])
    try:
        topics = [text[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist())]
    except UnicodeDecodeError:
        raise refuse("has a topic name that is not UTF-8") from None
    codes = raw[at:at + 8 * n].view(">i8").astype(np.int64)
    topic_ids = raw[at + 8 * n:at + 12 * n].view(">i4").astype(np.int32)
    queue_ids = raw[at + 12 * n:at + 16 * n].view(">i4").astype(np.int32)
    sizes = raw[at + 16 * n:at + 20 * n].view(">i4").astype(np.int64)
    if n and (int(topic_ids.min()) < 0 or int(topic_ids.max()) >= t):
        raise refuse(f"names a topic past its {t} topics")
    if n and int(sizes.min()) <= 0 or int(sizes.sum()) != len(view) - records_at:
        raise refuse(f"has records whose sizes add up to {int(sizes.sum())} bytes where it "
                     f"holds {len(view) - records_at}")
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    record = pa.Array.from_buffers(pa.binary(), n, [
        None, pa.py_buffer(offsets), pa.py_buffer(view[records_at:])])
    topic = pa.DictionaryArray.from_arrays(pa.array(topic_ids), pa.array(topics, pa.string()))
    return pa.table([topic, pa.array(queue_ids), pa.array(codes), record],
                    schema=STAGED_RECORDS_SCHEMA)


def decode_staged(body, file: str, position: int) -> pa.Table:
    """The records of a sink half's framed body as a STAGED_RECORDS_SCHEMA table (bytes or a
    memoryview, not copied); :class:`CorruptRecordError` naming the half (its segment
    ``file`` and CommitLog offset ``position``) if the body is not framed or does not add
    up."""
    if bytes(memoryview(body)[:len(FRAME_MAGIC)]) != FRAME_MAGIC:
        raise CorruptRecordError(file, position, "sink half whose body is not framed records "
                                 f"(it does not start with {FRAME_MAGIC!r})")
    return _decode_framed(body, file, position)


def encode_note(ranges: list[tuple[int, int]], topics: list[str]) -> bytes:
    """The body of a stage note listing ``ranges`` of rows of ``topics``."""
    return NOTE_PREFIX.pack(NOTE_MAGIC, len(ranges)) + np.asarray(
        ranges, dtype=">i8").reshape(-1).tobytes() + "".join(
            f"{t}\n" for t in topics).encode("utf-8")


def is_note(body) -> bool:
    """Whether a sink half's body is a stage note (else a framed half)."""
    return bytes(memoryview(body)[:len(NOTE_MAGIC)]) == NOTE_MAGIC


def decode_note(body, file: str, position: int) -> tuple[list[tuple[int, int]], list[str]]:
    """The ranges and topics a stage note lists; :class:`CorruptRecordError` naming the
    half when the body does not add up."""
    view = memoryview(body)
    if len(view) < NOTE_PREFIX.size:
        raise CorruptRecordError(file, position, "stage note shorter than its prefix")
    magic, count = NOTE_PREFIX.unpack_from(view, 0)
    end = NOTE_PREFIX.size + 16 * count
    text = bytes(view[end:]) if count >= 0 and end <= len(view) else b""
    if magic != NOTE_MAGIC or count < 0 or end > len(view) or text[-1:] not in (b"", b"\n"):
        raise CorruptRecordError(file, position, f"stage note of {len(view)} bytes that does "
                                 f"not hold the {count} ranges it counts; its batch cannot "
                                 "commit")
    pairs = np.frombuffer(view[:end], ">i8", offset=NOTE_PREFIX.size).astype(np.int64)
    try:
        topics = text.decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        raise CorruptRecordError(file, position, "stage note whose topics are not UTF-8") \
            from None
    return [(int(a), int(b)) for a, b in pairs.reshape(-1, 2).tolist()], topics


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
