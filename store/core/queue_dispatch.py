"""Derived data from CommitLog records: the one dispatch path (RocketMQ's ``CommitLogDispatcher``).

Every path that puts records into the CommitLog (a send, a batch, a restore of delayed
messages, a transaction commit, recovery's rescan) hands the records' queue entries to
:meth:`Dispatcher.dispatch`, which writes them to the ConsumeQueues.  A new derived index that
a send must see at once is one more step of the dispatcher, not a change to every append
path.  The message-key index is not one: it is built behind the sends, from the CommitLog
(:mod:`store.core.key_index`), as RocketMQ's reput thread feeds its IndexService.

The ConsumeQueue ``tagsCode`` of a record is the Java hash of its tag, unless its topic is a
system topic whose service registered another rule (:meth:`Dispatcher.register_system_topic`).
Which records are indexed at all is RocketMQ's rule: plain and COMMIT records are, PREPARED
(half) and ROLLBACK records are not (:func:`is_dispatched`).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..formats.record_codec import (TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE,
                                    TRANSACTION_TYPE_MASK)
from ..files.consume_queue import ConsumeQueue
from ..formats.message import PROPERTY_TAGS, java_string_hash

#: ``rule(properties, store_timestamp_ms) -> tagsCode`` of a system topic's queue entries
#: (``None``: use the tag hash).
TagsCodeRule = Callable[[Mapping[str, str], int], "int | None"]

#: ``entries[(topic, queue_id)] = (first queue offset, commitlog offsets, sizes, tags codes)``,
#: the entries of consecutive queue offsets from ``first`` on; or ``(first queue offset,
#: units)``, the entries already laid out (an ``ENTRY_DTYPE`` array of
#: :mod:`store.files.consume_queue`).
QueueEntries = dict[tuple[str, int], tuple]

_TAG_CACHE_LIMIT = 65536


def is_dispatched(sys_flag: int) -> bool:
    """Whether a record with ``sys_flag`` gets a ConsumeQueue entry (not PREPARED or ROLLBACK)."""
    return (sys_flag & TRANSACTION_TYPE_MASK) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


class Dispatcher:
    """Builds ConsumeQueue entries and writes them (one instance per open store).

    Parameters
    ----------
    consume_queue : callable
        ``consume_queue(topic, queue_id) -> ConsumeQueue`` of the store.
    queue_written : callable, optional
        ``queue_written(topic, queue_id)``, called once per user queue (not a service's
        system queue) before its first entries are written: the store lists it in its topic
        table at once (a queue a recovery or a send creates).
    """

    def __init__(self, consume_queue: Callable[[str, int], ConsumeQueue],
                 queue_written: Callable[[str, int], None] | None = None) -> None:
        self._consume_queue = consume_queue
        self._queue_written = queue_written
        self._noted: set[tuple[str, int]] = set()
        #: The ConsumeQueue object of each queue written (the store keeps one per queue for
        #: as long as it is open): a single entry skips the store's lookup.
        self._written: dict[tuple[str, int], ConsumeQueue] = {}
        self._rules: dict[str, TagsCodeRule] = {}
        self._queue_counts: dict[str, int] = {}
        self._tag_cache: dict[str, int] = {}

    # -- the hook -------------------------------------------------------------------------
    def register_system_topic(self, topic: str, queue_count: int,
                              tags_code: TagsCodeRule | None = None) -> None:
        """A service's system topic: its queue count and, optionally, its tagsCode rule."""
        self._queue_counts[topic] = int(queue_count)
        if tags_code is not None:
            self._rules[topic] = tags_code

    def system_queue_count(self, topic: str) -> int | None:
        """The queue count a service registered for ``topic`` (``None``: not registered)."""
        return self._queue_counts.get(topic)

    def has_rule(self, topic: str) -> bool:
        """Whether ``topic``'s tagsCode comes from a registered rule rather than its tag."""
        return topic in self._rules

    # -- tagsCode -------------------------------------------------------------------------
    def tags_code(self, topic: str, properties: Mapping[str, str], store_timestamp_ms: int) -> int:
        """The tagsCode of a record of ``topic`` with ``properties`` stored at that time."""
        rule = self._rules.get(topic)
        if rule is not None:
            code = rule(properties, store_timestamp_ms)
            if code is not None:
                return code
        return self.tag_hash(properties.get(PROPERTY_TAGS))

    def tag_hash(self, tags: str | None) -> int:
        """The tagsCode of a tag (0 for none), cached."""
        if not tags:
            return 0
        code = self._tag_cache.get(tags)
        if code is None:
            code = java_string_hash(tags)
            if len(self._tag_cache) < _TAG_CACHE_LIMIT:
                self._tag_cache[tags] = code
        return code

    def tag_hashes(self, tags) -> np.ndarray:
        """tagsCodes of a sequence of tags (``None`` or empty: 0), one hash per distinct tag."""
        lookup = {t: self.tag_hash(t) for t in set(tags)}
        return np.fromiter(map(lookup.__getitem__, tags), dtype=np.int64, count=len(tags))

    # -- writing --------------------------------------------------------------------------
    def _note(self, key: tuple[str, int]) -> None:
        if key not in self._noted:
            self._noted.add(key)
            if self._queue_written is not None and key[0] not in self._queue_counts:
                self._queue_written(*key)

    def dispatch(self, entries: QueueEntries) -> None:
        """Write queue entries (see :data:`QueueEntries`); idempotent for the same records."""
        for key, block in entries.items():
            self._note(key)
            if len(block) == 2:
                self._consume_queue(*key).put_units(*block)
            else:
                self._consume_queue(*key).put(*block)

    def forget(self, key: tuple[str, int]) -> None:
        """Drop the queue object kept for ``key`` (the store replaced it: a rebuilt queue)."""
        self._written.pop(key, None)

    def dispatch_one(self, key: tuple[str, int], queue_offset: int, offset: int, size: int,
                     tags_code: int) -> None:
        """Write one record's queue entry (:meth:`dispatch` of a single entry)."""
        q = self._written.get(key)
        if q is None:
            self._note(key)
            q = self._written[key] = self._consume_queue(*key)
        q.put_one(queue_offset, offset, size, tags_code)

    def dispatch_rows(self, rows: dict[tuple[str, int], list[tuple[int, int, int, int]]]) -> None:
        """Write ``(queue offset, commitlog offset, size, tagsCode)`` rows of each queue.

        Rows of a queue need not be consecutive (a recovery scan may meet gaps); each run of
        consecutive queue offsets is written as one block.
        """
        for key, queue_rows in rows.items():
            arr = np.asarray(queue_rows, dtype=np.int64)
            breaks = np.flatnonzero(np.diff(arr[:, 0]) != 1) + 1
            for chunk in np.split(arr, breaks):
                self.dispatch({key: (int(chunk[0, 0]), chunk[:, 1], chunk[:, 2], chunk[:, 3])})
