"""A replica's role shared with the worker processes of its gRPC endpoint
(``rmq serve --grpc-processes N`` on a replica set's member).

A worker (:mod:`store.proxy.processes`) appends to the replica's directory itself, under the
store's append lock, but the two things that make a replica's writes safe live in the
server's process (the **primary**): the refusal of its own appends while it does not lead
(:attr:`~store.core.appender.Appender.not_leading`, set under the append lock at each change
of role) and the wait for ``min_insync_replicas`` copies (:mod:`.acks`).  The primary therefore
publishes both in ``config/replica.role`` (:mod:`store.files.replica_role`), which every
worker maps, and a worker applies them to its own appends
(:mod:`store.proxy.worker_role`):

* **the role, under the append lock**: a change of role publishes *not leading* (and the new
  epoch) while it holds the append lock, in the step that sets ``not_leading``
  (:meth:`~store.replication.replica.Replica._refuse_writes`); a new leader publishes
  *leading* in its new epoch before it takes writes.  A worker checks the file under the same
  lock before it appends (leading, its lease alive), so no append of a worker comes between
  a change of role and the check, as none of the primary's does;
* **the acknowledged end**: each time the followers' reports move it (:attr:`InSyncAcks.acked
  <.acks.InSyncAcks.acked>`), so a worker acknowledges a write once that end covers it, in
  the epoch the write was appended in (a change of role in between: deposed, never
  acknowledged);
* **a lease**: while the replica leads, the primary moves the file's lease
  :data:`~store.files.replica_role.LEASE_MS` ahead every
  :data:`~store.files.replica_role.RENEW_MS` (elected, never past the replica's own lease,
  :meth:`~store.replication.replica.Replica.leading`), and a worker takes and acknowledges
  writes only within it.  A primary killed or frozen (which can no longer change the role it
  published) leaves its workers acknowledging for ``LEASE_MS`` at most; killed, its workers
  end as their standard input closes.

Every publication computes the whole role from the replica under one lock, so a renewal
racing a change of role never publishes a role older than the change.
"""

from __future__ import annotations

import threading

from ..files.replica_role import LEASE_MS, RENEW_MS, RoleFile, monotonic_ms


class RolePublisher:
    """Publishes ``replica``'s role (a :class:`~store.replication.replica.Replica`) in its
    store's role file, now and every :data:`~store.files.replica_role.RENEW_MS` until
    :meth:`close` (see the module docstring)."""

    def __init__(self, replica) -> None:
        self.replica = replica
        self.file = RoleFile.create(replica.store.root)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self.publish()
        self._thread = threading.Thread(target=self._renew, name="rmq-replica-role",
                                        daemon=True)
        self._thread.start()

    def publish(self) -> None:
        """Write the replica's role as it is now (its epoch, whether it leads, the lease, the
        acknowledged end)."""
        replica = self.replica
        with self._lock:
            if self._closed:
                return
            now = monotonic_ms()
            leading = replica.role == "leader" and replica.store.appender.not_leading is None
            lease = now + LEASE_MS
            if replica.elected:  # (never past the lease the voters gave)
                lease = min(lease, now + int((replica.lease_until - replica.clock()) * 1000))
            acks = replica.acks
            self.file.write(replica.epoch, leading, lease if leading else 0,
                            -1 if acks is None else acks.acked)

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_MS / 1000):
            self.publish()

    def close(self) -> None:
        """Stop renewing and publish *not leading* (the workers refuse from now on)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.file.write(self.replica.epoch, False, 0, -1)
            self.file.close()


__all__ = ["RolePublisher"]
