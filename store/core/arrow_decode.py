"""Vectorised decoding of a queue range into a ``pyarrow.RecordBatch`` (the Spark rows).

Reads CommitLog records (layout: :mod:`store.formats.record_codec`) through their ConsumeQueue entries
without a per-message Python loop:

1. ConsumeQueue entries ``[start, end)`` arrive as one NumPy array (offset, size, tagsCode);
   a tag filter first drops entries by tagsCode (Java hash) before any record is touched.
2. Per CommitLog segment, in steps of about :data:`_SCAN_BYTES` (so that each pass finds the
   records still in the CPU cache), the 88-byte headers are gathered with one NumPy fancy
   index over a stride-1 ``V88`` view of the segment's ``mmap`` and read through
   :data:`store.formats.record_codec.HEADER_DTYPE` (big-endian); a second gather reads TOPICLENGTH, TOPIC
   and PROPERTIESLENGTH behind each body.  Every length is checked against the entry (and,
   asked to, each body against its CRC: :mod:`store.core.read_checks`).
3. Bodies and properties are cut out by Arrow: one ``BinaryArray`` over the segment bytes
   whose offsets walk ``body, gap, properties, gap`` for every record, so a ``take`` of every
   other element copies the bodies (in C++, one pass per segment).
4. Properties are split into pairs by :mod:`store.formats.arrow_properties` (RocketMQ's rule, on
   separator positions) and every name gets a code: ``UNIQ_KEY``, ``TAGS``, ``KEYS``,
   ``__RMQ_DELIVER_MS`` and ``__transactionId__`` route their values to their columns, other
   system names are dropped, the rest form the map.  One ``take`` copies every value the
   string columns and the map need.

Column semantics equal :func:`store.formats.message.record_view`.  A repeated property name: the
scalar columns take the last value (as ``dict`` does), the map keeps both (never written).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..formats.arrow_properties import (
    NAME_LOOKUP,
    arrow_of,
    string_array,
)
from ..formats.record_codec import (
    FIXED_SIZE,
    HEADER_SIZE,
    PROPERTIES_LENGTH,
    TOPIC_LENGTH,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    gather_headers,
)
from ..files.commit_log import CommitLog
from ..files.consume_queue import ENTRY_DTYPE, FILLER_SIZE, ConsumeQueue
from ..base.errors import CorruptRecordError, InvalidMessageError, OffsetOutOfRangeError
from ..formats.message import java_string_hash
from ..kernels.message_decode import (NameTable, check_records, gather_messages,
                                       select_entries)
from .message_columns import (
    MESSAGE_SCHEMA,
    PROPERTY_COLUMNS,
    columns,
    empty_batch,
    gathered_columns,
    projected_schema,
    property_columns,
    repeat_string,
)
from .read_checks import blank_holes, check_body_crcs, header_matches, intact_mask


class QueueSource(Protocol):
    """What decoding needs of a store: its CommitLog and its ConsumeQueues."""

    commit_log: CommitLog

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue: ...

__all__ = ["MESSAGE_SCHEMA", "empty_batch", "read_queue_batch"]

_SCAN_BYTES = 1 << 20
_NAME_TABLE = NameTable([name.encode("utf-8") for name in NAME_LOOKUP])

# Header fields the columns use, as the columns hold them (native order; times in µs).
_FIELD_TYPES = {"queue_id": np.int32, "sys_flag": np.int32, "born_timestamp": np.int64,
                "store_timestamp": np.int64, "reconsume_times": np.int32}
_TIME_FIELDS = ("born_timestamp", "store_timestamp")
_TOPIC_LENGTH_SIZE = TOPIC_LENGTH.size
_PROPERTIES_LENGTH_SIZE = PROPERTIES_LENGTH.size


_heap_kept = False


def keep_freed_heap() -> None:
    """Ask glibc, once per process, to keep freed memory for reuse instead of returning it.

    A decode makes a few MB of NumPy temporaries.  With glibc's default (dynamic) thresholds
    they are unmapped or trimmed on free and faulted back in, zero-filled, by the next call:
    measured at a fifth to a quarter of the decode time (1,000 to 3,400 page faults per
    50,000 rows).  Raising ``M_TRIM_THRESHOLD`` (256 MiB) and ``M_MMAP_THRESHOLD`` (32 MiB)
    removes them; the cost is that up to that much freed memory stays in the process.  Does
    nothing off Linux/glibc.  A process-wide setting, so reads never make it on their own:
    a process that mostly decodes (a Spark Python worker of the ``rmq`` source) opts in.
    """
    global _heap_kept
    if _heap_kept or not sys.platform.startswith("linux"):
        return
    _heap_kept = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc's maximum on 64-bit)


def read_queue_batch(store: QueueSource, topic: str, queue_id: int, start: int, end: int,
                     tags: Iterable[str] | None = None,
                     columns: Sequence[str] | None = None, *, verify_crc: bool = False,
                     skip_corrupt: bool = False) -> pa.RecordBatch:
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
    columns : sequence of str, optional
        Only these columns of :data:`MESSAGE_SCHEMA`, in this order (``None``: all).  Columns
        not asked for are not decoded: without any of ``msg_id``, ``tags``, ``keys``,
        ``properties``, ``deliver_timestamp``, ``transaction_id`` no properties string is
        parsed at all.
    verify_crc : bool
        Check every body against its record's BODYCRC (:mod:`store.core.read_checks`).
    skip_corrupt : bool
        Drop, rather than raise for, entries whose record fails the checks (header against
        entry, blank entries, the CRC with ``verify_crc``): Spark's ``failOnDataLoss=false``.

    Returns
    -------
    pyarrow.RecordBatch
        Rows in queue order with :data:`MESSAGE_SCHEMA` (or its ``columns``); ConsumeQueue
        filler units (in front of a queue that begins above offset 0) yield no row.

    Raises
    ------
    OffsetOutOfRangeError
        ``start``/``end`` are negative or reversed, an entry is not written yet, or its
        record's segment was removed by retention.
    InvalidMessageError
        ``columns`` names an unknown column (or one twice, or none).
    CorruptRecordError
        A record does not match its ConsumeQueue entry or its own length fields.

    Notes
    -----
    A process that mostly decodes should call :func:`keep_freed_heap` once (the ``rmq``
    source's Spark tasks do): freed temporaries then stay in the process for the next call.
    """
    try:
        schema = projected_schema(columns)
    except ValueError as exc:
        raise InvalidMessageError(f"read_arrow: {exc}") from None
    start, end = int(start), int(end)
    if start < 0 or end < start:
        raise OffsetOutOfRangeError(
            f"queue offsets [{start}, {end}) of {topic}/{queue_id}; allowed: 0 <= start <= end")
    if isinstance(tags, str):  # one tag, not its characters
        tags = (tags,)
    tag_set = None if tags is None else sorted({str(t) for t in tags})
    if end == start or tag_set == []:
        return empty_batch(schema)
    queue = store.consume_queue(topic, queue_id)
    codes = None if tag_set is None else np.array(
        [java_string_hash(t) if t else 0 for t in tag_set], np.int64)
    picked = None if codes is None or skip_corrupt else _tagged_entries(queue, start, end, codes)
    if picked is not None:  # the tag's entries alone, picked in one compiled pass
        entries, queue_offsets = picked
        if len(entries) == 0:
            return empty_batch(schema)
    else:
        entries, queue_offsets = _checked_entries(queue, topic, queue_id, start, end, codes,
                                                  skip_corrupt)
        if entries is None:
            return empty_batch(schema)
    if skip_corrupt:
        ok = intact_mask(store.commit_log, queue_id, entries, queue_offsets,
                         verify_crc=verify_crc)
        if not ok.all():
            entries, queue_offsets = entries[ok], queue_offsets[ok]
            if len(entries) == 0:
                return empty_batch(schema)
    names = None if columns is None else frozenset(schema.names) | (
        {"tags"} if tag_set is not None else set())
    arrays = _decode(store, topic, queue_id, entries, queue_offsets, names, verify_crc)
    batch = pa.RecordBatch.from_arrays([arrays[n] for n in schema.names], schema=schema)
    if tag_set is not None:
        # is_in gives False (not null) for a row without a tag
        exact = pc.is_in(arrays["tags"], value_set=string_array(tag_set))
        if not pc.all(exact).as_py():
            batch = batch.filter(exact)
    return batch


