"""Vectorised decoding of a queue range into a ``pyarrow.RecordBatch`` (the Spark rows).

Reads CommitLog records (layout: :mod:`store.codec`) through their ConsumeQueue entries
without a per-message Python loop:

1. ConsumeQueue entries ``[start, end)`` arrive as one NumPy array (offset, size, tagsCode);
   a tag filter first drops entries by tagsCode (Java hash) before any record is touched.
2. Per CommitLog segment, in steps of about :data:`_SCAN_BYTES` (so that each pass finds the
   records still in the CPU cache), the 88-byte headers are gathered with one NumPy fancy
   index over a stride-1 ``V88`` view of the segment's ``mmap`` and read through
   :data:`store.codec.HEADER_DTYPE` (big-endian); a second gather reads TOPICLENGTH, TOPIC
   and PROPERTIESLENGTH behind each body.  Every length is checked against the entry size.
3. Bodies and properties are cut out by Arrow: one ``BinaryArray`` over the segment bytes
   whose offsets walk ``body, gap, properties, gap`` for every record, so a ``take`` of every
   other element copies the bodies (in C++, one pass per segment).
4. Properties are split into pairs by :mod:`store.arrow_properties` (RocketMQ's rule, on
   separator positions) and every name gets a code: ``UNIQ_KEY``, ``TAGS``, ``KEYS``,
   ``__RMQ_DELIVER_MS`` and ``__transactionId__`` route their values to their columns, other
   system names are dropped, the rest form the map.  One ``take`` copies every value the
   string columns and the map need.

Column semantics equal :func:`store.message.record_view`.  When a message repeats a
property name, its scalar columns take the last value (as ``dict`` does) but the map keeps
both entries; the store never writes such records.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable
from itertools import pairwise
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..arrow_properties import (
    DELIVER,
    KEYS,
    SPECIAL_NAMES,
    TAGS,
    TRANSACTION,
    UNIQ,
    arrow_of,
    parse_properties,
    split_keys,
    string_array,
)
from ..commit_log import CommitLog
from ..consume_queue import FILLER_SIZE, ConsumeQueue
from ..codec import (
    FIXED_SIZE,
    HEADER_DTYPE,
    HEADER_SIZE,
    MESSAGE_MAGIC_CODE_V1,
    PROPERTIES_LENGTH,
    TOPIC_LENGTH,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from ..errors import CorruptRecordError, OffsetOutOfRangeError
from ..message import PROPERTY_DELIVER_MS, java_string_hash



class QueueSource(Protocol):
    """What decoding needs of a store: its CommitLog and its ConsumeQueues."""

    commit_log: CommitLog

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue: ...

__all__ = ["MESSAGE_SCHEMA", "empty_batch", "read_queue_batch"]

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_KEYS_TYPE = pa.list_(pa.field("element", pa.string()))
_PROPERTIES_TYPE = pa.map_(pa.field("key", pa.string(), nullable=False),
                           pa.field("value", pa.string()))

#: The Arrow schema of the ``messages`` view: exactly what Spark makes of ``rmq_source``'s
#: ``MESSAGE_SPARK_DDL`` (``to_arrow_schema(..., timezone="UTC")``; a test checks it),
#: hard-coded so ``store`` never imports Spark.
MESSAGE_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("queue_id", pa.int32()),
    pa.field("queue_offset", pa.int64()),
    pa.field("commitlog_offset", pa.int64()),
    pa.field("msg_id", pa.string()),
    pa.field("tags", pa.string()),
    pa.field("keys", _KEYS_TYPE),
    pa.field("body", pa.binary()),
    pa.field("properties", _PROPERTIES_TYPE),
    pa.field("born_timestamp", _TIMESTAMP),
    pa.field("store_timestamp", _TIMESTAMP),
    pa.field("deliver_timestamp", _TIMESTAMP),
    pa.field("transaction_id", pa.string()),
    pa.field("reconsume_times", pa.int32()),
])

#: ConsumeQueue size of a filler unit in front of a queue that starts above 0 (no message).
#: Bytes of records scanned per step: what the header and tail passes find in L2 cache.
_SCAN_BYTES = 1 << 20

# Header fields the columns use, as the columns hold them (native order; times in µs).
_FIELD_TYPES = {"queue_id": np.int32, "sys_flag": np.int32, "born_timestamp": np.int64,
                "store_timestamp": np.int64, "reconsume_times": np.int32}
_TIME_FIELDS = ("born_timestamp", "store_timestamp")
_HEADER_VOID = np.dtype(f"V{HEADER_SIZE}")
_TOPIC_LENGTH_SIZE = TOPIC_LENGTH.size
_PROPERTIES_LENGTH_SIZE = PROPERTIES_LENGTH.size


_heap_kept = False


def _keep_freed_heap() -> None:
    """Ask glibc, once per process, to keep freed memory for reuse instead of returning it.

    A decode makes a few MB of NumPy temporaries.  With glibc's default (dynamic) thresholds
    they are unmapped or trimmed on free and faulted back in, zero-filled, by the next call:
    measured at a fifth to a quarter of the decode time (1,000 to 3,400 page faults per
    50,000 rows).  Raising ``M_TRIM_THRESHOLD`` (256 MiB) and ``M_MMAP_THRESHOLD`` (32 MiB)
    removes them; the cost is that up to that much freed memory stays in the process.  Does
    nothing off Linux/glibc.
    """
    global _heap_kept
    if _heap_kept:
        return
    _heap_kept = True
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc's maximum on 64-bit)


def empty_batch() -> pa.RecordBatch:
    """A batch with :data:`MESSAGE_SCHEMA` and no rows."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in MESSAGE_SCHEMA],
                                      schema=MESSAGE_SCHEMA)


