"""The one door through which a running replica changes role: :func:`become_leader` and
:func:`become_follower`, called by the election (:mod:`.election`) when the voters name a
leader.

A new leader stops copying, records its term (the epoch, starting at its CommitLog end) in
its epoch file and ``config/replication.json``; from then on the server's loop runs the
leader's services and the service takes writes, each for as long as the replica leads
(:meth:`~store.replication.replica.Replica.leading`).  A new follower stops copying its old
leader, if any, and copies the named one (its tail is not cut: a replica whose log is not a
prefix of the new leader's reports itself diverged).
"""

from __future__ import annotations

import logging

from ..files.epoch_file import read_epochs, with_term, write_epochs

log = logging.getLogger("store.replication")


def become_leader(replica, epoch: int) -> None:
    """Make ``replica`` (a :class:`~store.replication.replica.Replica`) the leader of term
    ``epoch``."""
    _stop_following(replica)
    end = replica.store.confirmed_offset()
    terms = read_epochs(replica.store.root)
    if not terms or terms[-1][0] < epoch:
        write_epochs(replica.store.root, with_term(terms, epoch, end if terms else 0))
    replica.epoch, replica.leader, replica.role = epoch, replica.me, "leader"
    replica._write_state()
    log.warning("%s leads its replica set in epoch %d from CommitLog offset %d", replica.me,
                epoch, end)


def become_follower(replica, leader: str, epoch: int) -> None:
    """Make ``replica`` a follower of ``leader`` (a URL) in term ``epoch``."""
    replica.lease_until = 0.0  # (first: no write is taken from here on)
    was = replica.role
    _stop_following(replica)
    replica.epoch, replica.leader, replica.role = max(replica.epoch, epoch), leader, "follower"
    replica._write_state()
    replica.follow()
    log.warning("%s follows %s in epoch %d (was %s)", replica.me, leader, epoch, was)


def _stop_following(replica) -> None:
    follower, replica.follower = replica.follower, None
    if follower is not None:
        follower.stop()