def _tagged_entries(queue, start: int, end: int, codes: np.ndarray):
    """``(entries, queue offsets)`` of the entries in ``[start, end)`` whose tagsCode is one of
    ``codes`` (fillers left out), read as stored and picked in one compiled pass; ``None``
    when the NumPy path must decide (an entry not written or missing, a queue without
    stored entries, the compiled loop not loaded yet)."""
    stored = getattr(queue, "stored_entries", None)
    if stored is None:
        return None
    raw = stored(start, end)
    if len(raw) != end - start or raw.dtype != ENTRY_DTYPE:
        return None
    picked = select_entries(raw, codes, FILLER_SIZE)
    if picked is None:
        return None
    return raw[picked].astype(raw.dtype.newbyteorder("=")), picked + start


def _checked_entries(queue, topic: str, queue_id: int, start: int, end: int,
                     codes: np.ndarray | None, skip_corrupt: bool):
    """``(entries, queue offsets)`` of ``[start, end)`` that hold a record (with one of the
    tagsCodes ``codes``, ``None``: any), checked: a blank entry below written ones raises
    :class:`CorruptRecordError` (dropped with ``skip_corrupt``), one not written
    :class:`OffsetOutOfRangeError`; ``(None, None)`` when none is left."""
    entries = queue.entries(start, end)
    queue_offsets = np.arange(start, end, dtype=np.int64)
    holes = blank_holes(entries) if len(entries) == end - start else ()
    if len(holes) and not skip_corrupt:  # a zeroed range of the queue file
        raise CorruptRecordError(f"consumequeue/{topic}/{queue_id}", start + int(holes[0]),
                                 "a blank entry below written ones: the queue file is damaged;"
                                 " `rmq repair` rebuilds it")
    if len(holes):
        entries, queue_offsets = np.delete(entries, holes), np.delete(queue_offsets, holes)
    if len(entries) != len(queue_offsets) or (entries["size"] <= 0).any():
        written = len(entries) if (entries["size"] > 0).all() else int(
            np.argmin(entries["size"] > 0))
        raise OffsetOutOfRangeError(
            f"queue offset {start + written} of {topic}/{queue_id} is not written; "
            f"allowed: end <= max_offset ({start + written} here)")
    keep = entries["size"] != FILLER_SIZE
    if codes is not None:
        keep &= np.isin(entries["tags_code"], codes)
    if not keep.all():
        entries, queue_offsets = entries[keep], queue_offsets[keep]
        if len(entries) == 0:
            return None, None
    return entries, queue_offsets