def read_queue_batch(store: QueueSource, topic: str, queue_id: int, start: int, end: int,
                     tags: Iterable[str] | None = None) -> pa.RecordBatch:
    """Decode the messages at queue offsets ``[start, end)`` of one queue.

    Parameters
    ----------
    store : QueueSource
        An open store (anything with ``commit_log`` and ``consume_queue``).
    topic, queue_id :
        The queue.
    start, end : int
        Queue offsets; the caller guarantees ``end <= store.max_offset(topic, queue_id)``.
    tags : iterable of str or str, optional
        Keep only messages whose tag is one of these (``None``: every message).  Entries are
        dropped on their ConsumeQueue tagsCode before any record is read, then by an exact
        comparison of the decoded tag (Java hashes collide).

    Returns
    -------
    pyarrow.RecordBatch
        Rows in queue order with :data:`MESSAGE_SCHEMA`; ConsumeQueue filler units (in front
        of a queue that begins above offset 0) yield no row.

    Raises
    ------
    OffsetOutOfRangeError
        ``start``/``end`` are negative or reversed, an entry is not written yet, or its
        record's segment was removed by retention.
    CorruptRecordError
        A record does not match its ConsumeQueue entry or its own length fields.

    Notes
    -----
    The first call in a process raises glibc's malloc trim and mmap thresholds (see
    :func:`_keep_freed_heap`): freed temporaries stay in the process for the next call.
    """
    start, end = int(start), int(end)
    if start < 0 or end < start:
        raise OffsetOutOfRangeError(
            f"queue offsets [{start}, {end}) of {topic}/{queue_id}; allowed: 0 <= start <= end")
    if isinstance(tags, str):  # one tag, not its characters
        tags = (tags,)
    tag_set = None if tags is None else sorted({str(t) for t in tags})
    if end == start or tag_set == []:
        return empty_batch()
    entries = store.consume_queue(topic, queue_id).entries(start, end)
    if len(entries) != end - start or (entries["size"] <= 0).any():
        written = len(entries) if (entries["size"] > 0).all() else int(
            np.argmin(entries["size"] > 0))
        raise OffsetOutOfRangeError(
            f"queue offset {start + written} of {topic}/{queue_id} is not written; "
            f"allowed: end <= max_offset ({start + written} here)")
    queue_offsets = np.arange(start, end, dtype=np.int64)
    keep = entries["size"] != FILLER_SIZE
    if tag_set is not None:
        codes = np.array([java_string_hash(t) if t else 0 for t in tag_set], np.int64)
        keep &= np.isin(entries["tags_code"], codes)
    if not keep.all():
        entries, queue_offsets = entries[keep], queue_offsets[keep]
        if len(entries) == 0:
            return empty_batch()
    _keep_freed_heap()
    batch = _decode(store, topic, queue_id, entries, queue_offsets)
    if tag_set is not None:
        # is_in gives False (not null) for a row without a tag
        exact = pc.is_in(batch.column("tags"), value_set=string_array(tag_set))
        if not pc.all(exact).as_py():
            batch = batch.filter(exact)
    return batch


# --------------------------------------------------------------------------- records


