"""What the exactly-once sink stores: its half messages and its commit markers.

The sink (:mod:`store.sink.sink`) keeps each staging of rows open as a *sink half*: an
ordinary half message (:mod:`store.transaction.half`) in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue
0, invisible until the batch commits.  On commit one *marker* record names the batch and
the halves it committed, in the same atomic group as the op messages that end the halves.
A half is one of two kinds, told by the first four bytes of its body:

* a *stage note* (``RMQN``, the default, index commits): the rows were appended as staged
  records in their real topics (:mod:`store.core.index_commit`); the note lists their
  CommitLog ranges and each record's queue-entry columns, and the commit makes them visible
  with one index-commit marker written from those columns, without reading the records;
* a *framed half* (``RMQF``, ``commit="copy"``): the half holds the rows' records; the
  commit copies them into their topics.

Stage note body (integers big-endian; R ranges, N records, U runs of records of one queue,
C runs of records of one tagsCode, T topics, L bytes of topic names)::

    off      size   type      field
    0        4      bytes     NOTE_MAGIC "RMQN"
    4        24     i32[6]    R, N, U, C, T, L
    28       16R    i64[2R]   start, end of each range of staged records (CommitLog
                              offsets, one segment each, its records back to back)
    +        4R     i32[R]    how many runs each range holds (its runs follow one another)
    +        4N     i32[N]    each record's size, in CommitLog order
    +        4U     i32[U]    the topic of each run (records of one queue, back to back in
                              one range) as an index into the names
    +        4U     i32[U]    its queue id
    +        4U     i32[U]    how many records it holds (its records follow the run before)
    +        8C     i64[C]    the tagsCode of each run of records of one tagsCode
    +        4C     i32[C]    how many records it holds
    +        4T     i32[T]    where each topic name ends in the names
    +        L      utf-8     the topic names back to back: the records' topics and the
                              rows' own topics (a delayed row's record is in a delay topic:
                              the commit creates every topic named)

The columns are what the stager placed (it encoded the records and kept where they
landed), so the commit need not read the records (:mod:`store.core.placed_commit` says what
it checks against them); a note holds at most about
``max_message_size_bytes`` (a stage of many rows writes several notes).  An earlier
version's note (``RMQR``: R, then the ranges, then the topics each followed by ``"\n"``) is
still committed, by reading its records.

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
from ..core.index_commit import StagedColumns
from ..core.placed_commit import StagedRuns
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
NOTE_MAGIC = b"RMQN"
#: Magic, then R, N, U, C, T and L of a stage note (see the module doc).
NOTE_HEAD = struct.Struct(">4s6i")
#: An earlier version's stage note: magic and range count, then the ranges and topics.
OLD_NOTE_MAGIC = b"RMQR"
OLD_NOTE_PREFIX = struct.Struct(">4si")
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


def note_bounds(cols: StagedColumns, topics: list[str], budget: int, file_size: int
                ) -> list[tuple[int, int]]:
    """The rows ``(lo, hi)`` of each stage note of the records ``cols`` (of rows of
    ``topics``, in a CommitLog of ``file_size`` segments), each note's body at most
    ``budget`` bytes where it can be (a note holds one record at least)."""
    n = len(cols)
    names = sum(len(t.encode("utf-8")) for t in dict.fromkeys([*cols.topics, *topics]))
    fixed = note_size(1, 0, 1, 1, names)  # (a note cut amid runs starts a run and a range)
    if n == 0 or fixed + note_size(n, n, n, n, 0) <= budget:
        return [(0, n)] if n else []
    key = (cols.topic_ids << 32) | (cols.queue_ids & 0xFFFFFFFF)
    offsets = cols.offsets
    cost = np.full(n, 4, np.int64)  # each record's size, then what it starts
    new_range = ((offsets[1:] != offsets[:-1] + cols.sizes[:-1])
                 | (offsets[1:] // file_size != offsets[:-1] // file_size))
    cost[1:] += 20 * new_range + 12 * (new_range | (key[1:] != key[:-1])) \
        + 12 * (cols.codes[1:] != cols.codes[:-1])
    cum = np.cumsum(cost)
    bounds, lo, base = [], 0, 0
    while lo < n:
        hi = max(lo + 1, int(np.searchsorted(cum, base + budget - fixed, side="right")))
        bounds.append((lo, hi))
        base, lo = int(cum[hi - 1]), hi
    return bounds


def note_size(ranges: int, rows: int, runs: int, code_runs: int, names: int) -> int:
    """Bytes of a stage note body of so many ranges, records, runs and bytes of names (and
    topics: at most ``names`` of them)."""
    return NOTE_HEAD.size + 20 * ranges + 4 * rows + 12 * runs + 12 * code_runs \
        + 4 * names + names


def note_fits(staged: StagedRuns, topics: list[str], budget: int) -> bool:
    """Whether the stage note of ``staged`` (rows of ``topics``) is at most ``budget``
    bytes."""
    names = sum(len(t.encode("utf-8")) for t in dict.fromkeys([*staged.topics, *topics]))
    return note_size(len(staged.ranges), len(staged.sizes), len(staged.run_first),
                     len(staged.code_values), names) <= budget


def encode_note(staged: StagedRuns, topics: list[str]) -> bytes:
    """The body of a stage note of the staged records ``staged`` (one stager's: its runs
    follow one another) of rows of ``topics``."""
    names = list(dict.fromkeys([*staged.topics, *topics]))
    encoded = [t.encode("utf-8") for t in names]
    text = b"".join(encoded)
    return b"".join([
        NOTE_HEAD.pack(NOTE_MAGIC, len(staged.ranges), len(staged.sizes),
                       len(staged.run_first), len(staged.code_values), len(names), len(text)),
        np.asarray(staged.ranges, ">i8").tobytes(), staged.range_runs.astype(">i4").tobytes(),
        staged.sizes.astype(">i4").tobytes(), staged.run_topics.astype(">i4").tobytes(),
        staged.run_queues.astype(">i4").tobytes(), staged.run_counts.astype(">i4").tobytes(),
        staged.code_values.astype(">i8").tobytes(),
        np.diff(staged.code_ends, prepend=0).astype(">i4").tobytes(),
        np.cumsum([len(b) for b in encoded], dtype=np.int64).astype(">i4").tobytes(), text])


def is_note(body) -> bool:
    """Whether a sink half's body is a stage note (else a framed half)."""
    return bytes(memoryview(body)[:len(NOTE_MAGIC)]) in (NOTE_MAGIC, OLD_NOTE_MAGIC)


