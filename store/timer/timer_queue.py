"""Reading the timer topic's ConsumeQueue: fire times and cancel markers from the records.

``rmq_sys_wheel_timer`` queue 0 is dispatched as RocketMQ 5 dispatches it: each entry's
tagsCode is the hash of the record's tag (0 without one), so its file is byte for byte what a
RocketMQ broker writes for the same records, and a queue a RocketMQ 5 broker wrote can be read
without mistaking tag hashes for due times.  What the wheel needs is in the record itself, as
RocketMQ's enqueue service reads it there:

* ``TIMER_OUT_MS``, the rounded fire time (the wheel slot);
* ``TIMER_DEL_UNIQKEY``, present on a cancel marker only (``"{topic}+{msg_id}"``).

:func:`read_timer_entries` gathers both for a whole range of entries at once: one header
gather per CommitLog segment and one pass of the property kernel (no Python per entry).

Stores written by rmq before this layout kept ``TIMER_OUT_MS`` as the timer queue's tagsCode
(negated for a marker).  :func:`upgrade_tags_codes` rewrites such entries to the tag hash on
a writable open; it is idempotent, so a crash in the middle is finished by the next open.
The timer checkpoint then records how far the queue is known to hold hashes (its
``tagsHashedTo``, moved on with every save: this rmq writes hashes only), so a store opened
again looks only at what was queued since, not at every pending entry.  A fire time (epoch ms) is at least 2^31 while a Java string hash is a signed 32-bit int,
so the two can never be confused.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..files.consume_queue import live_mask
from ..core.ports import StorePort
from ..delayed.delivery import read_queue_entries, rebuilt_after_holes
from ..formats.message import (PROPERTY_TAGS, PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_TIMER_OUT_MS,
                               TIMER_TOPIC)
from ..kernels.property_scan import parse_int_ranges, scan_properties
from ..core.topic_copies import tags_codes
from ..files.record_gather import gather_segments
from ..formats.byte_columns import ByteSlices

#: The tag of a cancel (recall) marker, RocketMQ's.
RECALL_TAG = "_RECALL_TAG_"
_NAMES = (PROPERTY_TIMER_OUT_MS, PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_TAGS)
_OUT, _DEL, _TAGS = range(3)
#: Entries read per step by the helpers that walk a whole range.
CHUNK = 1 << 18
#: Any tagsCode at or beyond this magnitude is a fire time written by an earlier rmq.
_HASH_LIMIT = 1 << 31


class TimerEntries(NamedTuple):
    """Timer-queue entries and what their records say, one row per entry.

    ``ok`` is False for fillers, entries below the CommitLog minimum, records that are gone,
    damaged or do not match their entry, and records without a valid ``TIMER_OUT_MS``; such
    rows have ``fire`` 0 and are not timer messages the wheel can place.
    """

    entries: np.ndarray
    fire: np.ndarray
    marker: np.ndarray
    ok: np.ndarray
    marker_keys: frozenset


#: Damaged timer-queue entries a rebuild was tried for (delayed.routing.rebuilt_after_holes).
_TRIED: set = set()


def read_timer_entries(store: StorePort, start: int, end: int) -> TimerEntries:
    """Entries ``[start, end)`` of the timer queue with their records' fire times and marks.

    An entry that points at no timer record (zeroed, or bits flipped in the queue file) has
    the queue compared with the CommitLog and rebuilt when it is what is damaged, then read
    again: a damaged queue never drops a pending timer message."""
    for _ in range(2):
        e = read_queue_entries(store.consume_queue(TIMER_TOPIC, 0), start, end)
        live = live_mask(e, store.commit_log.min_offset())
        entries = TimerEntries(e, *record_fields(store, e, live))
        suspect = (e["size"] == 0) | (live & ~entries.ok)
        if not rebuilt_after_holes(store, TIMER_TOPIC, 0, e, start, suspect, _TRIED):
            break
    return entries


def record_fields(store: StorePort, e: np.ndarray, rows: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, frozenset]:
    """``(fire, marker, ok, marker keys)`` of the records of queue entries ``e`` where
    ``rows`` (a mask) is set (see :class:`TimerEntries`)."""
    n = len(e)
    fire = np.zeros(n, dtype=np.int64)
    marker = np.zeros(n, dtype=bool)
    ok = np.zeros(n, dtype=bool)
    keys: set[str] = set()
    rows = np.flatnonzero(rows)
    if len(rows):
        offsets = e["offset"][rows].astype(np.int64)
        for seg in gather_segments(store.commit_log, offsets):
            at = rows[seg.sel]
            props = ByteSlices(seg.raw, seg.properties_start,
                               seg.properties_start + seg.properties_length)
            found, v0, v1 = scan_properties(props, _NAMES[:2])
            out, out_ok = parse_int_ranges(seg.raw, v0[_OUT], v1[_OUT])
            good = found[_OUT] & out_ok & (seg.headers["total_size"] == e["size"][at])
            fire[at] = np.where(good, out, 0)
            ok[at] = good
            marks = good & found[_DEL]
            marker[at] = marks
            for i in np.flatnonzero(marks).tolist():
                keys.add(seg.raw[v0[_DEL, i]:v1[_DEL, i]].tobytes().decode("utf-8", "replace"))
    return fire, marker, ok, frozenset(keys)


def marker_keys(store: StorePort, start: int, end: int) -> set[str]:
    """``TIMER_DEL_UNIQKEY`` of the cancel markers among timer-queue entries ``[start, end)``.

    A marker carries :data:`RECALL_TAG` (rmq's and RocketMQ's alike), so only the records
    whose tagsCode is that tag's hash are read: the rest of the range costs a queue read.
    """
    queue = store.consume_queue(TIMER_TOPIC, 0)
    recall = int(store.tag_hashes([RECALL_TAG])[0])
    cl_min = store.commit_log.min_offset()
    keys: set[str] = set()
    for q in range(start, end, CHUNK):
        e = read_queue_entries(queue, q, min(end, q + CHUNK))
        candidates = live_mask(e, cl_min) & (e["tags_code"] == recall)
        if candidates.any():
            keys |= record_fields(store, e, candidates)[3]
    return keys


def fire_counts(store: StorePort, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """``(fire times, weights)`` of the timer records queued at ``[start, end)``: +1 per
    message, -1 per cancel marker (unreadable entries left out)."""
    fires, weights = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for q in range(start, end, CHUNK):
        t = read_timer_entries(store, q, min(end, q + CHUNK))
        fires.append(t.fire[t.ok])
        weights.append(np.where(t.marker[t.ok], -1, 1).astype(np.int64))
    return np.concatenate(fires), np.concatenate(weights)


def upgrade_tags_codes(store: StorePort, start: int | None = None) -> tuple[int, int]:
    """Rewrite timer-queue tagsCodes an earlier rmq set to the fire time as tag hashes.

    Looks at the entries from ``start`` (``None``: the queue's first; the timer checkpoint's
    ``tagsHashedTo`` says where the entries not known to hold hashes begin) to the queue's
    end.  Returns ``(entries rewritten, the end looked up to)``.  Only entries whose
    tagsCode cannot be a hash (magnitude at least 2^31) are touched, so a queue RocketMQ
    wrote is never changed.  The caller holds the write lock.
    """
    queue = store.consume_queue(TIMER_TOPIC, 0)
    end = queue.max_offset()
    first = queue.first_index()
    done = 0
    for q in range(first if start is None else max(first, start), end, CHUNK):
        e = read_queue_entries(queue, q, min(end, q + CHUNK))
        old = (e["size"] > 0) & (np.abs(e["tags_code"]) >= _HASH_LIMIT)
        if not old.any():
            continue
        codes = e["tags_code"].astype(np.int64)
        codes[old] = tag_hashes(store, e["offset"][old].astype(np.int64))
        queue.put(q, e["offset"], e["size"], codes)
        done += int(old.sum())
    if done:
        queue.flush()
    return done, end


def tag_hashes(store: StorePort, offsets: np.ndarray) -> np.ndarray:
    """The tag hash of each record at ``offsets`` (0 without a tag or a readable record),
    as :func:`~store.core.topic_copies.tags_codes` computes it for a copy into the timer topic."""
    codes = np.zeros(len(offsets), dtype=np.int64)
    for seg in gather_segments(store.commit_log, offsets):
        props = ByteSlices(seg.raw, seg.properties_start,
                           seg.properties_start + seg.properties_length)
        found, v0, v1 = scan_properties(props, _NAMES[_TAGS:])
        n = len(seg.sel)
        codes[seg.sel] = tags_codes(store, props, np.ones(n, bool), found[0], v0[0], v1[0],
                                    np.zeros(n, np.int64), [TIMER_TOPIC], 0)
    return codes


__all__ = ["CHUNK", "RECALL_TAG", "TimerEntries", "fire_counts", "marker_keys",
           "read_timer_entries", "record_fields", "tag_hashes", "upgrade_tags_codes"]
