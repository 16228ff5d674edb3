"""Finding messages without a scan: by key, by message id, by store time (RocketMQ's
``queryMessage`` and ``viewMessage``).

* By key (:func:`query_messages` with ``key``): the message-key index
  (:mod:`store.core.key_index`) gives the CommitLog offsets of ``topic#key``, and the walk
  of the records it has not reached yet (built behind the sends, it may lag them by a few
  milliseconds) those of the newest ones, so that a query sees every message acknowledged
  before it began, without waiting for the index's builder; each record is
  read and kept when it really carries the key (``KEYS`` or ``UNIQ_KEY``: the index stores
  32-bit hashes only) in that topic, stored in the time range and visible (before the
  confirmed offset, not removed by retention, and, for a staged record, named by a commit
  marker: :func:`~store.core.index_commit.committed`).
* By time only: each queue of the topic is binary-searched on store time
  (:meth:`~store.core.reading.ReadableStore.offset_for_timestamp`) and read from there.
* By id (:func:`view_message`): an offset message id (store host and CommitLog offset) is
  decoded and its record read; anything else is taken for a unique key (``UNIQ_KEY``) and
  looked up in the index under each topic of the store.
"""

from __future__ import annotations

import numpy as np

from ..base.errors import CorruptRecordError, InvalidMessageError, KeyIndexUnavailableError
from ..formats.message import (
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    MessageView,
    is_system_topic,
    record_view,
)
from ..formats.message_id import decode_offset_message_id
from ..formats.record_codec import Record
from .index_commit import committed, is_staged

#: What the queries read: a :class:`~store.core.reading.ReadableStore` (not imported: the
#: store's methods import this module).
ReadableStore = object

_FOREVER = (1 << 63) - 1


def _time_range(begin_ms: int | None, end_ms: int | None) -> tuple[int, int]:
    begin = 0 if begin_ms is None else begin_ms
    end = _FOREVER if end_ms is None else end_ms
    for name, value in (("begin_ms", begin), ("end_ms", end)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidMessageError(f"{name}={value!r}; allowed: an int (epoch ms) or None")
    if begin > end:
        raise InvalidMessageError(f"begin_ms={begin} is after end_ms={end}; allowed: "
                                  "begin_ms <= end_ms")
    return begin, end


def _carries(rec: Record, key: str) -> bool:
    props = rec.properties
    return props.get(PROPERTY_UNIQ_KEY) == key or key in props.get(PROPERTY_KEYS, "").split(" ")


def _records_at(store: ReadableStore, offsets: list[int]) -> list[Record]:
    """The visible records at ``offsets`` (ascending, each once); offsets past the confirmed
    end or below the CommitLog's first segment, or not holding a record, are skipped."""
    limit = store.visible_offset()
    low = store.commit_log.min_offset()
    records = []
    for offset in sorted(set(offsets)):
        if not low <= offset < limit:
            continue
        try:
            rec = store.commit_log.read_record(offset)
        except CorruptRecordError:
            continue
        if rec.physical_offset == offset:
            records.append(rec)
    staged = [r.physical_offset for r in records if is_staged(r.sys_flag, r.queue_offset)]
    if staged:  # a staged record is visible once a commit marker named it
        hidden = set(np.asarray(staged)[~committed(store, staged)].tolist())
        records = [r for r in records if r.physical_offset not in hidden]
    return records


def query_messages(store: ReadableStore, topic: str, key: str | None = None,
                   begin_ms: int | None = None, end_ms: int | None = None,
                   max: int = 64) -> list[MessageView]:
    """See :meth:`~store.core.reading.ReadableStore.query_messages`."""
    store._check_open()
    if isinstance(max, bool) or not isinstance(max, int) or max <= 0:
        raise InvalidMessageError(f"max={max!r}; allowed: an int >= 1")
    if not isinstance(topic, str) or not topic:
        raise InvalidMessageError(f"topic={topic!r}; allowed: a topic name")
    begin, end = _time_range(begin_ms, end_ms)
    if key is None:
        return _by_time(store, topic, begin, end, max)
    if not isinstance(key, str) or not key:
        raise InvalidMessageError(f"key={key!r}; allowed: a non-empty str or None")
    index = store.key_index
    if not index.configured and not index.has_files():
        raise KeyIndexUnavailableError(
            f"store {store.root} keeps no message-key index (message_index_enable=False and "
            "no index/ files); open it with message_index_enable=True (the index is then "
            "built from the CommitLog) or query by time only")
    offsets = index.find(topic, key, max, begin, end, log_end=store.visible_offset())
    views = [record_view(rec) for rec in _records_at(store, offsets)
             if rec.topic == topic and begin <= rec.store_timestamp_ms <= end
             and _carries(rec, key)]
    return views[-max:]  # the newest, as RocketMQ's (which reads the newest files first)


def _by_time(store: ReadableStore, topic: str, begin: int, end: int,
             max: int) -> list[MessageView]:
    """The first ``max`` messages of ``topic`` stored in ``[begin, end]``, in store-time
    order, each queue binary-searched on store time."""
    views: list[MessageView] = []
    for queue_id in store.queue_ids(topic):
        first = store.offset_for_timestamp(topic, queue_id, begin)
        last = (store.max_offset(topic, queue_id) if end == _FOREVER
                else store.offset_for_timestamp(topic, queue_id, end + 1))
        offset = first
        while offset < min(last, first + max):
            got = store.pull(topic, queue_id, offset, min(max, last - offset))
            if not got:
                break
            views.extend(v for v in got if begin <= v.store_timestamp_ms <= end)
            offset += len(got)
    views.sort(key=lambda v: (v.store_timestamp_ms, v.commitlog_offset))
    return views[:max]


def view_message(store: ReadableStore, msg_id: str, topic: str | None = None
                 ) -> MessageView | None:
    """See :meth:`~store.core.reading.ReadableStore.view_message`."""
    store._check_open()
    if not isinstance(msg_id, str) or not msg_id:
        raise InvalidMessageError(f"msg_id={msg_id!r}; allowed: an offset message id or a "
                                  "unique key (UNIQ_KEY)")
    decoded = decode_offset_message_id(msg_id)
    if decoded is not None:
        records = _records_at(store, [decoded[2]])
        if records and (topic is None or records[0].topic == topic):
            return record_view(records[0])
    topics = [topic] if topic is not None else store.topics(include_system=True)
    found: list[Record] = []
    log_end = store.visible_offset()
    tail = store.key_index.tail(log_end)
    for name in topics:
        offsets = store.key_index.find(name, msg_id, 64, log_end=log_end, tail=tail)
        found.extend(rec for rec in _records_at(store, offsets)
                     if rec.topic == name and rec.properties.get(PROPERTY_UNIQ_KEY) == msg_id)
    if not found:
        return None
    # a delayed or transactional message is stored twice under one id: the copy a consumer
    # reads (in a user topic, the latest) is the one shown
    found.sort(key=lambda r: (not is_system_topic(r.topic), r.physical_offset))
    return record_view(found[-1])
