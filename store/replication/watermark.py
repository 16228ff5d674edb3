"""A replica's high watermark: the CommitLog offset below which its readers see records.

As Kafka's high watermark: on the **leader**, the end ``min_insync_replicas`` replicas (the
leader counted) hold, flushed as their flush mode says, which is the acknowledged end its
synchronous acks count (:attr:`~store.replication.acks.InSyncAcks.acked`); with
``min_insync_replicas: 1`` it is the leader's own confirmed end (its readers are not bound).
A **follower** learns its leader's with each replication answer
(:mod:`store.remote.replication_stream`) and its readers see below the lower of its own
end and that.  Readers are the clients of the served store (the Flight face's reads,
snapshots, queries: :attr:`~store.core.reading.ReadableStore.read_bound`); the store's own
services (delivery of due messages, check rounds, the replication answers) read the whole
log.

So with ``min_insync_replicas`` of 2 or more nothing a reader saw can be cut from the log by
a change of leader: the replica the voters elect (or ``rmq promote`` accepts) holds every
acknowledged write, and the watermark is never past what enough replicas hold.

:class:`HighWatermark` keeps the highest mark known (it never goes back but for a cut
tail, :meth:`HighWatermark.cut`, or a replica that takes a lead while holding less than it
heard, whose mark is its end) and records it in ``config/replication.json``
(``high_watermark``) at most every :data:`SAVE_S` (the server's step asks,
:meth:`HighWatermark.due`), so that a restarted replica shows its readers what they saw
before, without waiting for its followers or its leader.
"""

from __future__ import annotations

import time

#: Seconds between two records of a moved watermark.
SAVE_S = 1.0


class HighWatermark:
    """The highest watermark a replica knows (``recorded``: the one its state file holds)."""

    def __init__(self, recorded: object = None, clock=time.monotonic) -> None:
        self.mark = recorded if isinstance(recorded, int) and recorded >= 0 else -1
        self.saved = self.mark
        self._saved_at = clock()
        self._clock = clock

    def current(self, acks=None) -> int:
        """The mark, or on a leader with synchronous ``acks`` the acknowledged end when it
        is higher (read without writing: readers of many threads call this)."""
        return self.mark if acks is None else max(self.mark, acks.acked)

    def learn(self, value: int) -> None:
        """The leader's mark as an answer gave it, or this leader's :meth:`current` (one
        writer at a time: the follower thread, or a server step)."""
        if value > self.mark:
            self.mark = int(value)

    def cut(self, end: int) -> None:
        """The log now ends at ``end`` (a cut tail, or a leader that holds less than it
        heard): the mark is not past it."""
        self.mark = min(self.mark, int(end))

    def due(self) -> bool:
        """Whether the mark moved since it was recorded, :data:`SAVE_S` ago or more."""
        return self.mark != self.saved and self._clock() - self._saved_at >= SAVE_S

    def recorded(self) -> int:
        """The mark, as about to be recorded (:meth:`due` answers for it from now on)."""
        self.saved, self._saved_at = self.mark, self._clock()
        return self.mark
