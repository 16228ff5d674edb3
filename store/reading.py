"""Reading queues: pull, offsets by time, Arrow batches (a part of :class:`MessageStore`)."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .codec import (TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK,
                    Record)
from .errors import (InvalidMessageError, OffsetOutOfRangeError)
from .message import (PROPERTY_DELIVER_MS, PROPERTY_KEYS,
                      PROPERTY_TAGS, PROPERTY_TRANSACTION_ID, PROPERTY_UNIQ_KEY,
                      SYSTEM_PROPERTY_NAMES, MessageView)


class ReadMixin:
    """The read half of :class:`~store.message_store.MessageStore` (mixed into it)."""

    # ------------------------------------------------------------------ reading
    def read_record(self, commitlog_offset: int) -> Record:
        """Decode the record at a CommitLog offset."""
        self._check_open()
        return self.commit_log.read_record(commitlog_offset)

    def pull(self, topic: str, queue_id: int, offset: int,
             max_messages: int = 32) -> list[MessageView]:
        """Up to ``max_messages`` messages of a queue from ``offset`` on.

        Returns ``[]`` at the end of the queue.  Raises :class:`OffsetOutOfRangeError` for an
        offset below :meth:`min_offset` (removed by retention) or above :meth:`max_offset`.
        """
        self._check_open()
        if not isinstance(max_messages, int) or max_messages <= 0:
            raise InvalidMessageError(f"max_messages={max_messages!r}; allowed: an int >= 1")
        cq = self._check_queue(topic, queue_id)
        limit = self.confirmed_offset()
        maxo = cq.max_offset(limit)
        mino = cq.min_offset(self.commit_log.min_offset(), limit)
        if offset < mino or offset > maxo:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}/{queue_id} is out of range; allowed: {mino} to {maxo}"
                + (" (older messages were removed by retention)" if offset < mino else ""))
        entries = cq.entries(offset, min(maxo, offset + max_messages))
        views = []
        for i, e in enumerate(entries):
            rec = self.commit_log.read_record(int(e["offset"]))
            views.append(record_view(rec, offset + i))
        return views

    def queue_entries(self, topic: str, queue_id: int, start: int, end: int) -> np.ndarray:
        """ConsumeQueue entries ``[start, end)`` (fields ``offset``, ``size``, ``tags_code``)."""
        self._check_open()
        return self.consume_queue(topic, queue_id).entries(start, end)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is at or after ``timestamp_ms``.

        Returns :meth:`max_offset` when every message is older (RocketMQ's LOWER boundary).
        """
        self._check_open()
        lo = self.min_offset(topic, queue_id)
        hi = self.max_offset(topic, queue_id)
        cq = self.consume_queue(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            entry = cq.entry(mid)
            assert entry is not None
            if self.commit_log.store_timestamp(entry[0]) < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def read_arrow(self, topic: str, queue_id: int, start: int, end: int, *,
                   tags: Iterable[str] | None = None):
        """Decode queue offsets ``[start, end)`` into a ``pyarrow.RecordBatch`` (vectorised).

        Columns follow :data:`store.arrow_decode.MESSAGE_SCHEMA`.  ``tags`` keeps only
        messages whose tag is one of them (filtered on tagsCode before any body is read).
        """
        from .arrow_decode import read_queue_batch

        self._check_open()
        return read_queue_batch(self, topic, queue_id, start, end, tags=tags)


def record_view(rec: Record, queue_offset: int | None = None) -> MessageView:
    """The user-facing view of a record (system properties hidden)."""
    props = rec.properties
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES}
    keys = tuple(k for k in props.get(PROPERTY_KEYS, "").split(" ") if k)
    deliver = props.get(PROPERTY_DELIVER_MS)
    tx_id = props.get(PROPERTY_TRANSACTION_ID) if (
        rec.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE else None
    return MessageView(
        topic=rec.topic, queue_id=rec.queue_id,
        queue_offset=rec.queue_offset if queue_offset is None else queue_offset,
        commitlog_offset=rec.physical_offset, msg_id=props.get(PROPERTY_UNIQ_KEY, ""),
        tags=props.get(PROPERTY_TAGS), keys=keys, body=rec.body, properties=user,
        born_timestamp_ms=rec.born_timestamp_ms, store_timestamp_ms=rec.store_timestamp_ms,
        deliver_timestamp_ms=int(deliver) if deliver else None, transaction_id=tx_id,
        reconsume_times=rec.reconsume_times, sys_flag=rec.sys_flag,
        system_properties={k: v for k, v in props.items() if k in SYSTEM_PROPERTY_NAMES},
    )