def _decode(store: QueueSource, topic: str, queue_id: int, entries: np.ndarray,
            queue_offsets: np.ndarray) -> pa.RecordBatch:
    """Decode the records of ``entries`` (in CommitLog order) into a batch."""
    phys = np.ascontiguousarray(entries["offset"], dtype=np.int64)
    sizes = entries["size"].astype(np.int64)
    n = len(phys)
    file_size = store.commit_log.file_size
    first, last = int(phys[0]) // file_size, int(phys[-1]) // file_size
    cuts = np.searchsorted(phys, np.arange(first + 1, last + 1, dtype=np.int64) * file_size)
    bounds = [0, *sorted(set(cuts.tolist()) - {0, n}), n]
    topic_bytes = topic.encode("utf-8")
    fields = {name: np.empty(n, dtype) for name, dtype in _FIELD_TYPES.items()}
    parts = []
    for lo, hi in pairwise(bounds):  # one step per CommitLog segment
        f = store.commit_log.files.find(int(phys[lo]))
        if f is None:
            raise OffsetOutOfRangeError(
                f"queue offset {int(queue_offsets[lo])} of {topic}/{queue_id} points at "
                f"CommitLog offset {int(phys[lo])}, which is no longer stored (removed by "
                "retention); allowed: from the queue's min_offset on")
        parts.append(_read_segment(f, phys[lo:hi], sizes[lo:hi], topic_bytes,
                                   {k: v[lo:hi] for k, v in fields.items()}))
    if len(parts) == 1:
        body, topic_arr, props = parts[0]
    else:
        body = pa.concat_arrays([p[0] for p in parts])
        props = pa.concat_arrays([p[2] for p in parts])
        topic_arr = None if all(p[1] is None for p in parts) else pa.concat_arrays(
            [_repeat_string(topic_bytes, len(p[0])) if p[1] is None else p[1] for p in parts])
    if topic_arr is None:
        topic_arr = _repeat_string(topic_bytes, n)
    columns = _columns(fields, phys, queue_offsets, body, topic_arr, props)
    return pa.RecordBatch.from_arrays(columns, schema=MESSAGE_SCHEMA)


def _read_segment(f, phys: np.ndarray, sizes: np.ndarray, topic: bytes, fields: dict):
    """Check and read the records of one segment; fill ``fields``.

    Returns body, topic (``None`` when every record holds exactly ``topic``, the queue's
    own) and properties as ``BinaryArray`` s.
    """
    pos = phys - f.start
    record_end = pos + sizes
    bad = (pos < 0) | (record_end > f.size) | (sizes < FIXED_SIZE)
    bad[1:] |= pos[1:] < record_end[:-1]  # records overlap or are out of order
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordError(f.path, int(phys[i]), f"ConsumeQueue entry of size "
                                 f"{int(sizes[i])} overlaps another or leaves segment "
                                 f"{f.start}..{f.end}")
    try:
        mm = f.buffer()
    except FileNotFoundError:  # deleted by retention (in another process) since the lookup
        raise OffsetOutOfRangeError(
            f"CommitLog segment {f.path} was removed by retention while being read; allowed: "
            "from the queue's min_offset on") from None
    count = len(pos)
    body_end = np.empty(count, dtype=np.int64)
    topic_len = np.empty(count, dtype=np.int64)
    span = int(record_end[-1] - pos[0])
    steps = np.searchsorted(pos, pos[0] + np.arange(_SCAN_BYTES, span, _SCAN_BYTES))
    bounds = [0, *sorted(set(steps.tolist()) - {0, count}), count]
    own = True
    for lo, hi in pairwise(bounds):
        own &= _scan(f, mm, pos[lo:hi], sizes[lo:hi], phys[lo:hi], topic,
                     {name: out[lo:hi] for name, out in fields.items()}, body_end[lo:hi],
                     topic_len[lo:hi])
    topic_start = body_end + _TOPIC_LENGTH_SIZE
    props_start = topic_start + topic_len + _PROPERTIES_LENGTH_SIZE
    if own:
        body, props = _cut(mm, pos[0], record_end[-1], [(pos + HEADER_SIZE, body_end),
                                                        (props_start, record_end)])
        return body, None, props
    body, topic_arr, props = _cut(mm, pos[0], record_end[-1], [
        (pos + HEADER_SIZE, body_end), (topic_start, topic_start + topic_len),
        (props_start, record_end)])
    try:
        return body, topic_arr.cast(pa.string()), props
    except pa.ArrowInvalid:
        raise CorruptRecordError(f.path, int(phys[0]), "a record's topic is not text") from None


