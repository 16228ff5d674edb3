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
4. Properties (``name 0x01 value 0x02 ...``) are parsed with NumPy on separator positions,
   following RocketMQ's rule (a pair needs a non-empty name and a non-empty value; the text
   after the first 0x01 is the value; a trailing 0x02 may be missing).  ``UNIQ_KEY``,
   ``TAGS`` and ``KEYS`` are recognised by comparing machine words; other names are looked
   up with ``index_in`` to route ``__RMQ_DELIVER_MS`` and ``__transactionId__`` to their
   columns and to drop every other system name from the map.  One ``take`` then copies all
   values the string columns and the map need.

Column semantics equal :func:`store.message_store.record_view`.  When a message repeats a
property name, its scalar columns take the last value (as ``dict`` does) but the map keeps
both entries; the store never writes such records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import (FIXED_SIZE, HEADER_DTYPE, HEADER_SIZE, MESSAGE_MAGIC_CODE_V1,
                    PROPERTIES_LENGTH, TOPIC_LENGTH, TRANSACTION_COMMIT_TYPE,
                    TRANSACTION_TYPE_MASK)
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
#: Bytes of records scanned per step: what the header and tail passes find in L2 cache.
_SCAN_BYTES = 1 << 19

# Property names with a column of their own come first among the system names, so codes
# 0..4 route them to their columns; any other code is a hidden system property.
_SPECIAL_NAMES = (PROPERTY_UNIQ_KEY, PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_DELIVER_MS,
                  PROPERTY_TRANSACTION_ID)
_UNIQ, _TAGS, _KEYS, _DELIVER, _TRANSACTION = range(len(_SPECIAL_NAMES))
_NAME_LOOKUP = pa.array([*_SPECIAL_NAMES,
                         *sorted(SYSTEM_PROPERTY_NAMES - set(_SPECIAL_NAMES))], pa.string())
# The three names every message may carry, as little-endian machine words.
_WORD_UNIQ = int.from_bytes(PROPERTY_UNIQ_KEY.encode("ascii"), "little")  # 8 bytes
_WORD_TAGS = int.from_bytes(PROPERTY_TAGS.encode("ascii"), "little")  # 4 bytes
_WORD_KEYS = int.from_bytes(PROPERTY_KEYS.encode("ascii"), "little")  # 4 bytes
assert len(PROPERTY_UNIQ_KEY) == 8 and len(PROPERTY_TAGS) == len(PROPERTY_KEYS) == 4

# Header fields the columns use, in native byte order (filled step by step).
_FIELDS_DTYPE = np.dtype([("queue_id", np.int32), ("sys_flag", np.int32),
                          ("born_timestamp", np.int64), ("store_timestamp", np.int64),
                          ("reconsume_times", np.int32)])
_HEADER_VOID = np.dtype(f"V{HEADER_SIZE}")
_TOPIC_LENGTH_SIZE = TOPIC_LENGTH.size
_PROPERTIES_LENGTH_SIZE = PROPERTIES_LENGTH.size


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
        # is_in gives False (not null) for a row without a tag
        exact = pc.is_in(batch.column("tags"), value_set=pa.array(tag_set, pa.string()))
        if not pc.all(exact).as_py():
            batch = batch.filter(exact)
    return batch


# --------------------------------------------------------------------------- records


