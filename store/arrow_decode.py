"""Vectorised decoding of a queue range into a ``pyarrow.RecordBatch`` (the Spark rows).

Reads CommitLog records (layout: :mod:`store.codec`) through their ConsumeQueue entries
without a per-message Python loop:

1. ConsumeQueue entries ``[start, end)`` arrive as one NumPy array (offset, size, tagsCode);
   a tag filter first drops entries by tagsCode (Java hash) before any record is touched.
2. Entries are grouped by CommitLog segment.  Per segment, the 88-byte fixed headers are
   gathered in one NumPy fancy-index over a stride-1 ``V88`` view of the segment's ``mmap``
   and reinterpreted as :data:`store.codec.HEADER_DTYPE` (big-endian).
3. Body, topic and properties are cut out by Arrow: one ``BinaryArray`` over the segment
   bytes whose offsets walk ``body, topic-length, topic, properties-length, properties, gap``
   for every record, so ``take`` of every sixth element copies the bodies (in C++).
4. Properties (``name 0x01 value 0x02 ...``) are parsed with NumPy on separator positions,
   following RocketMQ's rule (a pair needs a non-empty name and a non-empty value; the text
   after the first 0x01 is the value; a trailing 0x02 may be missing).  Pair names are looked
   up once (``index_in``) to route ``UNIQ_KEY``, ``TAGS``, ``KEYS``, ``__RMQ_DELIVER_MS`` and
   ``__transactionId__`` to their columns; every other system name is dropped from the map.

Column semantics equal :func:`store.message_store.record_view`.  When a message repeats a
property name, its scalar columns take the last value (as ``dict`` does) but the map keeps
both entries; the store never writes such records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import (FIXED_SIZE, HEADER_DTYPE, HEADER_SIZE,
                    MESSAGE_MAGIC_CODE_V1, PROPERTIES_LENGTH, TOPIC_LENGTH,
                    TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK)
from .errors import CorruptRecordError, OffsetOutOfRangeError
from .message import (PROPERTY_DELIVER_MS, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_TRANSACTION_ID,
                      PROPERTY_UNIQ_KEY, SYSTEM_PROPERTY_NAMES, java_string_hash)

if TYPE_CHECKING:  # pragma: no cover
    from .message_store import MessageStore

__all__ = ["MESSAGE_SCHEMA", "MESSAGE_SPARK_DDL", "empty_batch", "read_queue_batch"]

#: The Spark schema of the ``messages`` view (one source of truth for ``rmq_source``).
MESSAGE_SPARK_DDL = (
    "topic string, queue_id int, queue_offset bigint, commitlog_offset bigint, msg_id string, "
    "tags string, keys array<string>, body binary, properties map<string,string>, "
    "born_timestamp timestamp, store_timestamp timestamp, deliver_timestamp timestamp, "
    "transaction_id string, reconsume_times int"
)

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_KEYS_TYPE = pa.list_(pa.field("element", pa.string()))
_PROPERTIES_TYPE = pa.map_(pa.field("key", pa.string(), nullable=False),
                           pa.field("value", pa.string()))

#: Exactly ``pyspark.sql.pandas.types.to_arrow_schema(<MESSAGE_SPARK_DDL>, timezone="UTC")``
#: (tests/spark/test_arrow_schema.py checks it); hard-coded so ``store`` never imports Spark.
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
_FILLER_SIZE = 0x7FFFFFFF

# Property names with a column of their own come first in the lookup set, so ``index_in``
# codes 0..4 route them; any other code is a hidden system property.
_SPECIAL_NAMES = (PROPERTY_UNIQ_KEY, PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_DELIVER_MS,
                  PROPERTY_TRANSACTION_ID)
_UNIQ, _TAGS, _KEYS, _DELIVER, _TRANSACTION = range(len(_SPECIAL_NAMES))
_NAME_LOOKUP = pa.array(list(_SPECIAL_NAMES)
                        + sorted(SYSTEM_PROPERTY_NAMES - set(_SPECIAL_NAMES)), pa.string())

# Byte offsets inside a record after the body: topic length (u8), then properties length (i16).
_TOPIC_LENGTH_SIZE = TOPIC_LENGTH.size
_PROPERTIES_LENGTH_SIZE = PROPERTIES_LENGTH.size
_HEADER_VOID = np.dtype(f"V{HEADER_SIZE}")
#: Records decoded per step (see _decode): about what stays in a core's L2 cache.
_BLOCK_BYTES = 1 << 20


def empty_batch() -> pa.RecordBatch:
    """A batch with :data:`MESSAGE_SCHEMA` and no rows."""
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in MESSAGE_SCHEMA],
                                      schema=MESSAGE_SCHEMA)


def read_queue_batch(store: "MessageStore", topic: str, queue_id: int, start: int, end: int,
                     tags: Iterable[str] | None = None) -> pa.RecordBatch:
    """Decode the messages at queue offsets ``[start, end)`` of one queue.

    Parameters
    ----------
    store : MessageStore
        An open store.
    topic, queue_id :
        The queue.
    start, end : int
        Queue offsets; the caller guarantees ``end <= store.max_offset(topic, queue_id)``.
    tags : iterable of str, optional
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
    """
    start, end = int(start), int(end)
    if start < 0 or end < start:
        raise OffsetOutOfRangeError(
            f"queue offsets [{start}, {end}) of {topic}/{queue_id}; allowed: 0 <= start <= end")
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
    keep = entries["size"] != _FILLER_SIZE
    if tag_set is not None:
        codes = np.array([java_string_hash(t) if t else 0 for t in tag_set], np.int64)
        keep &= np.isin(entries["tags_code"], codes)
    if not keep.all():
        entries, queue_offsets = entries[keep], queue_offsets[keep]
        if len(entries) == 0:
            return empty_batch()
    batch = _decode(store, topic, queue_id, entries, queue_offsets)
    if tag_set is not None:
        exact = pc.is_in(batch.column("tags"), value_set=pa.array(tag_set, pa.string()))
        exact = pc.fill_null(exact, False)
        if not pc.all(exact).as_py():
            batch = batch.filter(exact)
    return batch


# --------------------------------------------------------------------------- records


def _decode(store: "MessageStore", topic: str, queue_id: int, entries: np.ndarray,
            queue_offsets: np.ndarray) -> pa.RecordBatch:
    """Decode entries block by block and join the blocks' columns."""
    phys = np.ascontiguousarray(entries["offset"], dtype=np.int64)
    sizes = entries["size"].astype(np.int64)
    file_size = store.commit_log.file_size
    n = len(phys)
    # Blocks never span two segments (entries are in CommitLog order, so segment starts cut
    # them) and hold about _BLOCK_BYTES of records: each step below then reads bytes that
    # the previous one left in the CPU cache, which doubles the speed of large ranges.
    first, last = int(phys[0]) // file_size, int(phys[-1]) // file_size
    cuts = np.searchsorted(phys, np.arange(first + 1, last + 1, dtype=np.int64) * file_size)
    span = int(phys[-1] + sizes[-1] - phys[0])
    if span > _BLOCK_BYTES:
        cuts = np.concatenate([cuts, np.searchsorted(
            phys, phys[0] + np.arange(_BLOCK_BYTES, span, _BLOCK_BYTES, dtype=np.int64))])
    bounds = [0, *sorted(set(cuts.tolist()) - {0, n}), n]
    topic_bytes = topic.encode("utf-8")
    blocks = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        f = store.commit_log.files.find(int(phys[lo]))
        if f is None:
            raise OffsetOutOfRangeError(
                f"queue offset {int(queue_offsets[lo])} of {topic}/{queue_id} points at "
                f"CommitLog offset {int(phys[lo])}, which is no longer stored (removed by "
                "retention); allowed: from the queue's min_offset on")
        header, body, topic_arr, props = _decode_segment(f, phys[lo:hi], sizes[lo:hi],
                                                         topic_bytes)
        blocks.append(_columns(header, phys[lo:hi], queue_offsets[lo:hi], body, topic_arr,
                               props))
    columns = blocks[0] if len(blocks) == 1 else [pa.concat_arrays(c) for c in zip(*blocks)]
    return pa.RecordBatch.from_arrays(columns, schema=MESSAGE_SCHEMA)


