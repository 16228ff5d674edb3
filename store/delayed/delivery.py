"""What the delay levels and the timer share: moving records to their real topics.

Exactly-once across crashes
---------------------------
Every record a service appends while delivering (the restored message, or a timer roll's
re-put) carries ``__RMQ_DELAY_ORIGIN`` = the CommitLog offset of the system-topic record it
came from.  Before a delivery run appends anything, the service saves a *mark* (the CommitLog
end) in its progress file; after the run it saves its new progress and clears the mark.  A
run that died in between leaves the mark behind, and the next run (in any process) collects
the origins of every record from the mark to the log end (:func:`origins_since`): those
sources are done and are skipped while the unfinished work is redone.  The store's append
writes records and then publishes them, and recovery keeps the valid prefix of a torn
multi-record write, so the records found this way are exactly the deliveries that happened.
"""

from __future__ import annotations

import os

import numpy as np

from ..formats.record_codec import HEADER_SIZE, encode_properties, gather_headers
from ..files.consume_queue import ENTRY_DTYPE, ENTRY_SIZE
from ..core.ports import StorePort
from ..base.errors import MessageTooLargeError
from ..formats.message import PROPERTY_DELAY_ORIGIN, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC
from ..kernels.property_scan import parse_int_ranges, scan_properties
from ..files.record_gather import gather_segments
from ..formats.byte_columns import ByteSlices

#: Properties bytes a delivery (or roll) may add: ``__RMQ_DELIVER_MS``, the origin,
#: ``TIMER_ENQUEUE_MS``, ``TIMER_DEQUEUE_MS``, ``TIMER_ROLL_TIMES``.
DELIVERY_HEADROOM = 200


def routed_properties(store: StorePort, spec) -> dict[str, str]:
    """The properties of a delayed ``spec`` with its real topic and queue recorded.

    The real queue is chosen now (round robin, as a plain send would) so that delivery
    restores the message to the same queue whatever process delivers it.
    """
    qid = spec.queue_id
    if qid is None:
        qid = store.next_queue(spec.topic, store.ensure_topic(spec.topic))
    props = dict(spec.properties)
    props[PROPERTY_REAL_TOPIC] = spec.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(qid)
    return props


def check_headroom(store: StorePort, properties) -> None:
    """Refuse at send time a delayed message whose properties (a dict, or the encoded
    string) leave no room for delivery.

    Otherwise its restored record would exceed ``max_properties_size_bytes`` and could never
    be delivered.
    """
    size = len(properties if isinstance(properties, bytes) else encode_properties(properties))
    limit = store.config.max_properties_size_bytes - DELIVERY_HEADROOM
    if size > limit:
        raise MessageTooLargeError(
            f"properties of a delayed message are {size} bytes; allowed: at most {limit} "
            f"(max_properties_size_bytes minus {DELIVERY_HEADROOM} for delivery bookkeeping)")


def properties_since(store: StorePort, start: int, names, end: int | None = None):
    """For the records from CommitLog offset ``start`` to ``end`` (the confirmed end when
    ``None``), a run of records at a time: ``(raw, found, vstart, vend)`` as
    :func:`scan_properties` gives them for ``names`` over each record's properties (``raw``:
    the segment's bytes).

    The compiled walk, then one compiled pass over the properties: no Python step per
    record, so a step killed amid a burst of a million appends is redone without a
    per-record loop (the delay levels' and the schedules' ``deliverMark``).
    """
    log = store.commit_log
    end = store.confirmed_offset() if end is None else min(end, store.confirmed_offset())
    start = max(start, log.min_offset())
    if start >= end:
        return
    for f, positions, _sizes in log.scan_batches(start, check_crc=False):
        inside = positions + f.start < end
        if inside.any():
            raw = np.frombuffer(f.buffer(), np.uint8)
            yield (raw, *scan_properties(_properties_of(raw, positions[inside]), names))
        if not inside.all():
            break


