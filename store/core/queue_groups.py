"""The records of one columnar append grouped by queue: their queue offsets and entries.

:meth:`Appender.append_assembled <store.core.appender.Appender.append_assembled>` places a
chunk of records that may go to several topics and queues; this groups them by
``(topic, queue id)`` once (no grouping at all for the usual chunk of one queue), gives each
record its queue offset (its queue's end plus its rank in the group) and builds the queue
entries the dispatcher writes.
"""

from __future__ import annotations

import numpy as np

from .append_types import AssembledRecords
from .queue_dispatch import QueueEntries

#: Topic ids and queue ids are packed in one int64 key (``topic_id << 20 | queue_id``).
QUEUE_BITS = 20


class QueueGroups:
    """The records of one append grouped by queue: ``keys[g]`` is group ``g``'s ``(topic,
    queue id)``, ``counts[g]`` its records; ``order`` lists the records group by group
    (stable), ``None`` when they all go to one queue (the usual batch: no grouping)."""

    __slots__ = ("n", "keys", "counts", "group_of", "order", "group_start")

    def __init__(self, n: int, keys: list[tuple[str, int]], counts: np.ndarray,
                 group_of: np.ndarray | None, order: np.ndarray | None,
                 group_start: np.ndarray | None) -> None:
        self.n, self.keys, self.counts = n, keys, counts
        self.group_of, self.order, self.group_start = group_of, order, group_start

    @classmethod
    def of(cls, records: AssembledRecords, qids: np.ndarray) -> QueueGroups:
        """Group ``records`` by their (topic, ``qids``) pairs (one sort; none for one queue)."""
        n = len(records)
        topic_ids = records.topic_ids
        q_min, q_max = int(qids.min()), int(qids.max())
        if len(records.topics) == 1:  # (topic ids are all 0)
            one_queue = q_min == q_max
            queue_key = qids
        else:
            queue_key = (topic_ids << QUEUE_BITS) | qids
            one_queue = bool((queue_key == queue_key[0]).all())
        if one_queue:
            return cls(n, [(records.topics[int(topic_ids[0])], q_min)], np.array([n]),
                       None, None, None)
        uniq, group_of = np.unique(queue_key, return_inverse=True)
        group_of = group_of.ravel()
        if len(records.topics) == 1:
            keys = [(records.topics[0], int(k)) for k in uniq.tolist()]
        else:
            keys = [(records.topics[int(k) >> QUEUE_BITS], int(k) & ((1 << QUEUE_BITS) - 1))
                    for k in uniq.tolist()]
        counts = np.bincount(group_of, minlength=len(uniq))
        group_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
        return cls(n, keys, counts, group_of, np.argsort(group_of, kind="stable"), group_start)

    def queue_offsets(self, firsts: np.ndarray | None) -> np.ndarray:
        """Each record's queue offset: its queue's ``firsts[g]`` plus its rank in the group
        (-1 when the records are not indexed, ``firsts`` ``None``: staged records, see
        :mod:`store.core.index_commit`)."""
        n = self.n
        if firsts is None:
            return np.full(n, -1, dtype=np.int64)  # not indexed by their append
        if self.order is None:
            return firsts[0] + np.arange(n, dtype=np.int64)
        rank = np.empty(n, dtype=np.int64)
        rank[self.order] = np.arange(n) - np.repeat(self.group_start, self.counts)
        return firsts[self.group_of] + rank

    def entries(self, firsts: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                codes: np.ndarray) -> QueueEntries:
        """The queue entries of the records (see :data:`~store.core.queue_dispatch.QueueEntries`)."""
        if self.order is None:
            return {self.keys[0]: (int(firsts[0]), starts, sizes, codes)}
        entries: QueueEntries = {}
        for g, key in enumerate(self.keys):
            sel = self.order[self.group_start[g]:self.group_start[g] + self.counts[g]]
            entries[key] = (int(firsts[g]), starts[sel], sizes[sel], codes[sel])
        return entries