def _decode_segment(f, phys: np.ndarray, sizes: np.ndarray, topic: bytes):
    """Decode records of one segment: header (structured NumPy), body, topic, properties.

    The topic comes back as a string column; when every record holds exactly ``topic`` (the
    queue's own) it is built without copying bytes per row.
    """
    pos = phys - f.start
    bad = (pos < 0) | (pos + sizes > f.size) | (sizes < FIXED_SIZE)
    bad[1:] |= pos[1:] < pos[:-1] + sizes[:-1]  # records overlap or are out of order
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordError(f.path, int(phys[i]), f"ConsumeQueue entry of size "
                                 f"{int(sizes[i])} overlaps another or leaves segment "
                                 f"{f.start}..{f.end}")
    mm = f.buffer()
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
    body_end = pos + HEADER_SIZE + body_len  # where TOPICLENGTH sits
    record_end = pos + sizes
    # Usual case, one gather: TOPICLENGTH, TOPIC and PROPERTIESLENGTH of the queue's topic.
    tail_dtype = _tail_dtype(len(topic))
    tail = None
    if len(topic) and (body_end + tail_dtype.itemsize <= record_end).all():
        tail_view = np.ndarray(shape=(f.size - tail_dtype.itemsize + 1,),
                               dtype=f"V{tail_dtype.itemsize}", buffer=mm, strides=(1,))
        tail = tail_view[body_end].view(tail_dtype)
        if not ((tail["topic_length"] == len(topic))
                & (tail["topic"] == topic)).all():
            tail = None
    if tail is not None:
        props_start = body_end + tail_dtype.itemsize
        props_len = tail["properties_length"].astype(np.int64)
        topic_len = None
    else:
        u8 = np.frombuffer(mm, dtype=np.uint8)
        topic_len = u8[body_end].astype(np.int64)
        props_start = body_end + _TOPIC_LENGTH_SIZE + topic_len + _PROPERTIES_LENGTH_SIZE
        props_len = np.zeros(len(pos), dtype=np.int64)
        inside = props_start <= record_end
        props_len[inside] = ((u8[props_start[inside] - 2].astype(np.int64) << 8)
                             | u8[props_start[inside] - 1])
    bad = props_start + props_len != record_end
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordError(f.path, int(phys[i]),
                                 f"length fields do not add up to the record size {int(sizes[i])}")
    if topic_len is None:
        body, props = _cut(mm, pos[0], record_end[-1], [(pos + HEADER_SIZE, body_end),
                                                        (props_start, record_end)])
        topic_arr = _repeat_string(topic, len(pos))
    else:
        topic_start = body_end + _TOPIC_LENGTH_SIZE
        body, topic_arr, props = _cut(mm, pos[0], record_end[-1], [
            (pos + HEADER_SIZE, body_end), (topic_start, topic_start + topic_len),
            (props_start, record_end)])
        topic_arr = topic_arr.cast(pa.string())
    return header, body, topic_arr, props