def decode_note(body, file: str, position: int) -> tuple[StagedRuns | None,
                                                         list[tuple[int, int]], list[str]]:
    """What a stage note says: ``(staged, ranges, topics)``, ``staged`` the records'
    columns (``None`` for a note of an earlier version, which lists only its ``ranges``:
    its records must be read); :class:`CorruptRecordError` naming the half when the body
    does not add up (what its columns say of the CommitLog is checked by the commit)."""
    view = memoryview(body)
    if bytes(view[:len(OLD_NOTE_MAGIC)]) == OLD_NOTE_MAGIC:
        ranges, topics = _decode_old_note(view, file, position)
        return None, ranges, topics

    def refuse(what: str):
        return CorruptRecordError(file, position, f"stage note {what}; its batch cannot "
                                  "commit")

    if len(view) < NOTE_HEAD.size:
        raise refuse(f"of {len(view)} bytes, shorter than its head")
    magic, r, n, u, c, t, length = NOTE_HEAD.unpack_from(view, 0)
    if magic != NOTE_MAGIC or min(r, n, u, c, t, length) < 0 \
            or note_size(r, n, u, c, 0) + 4 * t + length != len(view):
        raise refuse(f"of {len(view)} bytes that does not hold the {r} ranges, {n} records, "
                     f"{u} + {c} runs and {t} topics it counts")
    raw = np.frombuffer(view, np.uint8)
    at = NOTE_HEAD.size

    def take(count: int, dtype: str) -> np.ndarray:
        nonlocal at
        size = count * np.dtype(dtype).itemsize
        out = raw[at:at + size].view(dtype).astype(np.int64)
        at += size
        return out

    ranges = take(2 * r, ">i8").reshape(-1, 2)
    range_runs, sizes = take(r, ">i4"), take(n, ">i4")
    run_topics, run_queues, run_counts = take(u, ">i4"), take(u, ">i4"), take(u, ">i4")
    code_values, code_counts = take(c, ">i8"), take(c, ">i4")
    ends = take(t, ">i4")
    text = bytes(raw[at:])
    if t and (ends[0] < 0 or (np.diff(ends) < 0).any() or ends[-1] != length):
        raise refuse("whose topic names do not add up")
    try:
        names = [text[a:b].decode("utf-8") for a, b in zip(
            np.concatenate(([0], ends[:-1])).tolist(), ends.tolist())]
    except UnicodeDecodeError:
        raise refuse("whose topic names are not UTF-8") from None
    if any((x < 1).any() or int(x.sum()) != total
           for x, total in ((range_runs, u), (run_counts, n), (code_counts, n))) \
            or (u and (int(run_topics.min()) < 0 or int(run_topics.max()) >= t
                       or int(run_queues.min()) < 0)) or (n and int(sizes.min()) < 1):
        raise refuse(f"whose ranges, runs or sizes do not cover its {n} records in {u} runs "
                     f"of {t} topics")
    staged = StagedRuns(ranges, range_runs, names, run_topics, run_queues,
                        np.cumsum(run_counts) - run_counts, run_counts, sizes, code_values,
                        np.cumsum(code_counts))
    return staged, [(a, b) for a, b in ranges.tolist()], names


