"""Synchronous replication on the leader: a write is acknowledged once ``min_insync_replicas``
replicas (the leader counted) hold it.

Each follower's ``replicate`` request carries its CommitLog end, which it reports only after
appending (and, with ``SYNC_FLUSH``, syncing) the bytes below it: the leader notes it
(:meth:`InSyncAcks.report`), as RocketMQ's HA slave reports its max offset to its master.
The acknowledged end is the ``min_insync_replicas - 1``-th highest end the followers
reported; a writer waits (:meth:`InSyncAcks.wait`, called by the core once per outermost
write-locked step that appended: a send, a batch, a table, a sink commit, a transaction end;
never per message) until that end passes its own, outside the append lock, so that every
writer waiting meanwhile is released by the same report.  A writer that starts waiting wakes
the followers' long polls (:class:`~store.remote.replication_stream.AppendSignal`, kept
with the long poll it wakes) instead of letting them find the append at their next look.

Before a write is acknowledged, the replica must still lead (elected: within its lease,
:meth:`~store.replication.replica.Replica.leading`): a write that waited on a replica that
meanwhile lost its lead (deposed by the voters, or its lease ran out) fails with
:class:`~store.base.errors.LeaderDeposedError` (a :class:`~store.base.errors.NotLeaderError`),
never succeeds, and a change of role wakes every waiting writer at once (:meth:`close`).

Past ``replica_ack_timeout_ms`` the writer gets
:class:`~store.base.errors.ReplicaAckTimeoutError`: the records are in the leader's log (its
readers see them only once enough replicas hold them: :mod:`.watermark`) but were not
acknowledged; the sender must assume they may or may not
survive a change of leader, and retry (with a key, to recognise a duplicate), as a Kafka
producer with ``acks=all`` does.

The server's own services (delivery of due messages, check rounds) do not wait
(:meth:`~store.replication.replica.Replica.services`): they acknowledge nobody, and their
records reach the followers as every record does.
"""

from __future__ import annotations

import threading
import time

from ..base.errors import LeaderDeposedError, ReplicaAckTimeoutError
from ..remote.replication_stream import AppendSignal


class InSyncAcks:
    """The leader's count of its followers' reported ends (see the module docstring).

    ``followers``: the other replicas' URLs (reports from others are ignored);
    ``min_insync_replicas``: replicas that must hold a write, the leader counted;
    ``timeout_ms``: how long a writer waits.
    """

    def __init__(self, followers, min_insync_replicas: int, timeout_ms: int,
                 signal: AppendSignal | None = None, exempt=lambda: False,
                 still_leading=lambda: None) -> None:
        self.followers = frozenset(followers)
        self.needed = int(min_insync_replicas) - 1
        self.timeout_s = timeout_ms / 1000
        self.signal = signal or AppendSignal()
        self._ends: dict[str, int] = {}
        self._acked = -1
        self._closed = False
        self._cond = threading.Condition()
        #: ``exempt()``: whether the calling thread's appends wait for no replica.
        self.exempt = exempt
        #: ``still_leading()``: raises unless the replica still leads (checked before a
        #: write is acknowledged: a deposed leader acknowledges nothing).
        self.still_leading = still_leading
        self.timeouts = 0
        #: ``on_acked()``: called (outside the lock) whenever :attr:`acked` grew (the
        #: replica's role file publishes it to its gRPC workers: :mod:`.role_publisher`).
        self.on_acked = None

    @property
    def acked(self) -> int:
        """The CommitLog end ``min_insync_replicas`` replicas hold (-1: not known yet)."""
        return self._acked

    def ends(self) -> dict[str, int]:
        with self._cond:
            return dict(self._ends)

    def report(self, replica: str | None, end: int) -> None:
        """Follower ``replica`` holds the leader's CommitLog up to ``end`` (durably as its
        flush mode says)."""
        if replica not in self.followers:
            return
        with self._cond:
            self._ends[replica] = int(end)
            ends = sorted(self._ends.values(), reverse=True)
            acked = ends[self.needed - 1] if len(ends) >= self.needed else -1
            grew = acked > self._acked
            self._acked = acked
            if grew:
                self._cond.notify_all()
        if grew and self.on_acked is not None:
            self.on_acked()

    def close(self) -> None:
        """The replica stopped leading: every writer waiting now, or later, stops waiting
        (and fails in :meth:`wait`'s leadership check)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, end: int) -> None:
        """Return once :attr:`acked` reaches ``end`` and the replica still leads;
        :class:`ReplicaAckTimeoutError` past the timeout, and ``still_leading``'s error
        (:class:`~store.base.errors.LeaderDeposedError`) when it no longer leads."""
        if self.exempt():
            return
        if self._acked < end:
            self._wait(end)
        self.still_leading()
        if self._closed:  # (closed, yet leading again: a later term's acks were not these)
            raise LeaderDeposedError(
                f"the write ending at CommitLog offset {end} waited for its copies while its "
                "replica changed role; it was not acknowledged and may or may not survive; "
                "allowed: retry on the leader (with a key, to recognise a duplicate)")

    def _wait(self, end: int) -> None:
        self.signal.notify()
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while self._acked < end and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.timeouts += 1
                    raise ReplicaAckTimeoutError(
                        f"the write ending at CommitLog offset {end} was appended on the leader "
                        f"but {self.needed + 1} replicas (min_insync_replicas, the leader "
                        f"counted) did not hold it within {self.timeout_s * 1000:.0f} ms "
                        f"(followers hold up to {self._ends or 'nothing reported'}); it was "
                        "not acknowledged and may or may not survive a change of leader: "
                        "retry it (with a key to recognise a duplicate)")
                self._cond.wait(left)