def _tail_dtype(topic_length: int) -> np.dtype:
    """TOPICLENGTH, TOPIC and PROPERTIESLENGTH of a record whose topic has that length."""
    return np.dtype([("topic_length", "u1"), ("topic", f"S{max(topic_length, 1)}"),
                     ("properties_length", ">i2")])


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
    return [cycled.take(pa.array(index + 2 * k)) for k in range(len(ranges))]


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
    try:
        props = props_bin.cast(pa.string())
    except pa.ArrowInvalid:
        # Not UTF-8 (damaged or foreign data): decode as record_view does, replacing errors.
        props = pa.array([b.decode("utf-8", errors="replace") for b in props_bin.to_pylist()],
                         pa.string())
    parsed = _parse_properties(props)
    sys_flag = header["sys_flag"]
    is_commit = (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE
    msg_id = parsed.column(_UNIQ)
    if msg_id.null_count:
        msg_id = msg_id.fill_null("")
    deliver = parsed.column(_DELIVER)
    deliver_us = (pc.multiply(deliver.cast(pa.int64()), 1000).cast(_TIMESTAMP)
                  if deliver.null_count < n else pa.nulls(n, _TIMESTAMP))
    columns = [
        topic_arr,
        pa.array(header["queue_id"].astype(np.int32)),
        pa.array(np.ascontiguousarray(queue_offsets, dtype=np.int64)),
        pa.array(phys),
        msg_id,
        parsed.column(_TAGS),
        _split_keys(parsed.column(_KEYS)),
        body,
        parsed.properties,
        _timestamps(header["born_timestamp"]),
        _timestamps(header["store_timestamp"]),
        deliver_us,
        parsed.column(_TRANSACTION, only=is_commit),
        pa.array(header["reconsume_times"].astype(np.int32)),
    ]
    return columns


def _timestamps(ms: np.ndarray) -> pa.Array:
    us = ms.astype(np.int64) * 1000
    return pa.Array.from_buffers(_TIMESTAMP, len(us), [None, pa.py_buffer(us)])


class _Properties:
    """Parsed pairs of every row: the user map and per-row lookups of special names."""

    def __init__(self, n: int, pairs: pa.Array, row: np.ndarray, code: np.ndarray,
                 properties: pa.Array) -> None:
        self.n = n
        self.pairs = pairs  # name, 0x01, value, gap, name, ... (value k at 4k + 2)
        self.row = row  # row of each pair
        self.code = code  # index in _NAME_LOOKUP, -1 for user names
        self.properties = properties
        self._special = np.flatnonzero((code >= 0) & (code < len(_SPECIAL_NAMES)))

    def column(self, code: int, only: np.ndarray | None = None) -> pa.Array:
        """The value of the pair named ``_SPECIAL_NAMES[code]`` per row (null where none)."""
        which = self._special[self.code[self._special] == code]
        if len(which) == 0:
            return pa.nulls(self.n, pa.string())
        index = np.full(self.n, -1, dtype=np.int32)
        # a repeated name keeps its last value, as dict() does in decode_properties
        index[self.row[which]] = (which * 4 + 2).astype(np.int32)
        if only is not None:
            index[~only] = -1
        missing = index < 0
        return self.pairs.take(pa.array(index, mask=missing if missing.any() else None))


def _parse_properties(props: pa.Array) -> _Properties:
    """Split ``name 0x01 value 0x02 ...`` of every row with RocketMQ's rule (reference §1.6).

    A row's text is split on 0x02 (a trailing 0x02 may be missing); a segment is a pair when
    its first 0x01 is neither its first nor its last character; the name is what precedes it
    and the value everything after it.
    """
    n = len(props)
    _, offsets_buf, data_buf = props.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=props.offset * 4)
    base, stop = int(offsets[0]), int(offsets[-1])
    data_buf = data_buf.slice(base, stop - base) if data_buf is not None else pa.py_buffer(b"")
    data = np.frombuffer(data_buf, dtype=np.uint8)
    offsets = offsets - base  # now int32 positions into data
    sep = np.flatnonzero(data < 3)
    kind = data[sep]
    ends = sep[1::2]
    # The store writes every pair as name 0x01 value 0x02: separators alternate 1, 2, 1, 2
    # and every non-empty row ends in 0x02.  Then segment k is (sep[2k-1], sep[2k+1]).
    lengths = np.diff(offsets)
    regular = (len(sep) % 2 == 0 and (kind[0::2] == 1).all() and (kind[1::2] == 2).all()
               and (data[offsets[1:][lengths > 0] - 1] == 2).all())
    if regular:
        split_at = sep[0::2]
        starts = np.empty(len(ends), dtype=np.int64)
        starts[:1] = 0
        starts[1:] = ends[:-1] + 1
        row_first_segment = np.searchsorted(ends, offsets, side="left")
    else:
        starts, split_at, ends, row_first_segment = _segments(data, offsets, sep, kind)
    valid = (split_at > starts) & (split_at < ends - 1)
    if regular and valid.all():
        # offsets 0, sep0, sep0 + 1, sep1, sep1 + 1, ...: name, 0x01, value, 0x02, name, ...
        pair_offsets = np.empty(2 * len(sep) + 1, dtype=np.int32)
        pair_offsets[0] = 0
        pair_offsets[1::2] = sep
        pair_offsets[2::2] = sep + 1
        row_first_pair = row_first_segment
    else:
        v = np.flatnonzero(valid)
        pair_offsets = np.empty(4 * len(v) + 1, dtype=np.int32)
        pair_offsets[0:-1:4] = starts[v]
        pair_offsets[1:-1:4] = split_at[v]
        pair_offsets[2:-1:4] = split_at[v] + 1
        pair_offsets[3:-1:4] = ends[v]
        pair_offsets[-1] = pair_offsets[-2] if len(v) else 0
        valid_before = np.zeros(len(valid) + 1, dtype=np.int64)
        np.cumsum(valid, out=valid_before[1:])
        row_first_pair = valid_before[row_first_segment]
    n_pairs = int(row_first_pair[-1])
    pairs = pa.StringArray.from_buffers(max(4 * n_pairs - 1, 0), pa.py_buffer(pair_offsets),
                                        data_buf)
    row = np.repeat(np.arange(n, dtype=np.int32), np.diff(row_first_pair))
    names_index = np.arange(0, 4 * n_pairs, 4, dtype=np.int32)
    names = pairs.take(pa.array(names_index))
    code = pc.index_in(names, value_set=_NAME_LOOKUP).fill_null(-1).to_numpy()
    user = code < 0
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(row[user], minlength=n), out=map_offsets[1:])
    user_index = names_index[user]
    properties = pa.MapArray.from_arrays(
        pa.array(map_offsets), pairs.take(pa.array(user_index)),
        pairs.take(pa.array(user_index + 2)), type=_PROPERTIES_TYPE)
    return _Properties(n, pairs, row, code, properties)