# --------------------------------------------------------------------------- records


def _decode(store: QueueSource, topic: str, queue_id: int, entries: np.ndarray,
            queue_offsets: np.ndarray, names: frozenset | None,
            verify_crc: bool = False) -> dict[str, pa.Array]:
    """Decode the records of ``entries`` (in CommitLog order) into columns (``names`` of
    them, or all)."""
    phys = np.ascontiguousarray(entries["offset"], dtype=np.int64)
    sizes = entries["size"].astype(np.int64)
    n = len(phys)
    file_size = store.commit_log.file_size
    if phys.min() < 0:
        i = int(np.argmax(phys < 0))
        raise CorruptRecordError(f"consumequeue/{topic}/{queue_id}", int(queue_offsets[i]),
                                 "entry with a negative CommitLog offset: the queue file is "
                                 "damaged; `rmq repair` rebuilds it")
    # one step per run of increasing offsets in one segment (an index commit's entries
    # point back at records staged earlier: store.core.index_commit)
    step = np.diff(phys)
    bounds = [0, *(np.flatnonzero((np.diff(phys // file_size) != 0) | (step <= 0))
                   + 1).tolist(), n]
    topic_bytes = topic.encode("utf-8")
    fields = {name: np.empty(n, dtype) for name, dtype in _FIELD_TYPES.items()}
    want_props = names is None or bool(names & PROPERTY_COLUMNS)
    parts = []
    for lo, hi in pairwise(bounds):  # one step per CommitLog segment
        f = store.commit_log.files.find(int(phys[lo]))
        if f is None:
            raise OffsetOutOfRangeError(
                f"queue offset {int(queue_offsets[lo])} of {topic}/{queue_id} points at "
                f"CommitLog offset {int(phys[lo])}, which is no longer stored (removed by "
                "retention); allowed: from the queue's min_offset on")
        body, topic_part, props = _read_segment(
            f, phys[lo:hi], sizes[lo:hi], topic_bytes, {k: v[lo:hi] for k, v in fields.items()},
            (queue_id, queue_offsets[lo:hi]), verify_crc, want_props)
        if want_props and not isinstance(props, dict):  # the reference path's strings
            props = property_columns(fields["sys_flag"][lo:hi], phys[lo:hi], props, hi - lo)
        parts.append((body, topic_part, props))
    if len(parts) == 1:
        body, topic_arr, props = parts[0]
    else:
        body = pa.concat_arrays([p[0] for p in parts])
        props = None if not want_props else {
            name: pa.concat_arrays([p[2][name] for p in parts]) for name in parts[0][2]}
        topic_arr = None if all(p[1] is None for p in parts) else pa.concat_arrays(
            [repeat_string(topic_bytes, len(p[0])) if p[1] is None else p[1] for p in parts])
    if topic_arr is None:
        topic_arr = repeat_string(topic_bytes, n)
    return columns(fields, phys, queue_offsets, body, topic_arr, props, names)


def _read_segment(f, phys: np.ndarray, sizes: np.ndarray, topic: bytes, fields: dict,
                  queue: tuple[int, np.ndarray], verify_crc: bool = False,
                  want_props: bool = True):
    """Check and read the records of one segment; fill ``fields``.  ``queue``: the queue id
    and the queue offsets of the entries (each record's header must say the same).

    Returns body, topic (``None`` when every record holds exactly ``topic``, the queue's
    own) and the properties: the property columns by name when the compiled gather
    (:func:`_gather`) read them, else the properties strings as a ``BinaryArray``.
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
    gather_tried = False
    if len(topic):  # the usual read: checked and gathered compiled
        props_start = np.empty(count, dtype=np.int64)
        stored_crcs = np.empty(count, dtype=np.int64)
        if check_records(np.frombuffer(mm, dtype=np.uint8), pos, sizes, phys, queue[0],
                         queue[1], topic, fields, body_end, props_start, stored_crcs) < 0:
            if verify_crc:
                check_body_crcs(f, mm, pos, body_end, stored_crcs, phys)
            gathered = _gather(mm, pos + HEADER_SIZE, body_end, props_start, record_end,
                               fields["sys_flag"], want_props)
            if gathered is not None:
                return gathered[0], None, gathered[1]
            gather_tried = True  # left to the reference path: the checks below, then _cut
    topic_len = np.empty(count, dtype=np.int64)
    span = int(record_end[-1] - pos[0])
    steps = np.searchsorted(pos, pos[0] + np.arange(_SCAN_BYTES, span, _SCAN_BYTES))
    bounds = [0, *sorted(set(steps.tolist()) - {0, count}), count]
    own = True
    for lo, hi in pairwise(bounds):
        own &= _scan(f, mm, pos[lo:hi], sizes[lo:hi], phys[lo:hi], topic,
                     {name: out[lo:hi] for name, out in fields.items()}, body_end[lo:hi],
                     topic_len[lo:hi], (queue[0], queue[1][lo:hi]), verify_crc)
    topic_start = body_end + _TOPIC_LENGTH_SIZE
    props_start = topic_start + topic_len + _PROPERTIES_LENGTH_SIZE
    if own:
        if not gather_tried:
            gathered = _gather(mm, pos + HEADER_SIZE, body_end, props_start, record_end,
                               fields["sys_flag"], want_props)
            if gathered is not None:
                return gathered[0], None, gathered[1]
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


def _scan(f, mm, pos, sizes, phys, topic: bytes, fields, body_end, topic_len,
          queue: tuple[int, np.ndarray], verify_crc: bool) -> bool:
    """Read and check one step of records; fill ``fields``, ``body_end`` and ``topic_len``.

    Returns whether every record's topic is ``topic``.
    """
    header = gather_headers(mm, f.size, pos)
    body_len = header["body_length"].astype(np.int64)
    bad = ~header_matches(header, sizes, phys, queue[0], queue[1])
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordError(
            f.path, int(phys[i]), f"record header (magic {int(header['magic'][i]) & 0xFFFFFFFF:#x},"
            f" size {int(header['total_size'][i])}, physical offset "
            f"{int(header['physical_offset'][i])}, queue {int(header['queue_id'][i])} offset "
            f"{int(header['queue_offset'][i])}) does not match its ConsumeQueue entry (size "
            f"{int(sizes[i])}, queue {queue[0]} offset {int(queue[1][i])}): the record or "
            "the queue file is damaged; a damaged queue is rebuilt by `rmq repair`")
    for name, out in fields.items():
        if name in _TIME_FIELDS:
            np.multiply(header[name], 1000, out=out)  # ms -> µs
        else:
            out[:] = header[name]
    np.add(pos + HEADER_SIZE, body_len, out=body_end)  # where TOPICLENGTH sits
    if verify_crc:
        check_body_crcs(f, mm, pos, body_end, header["body_crc"], phys)
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


def _gather(mm, body_start: np.ndarray, body_end: np.ndarray, props_start: np.ndarray,
            props_end: np.ndarray, sys_flag: np.ndarray, want_props: bool):
    """Bodies and property columns by the compiled gather (:mod:`store.kernels.message_decode`);
    ``None`` when it leaves the block to the reference path (a ``__RMQ_DELIVER_MS`` it does
    not parse, a string column that is not UTF-8)."""
    n = len(body_start)
    seg = np.frombuffer(mm, dtype=np.uint8)
    is_commit = (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE
    row, out = gather_messages(seg, body_start, body_end, props_start, props_end, is_commit,
                               _NAME_TABLE, parse=want_props)
    if row >= 0:
        return None
    body = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(out["body_offsets"]),
                                                        pa.py_buffer(out["body_data"])])
    if not want_props:
        return body, None
    try:
        return body, gathered_columns(out, n)
    except pa.ArrowInvalid:  # not UTF-8: the reference path replaces what is not
        return None


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