def _decode(store: "MessageStore", topic: str, queue_id: int, entries: np.ndarray,
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
    fields = np.empty(n, dtype=_FIELDS_DTYPE)
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # one step per CommitLog segment
        f = store.commit_log.files.find(int(phys[lo]))
        if f is None:
            raise OffsetOutOfRangeError(
                f"queue offset {int(queue_offsets[lo])} of {topic}/{queue_id} points at "
                f"CommitLog offset {int(phys[lo])}, which is no longer stored (removed by "
                "retention); allowed: from the queue's min_offset on")
        parts.append(_read_segment(f, phys[lo:hi], sizes[lo:hi], topic_bytes, fields[lo:hi]))
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


def _read_segment(f, phys: np.ndarray, sizes: np.ndarray, topic: bytes, fields: np.ndarray):
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
    mm = f.buffer()
    k = len(pos)
    body_end = np.empty(k, dtype=np.int64)
    topic_len = np.empty(k, dtype=np.int64)
    span = int(record_end[-1] - pos[0])
    steps = np.searchsorted(pos, pos[0] + np.arange(_SCAN_BYTES, span, _SCAN_BYTES))
    bounds = [0, *sorted(set(steps.tolist()) - {0, k}), k]
    own = True
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        own &= _scan(f, mm, pos[lo:hi], sizes[lo:hi], phys[lo:hi], topic, fields[lo:hi],
                     body_end[lo:hi], topic_len[lo:hi])
    topic_start = body_end + _TOPIC_LENGTH_SIZE
    props_start = topic_start + topic_len + _PROPERTIES_LENGTH_SIZE
    if own:
        body, props = _cut(mm, pos[0], record_end[-1], [(pos + HEADER_SIZE, body_end),
                                                        (props_start, record_end)])
        return body, None, props
    body, topic_arr, props = _cut(mm, pos[0], record_end[-1], [
        (pos + HEADER_SIZE, body_end), (topic_start, topic_start + topic_len),
        (props_start, record_end)])
    return body, topic_arr.cast(pa.string()), props


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
    for name in _FIELDS_DTYPE.names:
        fields[name] = header[name]
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
    props = props_bin.view(pa.string())
    try:
        props.validate(full=True)
    except pa.ArrowInvalid:
        # Not UTF-8 (damaged or foreign data): decode as record_view does, replacing errors.
        props = pa.array([b.decode("utf-8", errors="replace") for b in props_bin.to_pylist()],
                         pa.string())
    pairs, row, code, map_offsets, user_index = _parse_properties(props)
    # Per special name, the pair holding its value in each row (-1: none).  Later pairs
    # overwrite earlier ones, as dict() does in decode_properties.
    special = np.flatnonzero(code >= 0)
    special = special[code[special] < len(_SPECIAL_NAMES)]
    index = np.full((len(_SPECIAL_NAMES), n), -1, dtype=np.int32)
    index[code[special], row[special]] = special * 4 + 2
    is_commit = (header["sys_flag"] & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE
    index[_TRANSACTION, ~is_commit] = -1
    keys_rows = np.flatnonzero(index[_KEYS] >= 0)
    # One take copies every value the columns need: the special columns (null where absent),
    # the KEYS values of the rows having one, then the user map's names and values.
    present = [c for c in (_UNIQ, _TAGS, _DELIVER, _TRANSACTION) if (index[c] >= 0).any()]
    wanted = np.concatenate([*(index[c] for c in present), index[_KEYS, keys_rows],
                             user_index, user_index + 2])
    missing = wanted < 0
    values = pairs.take(pa.array(wanted, mask=missing if missing.any() else None))
    special_columns = {c: values.slice(i * n, n) for i, c in enumerate(present)}
    at = len(present) * n
    keys_values = values.slice(at, len(keys_rows))
    at += len(keys_rows)
    properties = pa.MapArray.from_arrays(
        pa.array(map_offsets), values.slice(at, len(user_index)),
        values.slice(at + len(user_index), len(user_index)), type=_PROPERTIES_TYPE)

    def special_column(c: int) -> pa.Array:
        column = special_columns.get(c)
        return pa.nulls(n, pa.string()) if column is None else column

    msg_id = special_column(_UNIQ)
    if msg_id.null_count:
        msg_id = msg_id.fill_null("")
    deliver = special_columns.get(_DELIVER)
    deliver_us = (pa.nulls(n, _TIMESTAMP) if deliver is None
                  else pc.multiply(deliver.cast(pa.int64()), 1000).cast(_TIMESTAMP))
    return [
        topic_arr,
        pa.array(header["queue_id"].astype(np.int32)),
        pa.array(np.ascontiguousarray(queue_offsets, dtype=np.int64)),
        pa.array(phys),
        msg_id,
        special_column(_TAGS),
        _split_keys(keys_values, keys_rows, n),
        body,
        properties,
        _timestamps(header["born_timestamp"]),
        _timestamps(header["store_timestamp"]),
        deliver_us,
        special_column(_TRANSACTION),
        pa.array(header["reconsume_times"].astype(np.int32)),
    ]


def _timestamps(ms: np.ndarray) -> pa.Array:
    us = ms.astype(np.int64) * 1000
    return pa.Array.from_buffers(_TIMESTAMP, len(us), [None, pa.py_buffer(us)])


def _parse_properties(props: pa.Array):
    """Split ``name 0x01 value 0x02 ...`` of every row with RocketMQ's rule (reference §1.6).

    A row's text is split on 0x02 (a trailing 0x02 may be missing); a segment is a pair when
    its first 0x01 is neither its first nor its last character; the name is what precedes it
    and the value everything after it.

    Returns
    -------
    pairs : pyarrow.StringArray
        Elements name, 0x01, value, gap, name, ... : pair ``k``'s name at ``4k``, value at
        ``4k + 2``.
    row : ndarray
        The row of each pair.
    code : ndarray
        Index of each pair's name in ``_NAME_LOOKUP``; -1 for user names.
    map_offsets, user_index : ndarray
        Offsets of each row's user pairs, and the names' indices in ``pairs``.
    """
    n = len(props)
    _, offsets_buf, data_buf = props.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=props.offset * 4)
    base, stop = int(offsets[0]), int(offsets[-1])
    if stop == base:  # no row has properties
        return (pa.array([], pa.string()), np.empty(0, np.int32), np.empty(0, np.int32),
                np.zeros(n + 1, np.int32), np.empty(0, np.int32))
    data_buf = data_buf.slice(base, stop - base)
    data = np.frombuffer(data_buf, dtype=np.uint8)
    offsets = offsets - base  # int32 positions into data
    sep = np.flatnonzero(data < 3)
    kind = data[sep]
    # The store writes every pair as name 0x01 value 0x02: separators alternate 1, 2, 1, 2
    # and every non-empty row ends in 0x02.  Then pair k is (sep[2k-1], sep[2k+1]).
    empty_or_closed = (data[offsets[1:] - 1] == 2) | (offsets[1:] == offsets[:-1])
    regular = (len(sep) % 2 == 0 and (kind.view("<u2") == 0x0201).all()
               and empty_or_closed.all())
    if regular:
        ends = sep[1::2]
        row_first_segment = np.searchsorted(ends, offsets, side="left")
        # every name and value non-empty: separators at least 2 apart, the first past 0
    if regular and sep[0] >= 1 and (np.diff(sep) >= 2).all():
        # offsets 0, sep0, sep0 + 1, sep1, sep1 + 1, ...: name, 0x01, value, 0x02, name, ...
        pair_offsets = np.empty(2 * len(sep) + 1, dtype=np.int32)
        pair_offsets[0] = 0
        pair_offsets[1::2] = sep
        pair_offsets[2::2] = sep + 1
        row_first_pair = row_first_segment
    else:
        if regular:
            split_at = sep[0::2]
            starts = np.zeros(len(ends), dtype=np.int64)
            starts[1:] = ends[:-1] + 1
        else:
            starts, split_at, ends, row_first_segment = _segments(data, offsets, sep, kind)
        valid = (split_at > starts) & (split_at < ends - 1)
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
    name_start = pair_offsets[0:4 * n_pairs:4]
    code = _name_codes(data, pairs, name_start, pair_offsets[1:4 * n_pairs:4] - name_start)
    user = code < 0
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    if user.any():
        np.cumsum(np.bincount(row[user], minlength=n), out=map_offsets[1:])
    return pairs, row, code, map_offsets, np.flatnonzero(user).astype(np.int32) * 4


def _name_codes(data: np.ndarray, pairs: pa.Array, start: np.ndarray,
                length: np.ndarray) -> np.ndarray:
    """Index in ``_NAME_LOOKUP`` of each pair's name (``data[start:start + length]``), or -1.

    ``UNIQ_KEY``, ``TAGS`` and ``KEYS`` (in nearly every message) are recognised by one
    unaligned 8-byte gather and a word comparison; only the other names go to ``index_in``.
    """
    code = np.full(len(start), -1, dtype=np.int32)
    if len(start) == 0:
        return code
    if len(data) < 8:
        data = np.concatenate([data, np.zeros(8, np.uint8)])
    words = np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    at = np.minimum(start, len(data) - 8)
    word = words[at]
    late = at != start  # a name in the last 8 bytes: its word starts earlier
    if late.any():
        word[late] >>= ((start - at)[late] * 8).astype(np.uint64)
    low = word & np.uint64(0xFFFFFFFF)
    code[(length == 8) & (word == np.uint64(_WORD_UNIQ))] = _UNIQ
    four = length == 4
    code[four & (low == _WORD_TAGS)] = _TAGS
    code[four & (low == _WORD_KEYS)] = _KEYS
    rest = np.flatnonzero(code < 0)
    if len(rest):
        found = pc.index_in(pairs.take(pa.array(rest.astype(np.int32) * 4)),
                            value_set=_NAME_LOOKUP)
        if found.null_count < len(found):
            code[rest] = found.fill_null(-1).to_numpy()
    return code


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


def _split_keys(values: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """The ``keys`` column from ``values``, the KEYS of ``rows``: split on spaces, empty
    pieces dropped; a row without KEYS gets ``[]``."""
    counts = np.zeros(n, dtype=np.int32)
    _, offsets_buf, data_buf = values.buffers()
    if len(values):
        offsets = np.frombuffer(offsets_buf, np.int32, count=len(values) + 1,
                                offset=values.offset * 4)
        data = np.frombuffer(data_buf, np.uint8)[offsets[0]:offsets[-1]]
    else:
        data = np.empty(0, np.uint8)
    if not (data == 0x20).any():  # one key per row (the usual case): no split needed
        counts[rows] = 1
    else:
        pieces = pc.split_pattern(values, " ")
        flat = pc.list_flatten(pieces)
        parent = pc.list_parent_indices(pieces).to_numpy()
        nonempty = pc.greater(pc.binary_length(flat), 0).to_numpy(zero_copy_only=False)
        counts = np.bincount(rows[parent[nonempty]], minlength=n).astype(np.int32)
        values = flat.filter(pa.array(nonempty))
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    return pa.ListArray.from_arrays(pa.array(list_offsets), values, type=_KEYS_TYPE)