def _segments(data: np.ndarray, offsets: np.ndarray, sep: np.ndarray, kind: np.ndarray):
    """Segments of irregular property strings: ``(starts, first 0x01, ends, row firsts)``.

    Handles NUL bytes, missing trailing 0x02, several or no 0x01 in a segment.  A segment
    with no 0x01 gets -1, which the caller's rule rejects.
    """
    n = len(offsets) - 1
    keep = kind != 0
    sep, kind = sep[keep], kind[keep]
    lengths = np.diff(offsets)
    row_ends = offsets[1:].astype(np.int64)
    open_rows = np.flatnonzero((lengths > 0) & (data[np.maximum(row_ends - 1, 0)] != 2))
    # An open row's last segment ends at the row's end: a virtual end (kind 3) placed there,
    # before any separator at that same position (which belongs to the next row).
    p2 = sep[kind == 2]
    if len(open_rows):
        at = np.searchsorted(sep, row_ends[open_rows], side="left")
        sep = np.insert(sep, at, row_ends[open_rows])
        kind = np.insert(kind, at, 3)
    is_end = kind >= 2
    ends = sep[is_end]
    virtual = kind[is_end] == 3
    # segments before each row: real 0x02 before the row's start, plus earlier open rows
    row_first_segment = np.searchsorted(p2, offsets, side="left")
    if len(open_rows):
        opened = np.zeros(n + 1, dtype=np.int64)
        opened[open_rows + 1] = 1
        row_first_segment = row_first_segment + np.cumsum(opened)
    starts = np.zeros(len(ends), dtype=np.int64)
    starts[1:] = ends[:-1] + 1
    after_virtual = np.flatnonzero(virtual[:-1]) + 1
    if len(after_virtual):
        segment_row = np.repeat(np.arange(n), np.diff(row_first_segment))
        starts[after_virtual] = offsets[segment_row[after_virtual]]
    # first 0x01 of each segment: a 0x01 belongs to the segment of the ends seen before it
    ends_before = np.cumsum(is_end) - is_end
    ones = np.flatnonzero(~is_end)
    one_segment = ends_before[ones]
    first = np.ones(len(ones), dtype=bool)
    first[1:] = one_segment[1:] != one_segment[:-1]
    split_at = np.full(len(ends), -1, dtype=np.int64)
    split_at[one_segment[first]] = sep[ones[first]]
    return starts, split_at, ends, row_first_segment


def _split_keys(keys: pa.Array) -> pa.Array:
    """``KEYS`` values split on spaces, empty pieces dropped; a row without keys gets ``[]``."""
    n = len(keys)
    if keys.null_count == n:
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)),
                                        pa.array([], pa.string()), type=_KEYS_TYPE)
    _, offsets_buf, data_buf = keys.buffers()
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0)
    present = keys.is_valid().to_numpy(zero_copy_only=False)
    if not (data == 0x20).any():  # one key per row (the usual case): no split needed
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(present, out=offsets[1:])
        values = keys.filter(pa.array(present))
        return pa.ListArray.from_arrays(pa.array(offsets), values, type=_KEYS_TYPE)
    pieces = pc.split_pattern(keys, " ")
    flat = pc.list_flatten(pieces)
    parent = pc.list_parent_indices(pieces).to_numpy()
    nonempty = pc.greater(pc.binary_length(flat), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(parent[nonempty], minlength=n), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat.filter(pa.array(nonempty)),
                                    type=_KEYS_TYPE)
