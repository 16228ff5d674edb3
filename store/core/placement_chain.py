"""Where the chunks of one large append will land, presumed while they are being encoded.

A large append (:func:`store.produce.table_producer.append_prepared`, the sink's commit:
:func:`store.sink.staging.append_staged`) is cut into chunks that two
threads encode while the appending thread writes the ones before them.  Four fields of each
record depend on where it lands (queue id, queue offset, physical offset, store time); the
append used to write them into the encoded bytes under the write lock, a pass over every record
of a chunk that had long left the cache (30 ns a record; 60 ms of a 2M-row table).

A :class:`PlacementChain` presumes instead, in chunk order, that nothing else is appended
between the chunks: chunk ``k`` lands where chunk ``k - 1`` was presumed to end (RocketMQ's
placement rule, :func:`~store.core.write_placement.place_batch`), and its queue continues where
the chain last left it.  The encoding thread writes those fields into the headers before the
record kernel copies them (no pass over the records).  The append then checks the presumption
against the real log end, queue end and store time
(:meth:`~store.core.appender.Appender.append_assembled`) and writes the fields itself when any
differs (another writer came between): a wrong presumption costs the pass it would have
saved, never a wrong byte.

Staged records (:mod:`store.core.index_commit`) are presumed alike, with their queue
offset -1: they move no queue on.  Only chunks of one queue with a store time of their own
are presumed; any other chunk moves the
log end on and leaves its topics' queues unknown (their later chunks are not presumed).
"""

from __future__ import annotations

import threading

import numpy as np

from ..files.commit_log import CommitLog
from ..formats.record_codec import STAGED_QUEUE_OFFSET
from ..kernels.record_assembly import patch_placed_fields
from .append_types import EncodedRecords, Presumed
from .queue_dispatch import is_dispatched
from .write_placement import PLACED_AT, place_batch


class PlacementChain:
    """The presumed placement of chunks ``0 .. count - 1`` of one append (see the module
    docstring); made by :meth:`StoreCore.placement_chain
    <store.core.locking.AppendLocking.placement_chain>` from the log end and queue ends at the
    time.  :meth:`presume` runs on the encoding threads, in any order: chunk ``k`` waits until
    chunk ``k - 1`` is placed.  Every chunk must be :meth:`release`-d once its encoding ends
    (also when it failed), or a later chunk waits for ever."""

    def __init__(self, commit_log: CommitLog, file_size: int, count: int, log_end: int,
                 queue_ends: dict) -> None:
        self._commit_log = commit_log
        self._file_size = file_size
        #: after chunk k: (log end or None when unknown, queue ends), set once
        self._after: list = [None] * count
        self._placed = [threading.Event() for _ in range(count)]
        self._start = (log_end, dict(queue_ends))

    def presume(self, k: int, records: EncodedRecords, sizes: np.ndarray) -> Presumed | None:
        """Place chunk ``k`` (its records and their sizes) after chunk ``k - 1``; when it can
        be presumed, write its placement fields into ``records.headers`` and return what they
        were written for.  Chunk ``k`` counts as placed afterwards (also when this raises)."""
        return self._presume(k, sizes, records.topics,
                             lambda place, log_end, ends: self._fields(records, place, log_end,
                                                                       ends))

    def presume_assembled(self, k: int, data: np.ndarray, starts: np.ndarray,
                          sizes: np.ndarray, key: tuple, store_timestamp_ms: int
                          ) -> Presumed | None:
        """:meth:`presume` for chunk ``k`` already assembled: records ``starts[i]`` of
        ``data`` (``sizes[i]`` bytes), all of queue ``key`` (``(topic, queue id)``), stored
        at ``store_timestamp_ms``; the fields are written into ``data`` (one compiled pass
        over records still in the cache, on the encoding thread), as the sink's commit copies
        its staged records."""

        def fields(place, log_end, ends) -> Presumed | None:
            first = ends.get(key)
            if first is None:
                return None
            n = len(sizes)
            patch_placed_fields(data, starts, np.full(n, key[1], np.int64),
                                np.arange(first, first + n, dtype=np.int64), place[0],
                                store_timestamp_ms, PLACED_AT)
            return Presumed(log_end, key, first, store_timestamp_ms)

        return self._presume(k, sizes, [key[0]], fields)

    def _presume(self, k: int, sizes: np.ndarray, topics, fields) -> Presumed | None:
        """Chunk ``k`` placed after chunk ``k - 1``; ``fields(place, log_end, ends)`` writes
        its fields when it can be presumed and says for what (else ``None``)."""
        try:
            before = self._start if k == 0 else self._wait(k - 1)
            log_end, ends = before
            if log_end is None:
                return None
            _, _, new_end = place = place_batch(self._commit_log, self._file_size, log_end,
                                                sizes)
            presumed = fields(place, log_end, ends)
            if presumed is not None:
                if presumed.queue_first != STAGED_QUEUE_OFFSET:
                    ends = {**ends, presumed.key: presumed.queue_first + len(sizes)}
            else:  # its topics' queue ends are no longer known
                topics = set(topics)
                ends = {key: end for key, end in ends.items() if key[0] not in topics}
            self._after[k] = (new_end, ends)
            return presumed
        finally:
            self.release(k)

    def release(self, k: int) -> None:
        """Chunk ``k`` is placed, or will never be (its encoding failed: then nothing after
        it is presumed)."""
        if self._after[k] is None:
            self._after[k] = (None, {})
        self._placed[k].set()

    def _wait(self, k: int) -> tuple:
        self._placed[k].wait()
        return self._after[k]

    @staticmethod
    def _fields(records: EncodedRecords, place: tuple, log_end: int,
                ends: dict) -> Presumed | None:
        now = records.store_timestamp_ms
        qids, tids = records.queue_ids, records.topic_ids
        q = int(qids[0])
        if now is None or int(qids.min()) != q or int(qids.max()) != q:
            return None
        if len(records.topics) > 1 and not bool((tids == tids[0]).all()):
            return None
        key = (records.topics[int(tids[0])], q)
        starts = place[0]
        if is_dispatched(int(records.headers["sys_flag"][0])):
            first = ends.get(key)
            if first is None:
                return None
            queue_offsets = np.arange(first, first + len(starts), dtype=np.int64)
        else:  # staged records (store.core.index_commit): no queue entries, no queue moved
            first = queue_offsets = STAGED_QUEUE_OFFSET
        headers = records.headers
        headers["queue_id"] = q
        headers["queue_offset"] = queue_offsets
        headers["physical_offset"] = starts
        headers["store_timestamp"] = now
        return Presumed(log_end, key, first, now)


__all__ = ["PlacementChain", "Presumed"]
