"""A worker process of a replica's gRPC endpoint appending as its primary would
(``rmq serve --grpc-processes N`` on a replica set's member, :mod:`store.proxy.processes`).

Every process but the replica's server is refused appends to a replica's directory
(:func:`~store.files.replication_state.writer_refusal`): only the server knows whether the
replica leads and when enough replicas hold a write.  A worker of the server's own endpoint is
the one exception, and only in the mode its primary starts it in (its settings on the
worker's standard input; nothing else enters it): :class:`WorkerRole` lifts the refusal and
puts in its place the role the primary publishes (:mod:`store.files.replica_role`,
:mod:`store.replication.role_publisher`):

* **under the append lock** (:attr:`~store.core.appender.Appender.lead_check`), each append
  is refused (:class:`~store.base.errors.LeaderDeposedError`) unless the file says the
  replica leads and its lease has not run out: the primary publishes a change of role while
  it holds that lock, so a worker's append is never made after a change it did not see;
* **after the append** (synchronous replication: ``min_insync_replicas`` above 1), the write
  is acknowledged once the published acknowledged end covers it, in the epoch it was
  appended in and within the lease; a change of epoch or of role meanwhile fails it as
  deposed, and past the replica set's ``replica_ack_timeout_ms`` it fails with
  :class:`~store.base.errors.ReplicaAckTimeoutError` (as the primary's own writes do,
  :mod:`store.replication.acks`).  The wait reads the mapped file between short sleeps
  growing from :data:`FIRST_PAUSE_S` to :data:`MAX_PAUSE_S` (a read costs a few
  microseconds); one wait covers a whole group of sends (:class:`~store.proxy.aio_calls.
  GroupCommit`), in a thread of its own, off the worker's event loop.

The service's checks read the same file (:meth:`WorkerRole.check_write`, as
:meth:`~store.replication.replica.Replica.check_write`), and a worker whose replica does
not lead passes sends, routes and assignments on to its primary, which answers them as the
replica's face does (a follower passes them on to its leader, :mod:`.follower_calls`).
"""

from __future__ import annotations

import time

from ..base.errors import LeaderDeposedError, NotLeaderError, ReplicaAckTimeoutError
from ..files.replica_role import RoleFile, monotonic_ms

#: The first and the longest sleep between two looks at the acknowledged end (s).
FIRST_PAUSE_S = 0.0002
MAX_PAUSE_S = 0.004


class WorkerRole:
    """The role of the replica whose store ``store`` (open in this worker process) is, as
    its primary publishes it; installed on the store at once (see the module docstring).

    ``min_insync_replicas`` and ``replica_ack_timeout_ms``: the replica set's;
    ``routes``: the primary's route answers' endpoints (serialized ``Endpoints``), which name
    every replica."""

    def __init__(self, store, *, min_insync_replicas: int, replica_ack_timeout_ms: int,
                 routes: bytes | None = None) -> None:
        self.store = store
        self.file = RoleFile.open(store.root)
        self.synchronous = min_insync_replicas > 1
        self.timeout_s = replica_ack_timeout_ms / 1000
        self.routes = routes
        self._acks: TermAcks | None = None
        store.replica_acks = None
        store.appender.lead_check = self.lead_check
        store.appender.refusal = None  # (after the check is in: never a moment without it)

    def leading(self) -> bool:
        """Whether the replica takes writes now (as last published)."""
        return self.file.read().takes_writes(monotonic_ms())

    def check_write(self, what: str) -> None:
        """:class:`NotLeaderError` unless the replica takes writes now."""
        if not self.leading():
            raise NotLeaderError(f"{what}: this replica does not lead its replica set now (or "
                                 "its server stopped renewing its lease); allowed: writes to "
                                 "the leader")

    def lead_check(self) -> None:
        """Called under the append lock before each append: :class:`LeaderDeposedError`
        unless the replica takes writes; with synchronous replication, the appends of this
        step then wait for their copies in the epoch read here (:class:`TermAcks`)."""
        role = self.file.read()
        if not role.takes_writes(monotonic_ms()):
            raise LeaderDeposedError(
                "this replica does not lead its replica set now (epoch "
                f"{role.epoch}{'' if role.leading else ', not leading'}, its lease "
                f"{'ran out' if role.leading else 'dropped'}): the write was not stored nor "
                "acknowledged; allowed: retry on the leader (with a key, to recognise a "
                "duplicate)")
        if self.synchronous:
            acks = self._acks
            if acks is None or acks.epoch != role.epoch:
                acks = self._acks = TermAcks(self.file, role.epoch, self.timeout_s)
            self.store.replica_acks = acks  # (read under the lock by the core)


class TermAcks:
    """What a worker's appends of epoch ``epoch`` wait for (a
    :class:`~store.core.ports.ReplicaAcks`: see the module docstring)."""

    def __init__(self, file: RoleFile, epoch: int, timeout_s: float) -> None:
        self.file = file
        self.epoch = epoch
        self.timeout_s = timeout_s

    def wait(self, end: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        pause = FIRST_PAUSE_S
        while True:
            role = self.file.read()
            if role.epoch != self.epoch or not role.leading:
                raise LeaderDeposedError(
                    f"the write ending at CommitLog offset {end} was appended in epoch "
                    f"{self.epoch}, but its replica changed role before enough replicas held "
                    f"it (now epoch {role.epoch}, {'leading' if role.leading else 'not leading'}"
                    "); it was not acknowledged and may or may not survive; allowed: retry on "
                    "the leader (with a key, to recognise a duplicate)")
            held = role.acked_end >= end
            if held and monotonic_ms() < role.lease_until_ms:
                return
            if time.monotonic() >= deadline:
                if held:
                    raise LeaderDeposedError(
                        f"the write ending at CommitLog offset {end} was copied, but its "
                        "replica's server stopped renewing the lease of its worker processes "
                        "(frozen, or ended); it was not acknowledged and may or may not "
                        "survive; allowed: retry on the leader (with a key)")
                raise ReplicaAckTimeoutError(
                    f"the write ending at CommitLog offset {end} was appended on the leader "
                    f"but min_insync_replicas replicas did not hold it within "
                    f"{self.timeout_s * 1000:.0f} ms (they hold up to {role.acked_end}); it "
                    "was not acknowledged and may or may not survive a change of leader: "
                    "retry it (with a key to recognise a duplicate)")
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)


__all__ = ["TermAcks", "WorkerRole"]