def _properties_of(raw: np.ndarray, positions: np.ndarray) -> ByteSlices:
    """The properties strings of the valid records at ``positions`` of a segment."""
    body_len = gather_headers(raw, len(raw), positions)["body_length"].astype(np.int64)
    topic_at = positions + HEADER_SIZE + body_len
    props_at = topic_at + 3 + raw[topic_at]  # past the topic and the properties' length
    props_len = (raw[props_at - 2].astype(np.int64) << 8) | raw[props_at - 1]
    return ByteSlices(raw, props_at, props_at + props_len)


def origins_since(store: StorePort, start: int, end: int | None = None) -> np.ndarray:
    """Sorted origins (``__RMQ_DELAY_ORIGIN``) of the delivered records from CommitLog
    offset ``start`` to ``end`` (the confirmed end when ``None``; records without one, or
    with one that is no integer, give none)."""
    found: list[np.ndarray] = []
    for raw, has, vstart, vend in properties_since(store, start, [PROPERTY_DELAY_ORIGIN],
                                                   end):
        values, ok = parse_int_ranges(raw, vstart[0][has[0]], vend[0][has[0]])
        found.append(values[ok])
    origins = np.sort(np.concatenate(found)) if found else np.empty(0, np.int64)
    if len(origins) < 2:  # sorted, not hashed: they come nearly sorted already
        return origins
    return origins[np.concatenate(([True], origins[1:] != origins[:-1]))]


def entries_without_record(store: StorePort, entries: np.ndarray,
                           live: np.ndarray) -> np.ndarray:
    """Which ``live`` queue entries point at no record of their size (bits flipped in the
    queue file, or a record that is itself damaged): one header gather per segment."""
    bad = live.copy()
    rows = np.flatnonzero(live)
    if len(rows):
        for seg in gather_segments(store.commit_log, entries["offset"][rows].astype(np.int64)):
            at = rows[seg.sel]
            bad[at] = seg.headers["total_size"] != entries["size"][at]
    return bad


def rebuilt_after_holes(store: StorePort, topic: str, queue_id: int, entries: np.ndarray,
                        start: int, suspect: np.ndarray, tried: set) -> bool:
    """Rebuild a service's queue from the CommitLog when entries read from it (``entries``,
    from queue offset ``start``) hold damage: ``suspect`` marks entries that point at no
    record of the queue (an entry of size 0 inside the queue is a zeroed range: rmq writes
    none).  Each suspect offset is tried once per process (``tried``), since a record that
    is itself damaged stays so.  Returns whether the queue was rebuilt: read it again."""
    at = np.flatnonzero(suspect)
    if not len(at):
        return False
    key = (store.root, topic, queue_id, start + int(at[0]))
    if key in tried:
        return False
    tried.add(key)
    return store.heal_queue(topic, queue_id)


def release_commitlog_pages(store: StorePort) -> None:
    """Drop this process's resident pages of the CommitLog mappings (the data stays on disk).

    Reading scattered records through a mapping makes the kernel map whole read-around
    windows (hundreds of KiB per record here), so after a delivery run the pages are handed
    back; otherwise resident memory would grow with every record ever delivered.
    """
    store.commit_log.files.release_pages()


_NATIVE_ENTRY_DTYPE = ENTRY_DTYPE.newbyteorder("=")


def read_queue_entries(queue, start: int, end: int) -> np.ndarray:
    """ConsumeQueue entries ``[start, end)`` read with ``pread`` (native byte order).

    Unlike :meth:`ConsumeQueue.entries` this does not touch the queue's mapping, so scanning
    millions of pending timer entries does not grow the process's resident memory.
    """
    parts = []
    i = start
    while i < end:
        f = queue.files.find(i * ENTRY_SIZE)
        if f is None:
            break
        base = f.start // ENTRY_SIZE
        j = min(end, base + f.size // ENTRY_SIZE)
        data = os.pread(f.fd(), (j - i) * ENTRY_SIZE, (i - base) * ENTRY_SIZE)
        parts.append(np.frombuffer(data, dtype=ENTRY_DTYPE))
        i = j
    if not parts:
        return np.empty(0, dtype=_NATIVE_ENTRY_DTYPE)
    out = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return out.astype(_NATIVE_ENTRY_DTYPE)