def _scan(f, mm, pos, sizes, phys, topic: bytes, fields, body_end, topic_len) -> bool:
    """Read and check one step of records; fill ``fields``, ``body_end`` and ``topic_len``.

    Returns whether every record's topic is ``topic``.
    """
    # Element i of this view is the 88 bytes starting at byte i: one fancy index gathers every
    # header in a C loop; the big-endian fields are then read through HEADER_DTYPE.
    view = np.ndarray(shape=(f.size - HEADER_SIZE + 1,), dtype=_HEADER_VOID, buffer=mm,
                      strides=(1,))
    header = view[pos].view(HEADER_DTYPE)
    body_len = header["body_length"].astype(np.int64)
    bad = ((header["magic"] != MESSAGE_MAGIC_CODE_V1) | (header["total_size"] != sizes)
           | (header["physical_offset"] != phys) | (body_len < 0)
           | (body_len > sizes - FIXED_SIZE))
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordError(
            f.path, int(phys[i]), f"record header (magic {int(header['magic'][i]) & 0xFFFFFFFF:#x},"
            f" size {int(header['total_size'][i])}, physical offset "
            f"{int(header['physical_offset'][i])}) does not match its ConsumeQueue entry "
            f"(size {int(sizes[i])})")
    for name, out in fields.items():
        if name in _TIME_FIELDS:
            np.multiply(header[name], 1000, out=out)  # ms -> µs
        else:
            out[:] = header[name]
    np.add(pos + HEADER_SIZE, body_len, out=body_end)  # where TOPICLENGTH sits
    record_end = pos + sizes
    # Usual case, one gather: TOPICLENGTH, TOPIC and PROPERTIESLENGTH of the queue's topic.
    tail_dtype = _tail_dtype(len(topic))
    own = False
    if len(topic) and (body_end + tail_dtype.itemsize <= record_end).all():
        tail_view = np.ndarray(shape=(f.size - tail_dtype.itemsize + 1,),
                               dtype=f"V{tail_dtype.itemsize}", buffer=mm, strides=(1,))
        tail = tail_view[body_end].view(tail_dtype)
        own = bool(((tail["topic_length"] == len(topic)) & (tail["topic"] == topic)).all())
    if own:
        topic_len[:] = len(topic)
        props_len = tail["properties_length"].astype(np.int64)
        props_start = body_end + tail_dtype.itemsize
    else:
        u8 = np.frombuffer(mm, dtype=np.uint8)
        topic_len[:] = u8[body_end]
        props_start = body_end + _TOPIC_LENGTH_SIZE + topic_len + _PROPERTIES_LENGTH_SIZE
        props_len = np.full(len(pos), -1, dtype=np.int64)
        inside = props_start <= record_end
        props_len[inside] = ((u8[props_start[inside] - 2].astype(np.int64) << 8)
                             | u8[props_start[inside] - 1])
    bad = props_start + props_len != record_end
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordError(f.path, int(phys[i]),
                                 f"length fields do not add up to the record size {int(sizes[i])}")
    return own


_TAIL_DTYPES: dict[int, np.dtype] = {}


def _tail_dtype(topic_length: int) -> np.dtype:
    """TOPICLENGTH, TOPIC and PROPERTIESLENGTH of a record whose topic has that length."""
    dtype = _TAIL_DTYPES.get(topic_length)
    if dtype is None:
        dtype = _TAIL_DTYPES[topic_length] = np.dtype([
            ("topic_length", "u1"), ("topic", f"S{max(topic_length, 1)}"),
            ("properties_length", ">i2")])
    return dtype


def _cut(mm, first: int, stop: int, ranges) -> list[pa.Array]:
    """Copy byte ranges of every record out of a segment into ``BinaryArray`` s.

    ``ranges`` holds ``(starts, ends)`` pairs of segment positions, in record order.  One
    ``BinaryArray`` over the bytes ``[first, stop)`` gets offsets ``s0, e0, s1, e1, ...`` for
    every record in turn, so its elements alternate between wanted ranges and the bytes
    between them; one ``take`` per range copies the wanted elements (in C++).  Records of a
    queue are in CommitLog order, so the offsets never decrease; a segment is under 2 GiB
    (StoreConfig), so they fit int32.
    """
    first = int(first)
    n = len(ranges[0][0])
    width = 2 * len(ranges)
    offsets = np.empty((n, width), dtype=np.int32)
    for k, (starts, ends) in enumerate(ranges):
        offsets[:, 2 * k] = starts - first
        offsets[:, 2 * k + 1] = ends - first
    data = pa.py_buffer(mm).slice(first, int(stop) - first)
    cycled = pa.BinaryArray.from_buffers(pa.binary(), n * width - 1,
                                         [None, pa.py_buffer(offsets), data])
    index = np.arange(0, n * width, width, dtype=np.int32)
    return [cycled.take(arrow_of(index + 2 * k)) for k in range(len(ranges))]