def _decode_old_note(view, file: str, position: int) -> tuple[list[tuple[int, int]], list[str]]:
    """The ranges and topics of an earlier version's stage note (``RMQR``)."""
    if len(view) < OLD_NOTE_PREFIX.size:
        raise CorruptRecordError(file, position, "stage note shorter than its prefix")
    magic, count = OLD_NOTE_PREFIX.unpack_from(view, 0)
    end = OLD_NOTE_PREFIX.size + 16 * count
    text = bytes(view[end:]) if count >= 0 and end <= len(view) else b""
    if magic != OLD_NOTE_MAGIC or count < 0 or end > len(view) \
            or text[-1:] not in (b"", b"\n"):
        raise CorruptRecordError(file, position, f"stage note of {len(view)} bytes that does "
                                 f"not hold the {count} ranges it counts; its batch cannot "
                                 "commit")
    pairs = np.frombuffer(view[:end], ">i8", offset=OLD_NOTE_PREFIX.size).astype(np.int64)
    try:
        topics = text.decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        raise CorruptRecordError(file, position, "stage note whose topics are not UTF-8") \
            from None
    return [(int(a), int(b)) for a, b in pairs.reshape(-1, 2).tolist()], topics


def note_ranges(body, file: str, position: int) -> list[tuple[int, int]]:
    """The ranges a stage note lists (its columns not decoded)."""
    view = memoryview(body)
    if bytes(view[:len(OLD_NOTE_MAGIC)]) == OLD_NOTE_MAGIC:
        return _decode_old_note(view, file, position)[0]
    if len(view) < NOTE_HEAD.size:
        raise CorruptRecordError(file, position, "stage note shorter than its head")
    r = NOTE_HEAD.unpack_from(view, 0)[1]
    if r < 0 or NOTE_HEAD.size + 16 * r > len(view):
        raise CorruptRecordError(file, position, f"stage note that does not hold its {r} "
                                 "ranges")
    pairs = np.frombuffer(view, ">i8", count=2 * r, offset=NOTE_HEAD.size).astype(np.int64)
    return [(a, b) for a, b in pairs.reshape(-1, 2).tolist()]


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
