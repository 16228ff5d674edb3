"""Cancel (RocketMQ's recall): finding the timer record a cancel refers to, and its marker.

RocketMQ's recall handle carries the fire time; ``producer.cancel(topic, msg_id)`` does not,
so the record is looked up.  A message id (``UNIQ_KEY``, :class:`~store.formats.record_codec.MessageIdGenerator`)
holds the ms since the start of its month at which it was born; for each month the id can
belong to, the timer ConsumeQueue is binary-searched by store time to that moment and the few
records stored from then on are compared by born time and id.  No index of pending messages
is kept, so memory does not grow with them.  :func:`cancel_marker` builds the delete marker
that is stored in the same wheel slot so the message never surfaces.
"""

from __future__ import annotations

from ..formats.record_codec import Record, RecordSpec
from ..core.ports import StorePort
from ..delayed.delivery import read_queue_entries
from ..base.errors import CorruptRecordError, UnknownTopicError
from ..formats.message import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_UNIQ_KEY,
    TIMER_TOPIC,
)
from ..formats.message_id import MessageIdGenerator
from .timer_queue import RECALL_TAG, marker_keys

#: How far apart born and store times of one record may be.
CANCEL_WINDOW_MS = 600_000
_MONTHS = MessageIdGenerator()


def born_candidates(msg_id: str, now: int, max_delay_ms: int) -> list[int]:
    """Born times (epoch ms) a message id can stand for, newest first."""
    if len(msg_id) != 32:
        return []
    try:
        since = int(msg_id[20:28], 16)  # ms since the month started, 31 bits
    except ValueError:
        return []
    out = []
    t = now + CANCEL_WINDOW_MS
    oldest = now - max_delay_ms - 32 * 86_400_000
    while t > oldest and t > 0:
        month_start = t - _MONTHS._since_month(t)
        for born in (month_start + since, month_start + since + 2**31):
            if month_start <= born <= t:
                out.append(born)
        t = month_start - 1
    return out


def find_timer_record(store: StorePort, topic: str, msg_id: str, now: int,
                      max_delay_ms: int) -> tuple[Record, int] | None:
    """The timer-topic record of ``msg_id`` whose real topic is ``topic`` and its queue
    offset, or ``None``.

    A record with that id but another real topic gives ``None`` too.  Cancel markers are
    skipped.  The caller holds the store's write lock.
    """
    try:
        qmax = store.max_offset(TIMER_TOPIC, 0)
    except UnknownTopicError:
        return None
    queue = store.consume_queue(TIMER_TOPIC, 0)
    log = store.commit_log
    for born in born_candidates(msg_id, now, max_delay_ms):
        i = store.offset_for_timestamp(TIMER_TOPIC, 0, born)
        while i < qmax:
            entries = read_queue_entries(queue, i, min(qmax, i + 256))
            if not len(entries):
                break
            for offset, size in zip(entries["offset"].tolist(), entries["size"].tolist()):
                i += 1
                if size <= 0:
                    continue  # a filler
                try:
                    rec = log.read_record(offset)
                except CorruptRecordError:
                    continue
                if rec.store_timestamp_ms > born + CANCEL_WINDOW_MS:
                    i = qmax
                    break
                props = rec.properties
                if PROPERTY_TIMER_DEL_UNIQKEY in props:
                    continue  # a cancel marker
                if rec.born_timestamp_ms == born and props.get(PROPERTY_UNIQ_KEY) == msg_id:
                    return (rec, i - 1) if props.get(PROPERTY_REAL_TOPIC) == topic else None
    return None


def timer_record_at(store: StorePort, topic: str, msg_id: str,
                    index: int) -> tuple[Record, int] | None:
    """The timer-topic record at queue offset ``index`` when it is ``msg_id`` of ``topic``
    (a direct lookup: for ids this store did not make, whose born time is unknown)."""
    try:
        qmax = store.max_offset(TIMER_TOPIC, 0)
    except UnknownTopicError:
        return None
    if not 0 <= index < qmax:
        return None
    entries = read_queue_entries(store.consume_queue(TIMER_TOPIC, 0), index, index + 1)
    if not len(entries) or int(entries["size"][0]) <= 0:
        return None
    try:
        rec = store.commit_log.read_record(int(entries["offset"][0]))
    except CorruptRecordError:
        return None
    props = rec.properties
    if PROPERTY_TIMER_DEL_UNIQKEY in props or props.get(PROPERTY_UNIQ_KEY) != msg_id \
            or props.get(PROPERTY_REAL_TOPIC) != topic:
        return None
    return rec, index


def has_marker(store: StorePort, topic: str, msg_id: str, start: int) -> bool:
    """Whether a cancel marker for ``msg_id`` of ``topic`` was stored at or after queue
    offset ``start`` of the timer topic."""
    return f"{topic}+{msg_id}" in marker_keys(store, start, store.max_offset(TIMER_TOPIC, 0))


def cancel_marker(store: StorePort, topic: str, msg_id: str, now: int, *, max_delay_ms: int,
                  precision_ms: int, index: int | None = None) -> RecordSpec | None:
    """The delete marker cancelling the pending timer message ``msg_id`` of ``topic``.

    ``None`` when there is no such message, it is already due, or it was cancelled before
    (the caller holds the write lock, so the answer cannot change before the marker is
    appended).  ``index``: the record's queue offset in the timer topic, when known.
    """
    if index is not None:
        found = timer_record_at(store, topic, msg_id, index)
    else:
        found = find_timer_record(store, topic, msg_id, now, max_delay_ms)
    if found is None:
        return None
    rec, index = found
    if has_marker(store, topic, msg_id, index + 1):  # cancelled before: nothing to do
        return None
    props = rec.properties
    out = int(props[PROPERTY_TIMER_OUT_MS])
    fire = int(props.get(PROPERTY_TIMER_DELIVER_MS) or out + precision_ms)
    if fire <= now:
        return None
    marker = {
        PROPERTY_UNIQ_KEY: msg_id, PROPERTY_TAGS: RECALL_TAG,
        PROPERTY_TIMER_OUT_MS: str(out), PROPERTY_TIMER_DELIVER_MS: str(fire),
        PROPERTY_TIMER_DEL_UNIQKEY: f"{topic}+{msg_id}",
        PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: "0",
    }
    return RecordSpec(topic=TIMER_TOPIC, body=b"0", properties=marker, queue_id=0,
                      born_timestamp_ms=now)