def _repeat_string(value: bytes, n: int) -> pa.Array:
    """A string column holding ``value`` ``n`` times (built without a per-row loop)."""
    offsets = np.arange(0, (n + 1) * len(value), len(value) or 1, dtype=np.int32)
    if not value:
        offsets[:] = 0
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(value * n))


# --------------------------------------------------------------------------- columns


def _columns(header, phys, queue_offsets, body, topic_arr, props_bin) -> list[pa.Array]:
    """The 14 columns of :data:`MESSAGE_SCHEMA` for one block of records."""
    n = len(phys)
    props = props_bin.view(pa.string())
    try:
        props.validate(full=True)
    except pa.ArrowInvalid:
        # Not UTF-8 (damaged or foreign data): decode as record_view does, replacing errors.
        props = string_array(b.decode("utf-8", errors="replace") for b in props_bin.to_pylist())
    pairs, row, code, map_offsets, user_index = parse_properties(props)
    # Per special name, the pair holding its value in each row (-1: none).  Later pairs
    # overwrite earlier ones, as dict() does in decode_properties.
    special = np.flatnonzero((code >= 0) & (code < len(SPECIAL_NAMES)))
    index = np.full((len(SPECIAL_NAMES), n), -1, dtype=np.int32)
    index.reshape(-1)[code[special] * n + row[special]] = special * 4 + 2
    is_commit = (header["sys_flag"] & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE
    if (index[TRANSACTION] >= 0).any():
        index[TRANSACTION, ~is_commit] = -1
    keys_rows = np.flatnonzero(index[KEYS] >= 0)
    # One take copies every value the columns need: the special columns (null where absent),
    # the KEYS values of the rows having one, then the user map's names and values.
    present = [c for c in (UNIQ, TAGS, DELIVER, TRANSACTION) if (index[c] >= 0).any()]
    wanted = np.concatenate([*(index[c] for c in present), index[KEYS, keys_rows],
                             user_index, user_index + 2])
    missing = wanted < 0
    values = pairs.take(arrow_of(wanted, ~missing if missing.any() else None))
    special_columns = {c: values.slice(i * n, n) for i, c in enumerate(present)}
    at = len(present) * n
    keys_values = values.slice(at, len(keys_rows))
    at += len(keys_rows)
    properties = pa.MapArray.from_arrays(
        arrow_of(map_offsets), values.slice(at, len(user_index)),
        values.slice(at + len(user_index), len(user_index)), type=_PROPERTIES_TYPE)

    def special_column(c: int) -> pa.Array:
        column = special_columns.get(c)
        return pa.nulls(n, pa.string()) if column is None else column

    msg_id = special_column(UNIQ)
    if msg_id.null_count:
        msg_id = msg_id.fill_null("")
    deliver = special_columns.get(DELIVER)
    deliver_us = pa.nulls(n, _TIMESTAMP) if deliver is None else _deliver_us(deliver, phys)
    return [
        topic_arr,
        arrow_of(header["queue_id"]),
        arrow_of(queue_offsets),
        arrow_of(phys),
        msg_id,
        special_column(TAGS),
        split_keys(keys_values, keys_rows, n),
        body,
        properties,
        _timestamps(header["born_timestamp"]),
        _timestamps(header["store_timestamp"]),
        deliver_us,
        special_column(TRANSACTION),
        arrow_of(header["reconsume_times"]),
    ]


def _deliver_us(deliver: pa.Array, phys: np.ndarray) -> pa.Array:
    """``__RMQ_DELIVER_MS`` values (decimal ms) as µs timestamps."""
    try:
        ms = deliver.cast(pa.int64())
    except pa.ArrowInvalid:
        bad = next(i for i, v in enumerate(deliver.to_pylist()) if v is not None
                   and not v.strip().lstrip("+-").isdigit())
        raise CorruptRecordError("commitlog", int(phys[bad]), f"property {PROPERTY_DELIVER_MS}="
                                 f"{deliver[bad].as_py()!r}; allowed: epoch ms") from None
    return pc.multiply(ms, 1000).cast(_TIMESTAMP)


def _timestamps(us: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(_TIMESTAMP, len(us), [None, pa.py_buffer(us)])
