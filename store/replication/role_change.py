"""The door through which an election changes a running replica's role:
:func:`become_leader` and :func:`become_follower`, called by the election
(:meth:`~store.replication.election.Voter._lease_step`) when the voters name a leader.

Both go to the replica's own role changes, the same ones ``rmq promote`` on a running
follower uses (:meth:`~store.replication.replica.Replica.become_leader` and
:meth:`~store.replication.replica.Replica.become_follower`), so that an elected change of
leader does everything a promotion does, under the lock a server step holds:

* a new leader stops copying, records its term (the epoch, starting at its CommitLog end)
  in its epoch file and ``config/replication.json``, sets the services' progress files
  aside (rebuilt from its log), has the gRPC face's consumer groups take the newest copy
  of their progress (:mod:`.consumer_progress`), and installs the synchronous acks (``min_insync_replicas``
  above 1); from then on the server's loop runs the leader's services and the service takes
  writes, each for as long as the replica leads
  (:meth:`~store.replication.replica.Replica.leading`: its lease).  The election forces the
  promotion: its choice of the replica (the highest ``(epoch, end)`` among enough reachable
  replicas, :mod:`.election`) is what keeps acknowledged messages, not the old leader's end
  as this replica last heard it (which counts bytes never acknowledged);
* a new follower drops its lease, fails the writers waiting for their copies, drops its
  acks, sets its progress files aside, and copies the named leader; at the first contact it
  cuts the tail the new leader's history does not hold, set aside under
  ``config/truncated/`` (:mod:`.truncation`).
"""

from __future__ import annotations

import logging

log = logging.getLogger("store.replication")


def become_leader(replica, epoch: int) -> None:
    """Make ``replica`` (a :class:`~store.replication.replica.Replica`) the leader of term
    ``epoch``."""
    done = replica.become_leader(epoch=epoch, force=True)
    log.warning("%s leads its replica set in epoch %d from CommitLog offset %d", replica.me,
                epoch, done["start_offset"])


def become_follower(replica, leader: str, epoch: int) -> None:
    """Make ``replica`` a follower of ``leader`` (a URL) in term ``epoch``."""
    was = replica.role
    replica.become_follower(leader, epoch=epoch)
    log.warning("%s follows %s in epoch %d (was %s)", replica.me, leader, epoch, was)
