"""Automatic election of a replica set's leader, on the Raft of ``pysyncobj``.

The voters are the data replicas and the witness (``rmq serve --witness``), each running one
:class:`Voter`: a ``pysyncobj`` node on its own TCP port (the replica-set file's ``raft``,
or the URL's port + 1).  Raft (pysyncobj's, not ours) chooses a Raft leader among the
voters and replicates a tiny state, :class:`LeaderState`: the data leader's URL and epoch.
Three rules sit on it:

* **Who is chosen.**  Raft's own election knows nothing of our CommitLog, so the Raft leader
  does not make itself the data leader: when no data leader holds a lease, it asks every
  data replica it can reach for its position (its CommitLog end, the epoch of the last term
  it holds bytes of, whether it diverged) and commits ``set_leader(url, epoch)`` naming the
  one with the highest ``(epoch, end)`` (ties: the file's order) in the epoch after every
  one it saw.  The epoch compared is the last term starting at or below the replica's end
  (:func:`~store.files.epoch_file.held_epoch`), not merely the last term in its epoch file:
  a follower copies its leader's terms before their bytes, and one that has the newest term
  on file but not yet its leader's older bytes must not win over one that holds them.
  With synchronous replication (``min_insync_replicas`` m of n replicas) the choice is
  made only once n - m + 1 replicas answered (:meth:`Voter.quorum`; with 2 replicas and
  m = 2: one), so that the answers include a holder of every acknowledged message; the
  replica with the highest ``(epoch, end)`` then holds it too: a replica holding bytes of a
  later term copied them from a leader that held the message when elected, and those of
  the message's own term are prefixes of its one leader's log, the longest holding the
  most.  With asynchronous replication one answer suffices, and the chosen one holds what
  was copied.
* **The lease.**  The named replica leads only while it holds a lease: it commits
  ``renew(url, epoch)`` through the Raft log every ``election_timeout_ms / 5`` and, when the
  voters committed it, acknowledges writes until ``sent + LEASE_SHARE * timeout``
  (monotonic, its own clock).  When a renewal fails (no majority: it was cut off, or
  another was named) the lease runs out and every write is refused at once
  (:class:`~store.base.errors.NotLeaderError`).
* **Deposing.**  The Raft leader names another replica only once it applied no renewal of
  the named one for a whole ``election_timeout_ms`` (after a ``ping`` committed in its own
  term, so that it applied every renewal the voters committed).  A renewal is applied after
  it was sent, so the deposed leader's lease ran out before: two replicas never acknowledge
  in the same instant (clocks running at the same rate; :data:`LEASE_SHARE` keeps a margin).

Role changes go through :mod:`.role_change` (one place).  The Raft journal of a data replica
is kept in its store (``config/raft/``); a witness keeps its own in memory, or in
``--store DIR`` when given.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ..base.errors import StoreError

log = logging.getLogger("store.replication.election")

#: The share of ``election_timeout_ms`` a leader acknowledges for after a renewal was sent
#: (the rest is a margin for clock rates and the deposer's tick).
LEASE_SHARE = 0.8
#: Renewals per ``election_timeout_ms``.
RENEWALS_PER_TIMEOUT = 5
#: How often a voter looks at its state (s).
TICK_S = 0.05
#: Bound on asking one replica for its position (s).
PROBE_TIMEOUT_S = 0.5



def _import_pysyncobj():
    """Import pysyncobj keeping the ``socket`` module as it was: one of its dependencies
    (win_inet_pton) may replace ``socket.inet_ntop``/``inet_pton`` with Windows-only
    versions, which broke every later IPv6 address formatting in the process."""
    import socket

    saved = socket.inet_ntop, socket.inet_pton
    try:
        import pysyncobj
    finally:
        socket.inet_ntop, socket.inet_pton = saved
    return pysyncobj


def raft_conf(timeout_s: float, journal_dir: str | None, bind: str | None = None):
    """pysyncobj's settings for an election timeout of ``timeout_s``: Raft elects its own
    leader in 0.4 to 0.8 of it, so that a lost Raft leader is replaced before the data
    leader's lease is even due.  ``bind``: the Raft port's ``HOST:PORT`` (pysyncobj binds
    every interface otherwise)."""
    _import_pysyncobj()
    from pysyncobj import SyncObjConf

    conf = {"raftMinTimeout": 0.4 * timeout_s, "raftMaxTimeout": 0.8 * timeout_s,
            "appendEntriesPeriod": min(0.1, timeout_s / 10), "connectionRetryTime": 0.5,
            "connectionTimeout": max(0.5, timeout_s), "leaderFallbackTimeout": 0.8 * timeout_s,
            "commandsWaitLeader": False, "logCompactionMinEntries": 2000,
            "logCompactionMinTime": 60, "dynamicMembershipChange": False, "bindAddress": bind}
    if journal_dir is not None:
        os.makedirs(journal_dir, exist_ok=True)
        conf.update(journalFile=os.path.join(journal_dir, "journal"),
                    fullDumpFile=os.path.join(journal_dir, "dump"))
    return SyncObjConf(**conf)


def _state_class():
    _import_pysyncobj()
    from pysyncobj import SyncObj, replicated

    class LeaderState(SyncObj):
        """The replicated state: the data leader's URL and epoch (see the module doc)."""

        #: the replicated state (instance attributes once set: pysyncobj saves those set after
        #: its __init__ and restores them from its dump file in its first tick, which may
        #: run before this __init__ returns: so no default is assigned there)
        leader: str | None = None
        epoch = 0

        def __init__(self, me: str, others: list[str], conf, on_change) -> None:
            # (attributes set before SyncObj's __init__ are local, not replicated)
            self.on_change = on_change
            self.confirmed_at = 0.0  # when this voter applied the last set_leader/renew
            super().__init__(me, others, conf)

        @replicated
        def set_leader(self, url: str, epoch: int) -> bool:
            if epoch <= self.epoch:
                return False
            self.leader, self.epoch = url, epoch
            self.confirmed_at = time.monotonic()
            self.on_change()
            return True

        @replicated
        def renew(self, url: str, epoch: int) -> bool:
            ok = url == self.leader and epoch == self.epoch
            if ok:
                self.confirmed_at = time.monotonic()
            return ok

        @replicated
        def ping(self) -> bool:
            return True

    return LeaderState


class Voter:
    """One voter of ``replica_set``: the data replica ``replica``
    (:class:`~store.replication.replica.Replica`) or, with ``replica=None``, the witness
    ``me``.  ``probe(url)`` answers a replica's position (``{"epoch": .., "end": ..,
    "state": ..}``) or raises :class:`StoreError`; ``clock``: monotonic seconds."""

    def __init__(self, replica_set, me: str, *, replica=None, probe=None,
                 journal_dir: str | None = None, clock=time.monotonic) -> None:
        self.replica_set = replica_set
        self.me = me
        self.replica = replica
        self.probe = probe
        self.clock = clock
        self.timeout_s = replica_set.election_timeout_ms / 1000
        self.elections = 0
        #: The epoch the voters name this replica in but it cannot take (see :meth:`_takes`).
        self._stale_term: int | None = None
        self._stop = threading.Event()
        self._changed = threading.Event()
        others = [replica_set.raft_address(u) for u in replica_set.voters if u != me]
        mine = replica_set.raft_address(me)
        self.raft = _state_class()(mine, others, raft_conf(self.timeout_s, journal_dir, mine),
                                   self._changed.set)
        self._threads = [threading.Thread(target=self._loop, args=(step,), daemon=True,
                                          name=f"rmq-{name}")
                         for name, step in (("elector", self._elect_step),
                                            ("lease", self._lease_step))]

    def start(self) -> Voter:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(5)
        self.raft.destroy()

    def status(self) -> dict:
        """The replicated leader and epoch, and this voter's Raft role."""
        raft = self.raft
        leader = raft._getLeader()
        return {"elected_leader": raft.leader, "elected_epoch": raft.epoch,
                "raft_leader": None if leader is None else str(leader.address),
                "raft_role": "leader" if raft._isLeader() else "follower",
                "elections": self.elections}

    def _loop(self, step) -> None:
        refused = None  # (the refusal last logged: one line each, not one per step)
        while not self._stop.is_set():
            try:
                step()
                refused = None
            except StoreError as exc:  # a refusal of the store's: its message says why
                if str(exc) != refused:
                    log.warning("election step refused, retried every %.1f s: %s",
                                self.timeout_s, exc)
                refused = str(exc)
                self._stop.wait(self.timeout_s)
            except Exception:  # a bug must not end the server: logged, retried
                log.exception("election step failed")
                self._stop.wait(self.timeout_s)
            self._stop.wait(TICK_S)

    # ------------------------------------------------------------------ the Raft leader
    def _elect_step(self) -> None:
        raft = self.raft
        if not raft._isLeader() or not self._leaderless():
            return
        from pysyncobj import SyncObjException

        try:  # every renewal the voters committed is applied here once this is
            raft.ping(sync=True, timeout=self.timeout_s)
        except SyncObjException:
            return
        if not raft._isLeader() or not self._leaderless():
            return
        best, epoch = self._choose()
        if best is None:
            return
        try:
            done = raft.set_leader(best, epoch, sync=True, timeout=self.timeout_s)
        except SyncObjException:
            return
        if done:
            self.elections += 1
            log.warning("elected %s leader of the replica set in epoch %d", best, epoch)

    def _leaderless(self) -> bool:
        raft = self.raft
        return raft.leader is None or self.clock() - raft.confirmed_at > self.timeout_s

    def _choose(self) -> tuple[str | None, int]:
        """The reachable replica with the highest ``(held epoch, end)``, and the next epoch;
        nobody while fewer replicas answer than :meth:`quorum` asks."""
        seen, top = [], self.raft.epoch
        for rank, url in enumerate(self.replica_set.replicas):
            try:
                position = self.probe(url)
            except StoreError as exc:
                log.info("election: %s not reachable (%s)", url, exc)
                continue
            epoch, end = int(position.get("epoch") or 0), int(position.get("end") or 0)
            top = max(top, epoch, int(position.get("elected_epoch") or 0))  # (epochs once)
            if position.get("state") == "diverged":
                continue
            held = position.get("held_epoch")
            seen.append(((epoch if held is None else int(held), end, -rank), url))
        if len(seen) < self.quorum():
            if seen:
                log.warning("election: %d replica(s) answered, %d needed to be sure of "
                            "holding every acknowledged message (min_insync_replicas %d of "
                            "%d): no leader named yet", len(seen), self.quorum(),
                            self.replica_set.min_insync_replicas,
                            len(self.replica_set.replicas))
            return None, top
        return max(seen)[1], top + 1

    def quorum(self) -> int:
        """How many replicas must answer before one is named: with synchronous replication
        every acknowledged message is on ``min_insync_replicas`` (m) of the n replicas, so
        any n - m + 1 of them include one that holds it; asynchronous (m = 1), any one (what
        was acknowledged but not copied is lost then, as the docs say)."""
        m, n = self.replica_set.min_insync_replicas, len(self.replica_set.replicas)
        return 1 if m <= 1 else n - m + 1

    # ------------------------------------------------------------------ a data replica
    def _lease_step(self) -> None:
        if self.replica is None:
            return
        from . import role_change

        raft = self.raft
        leader, epoch = raft.leader, raft.epoch
        if leader is None:
            return
        if leader == self.me and not self._takes(epoch):
            return
        if leader != self.me:
            self._changed.clear()
            self.replica.lease_until = 0.0
            if self.replica.role != "follower" or self.replica.leader != leader:
                role_change.become_follower(self.replica, leader, epoch)
            self._changed.wait(1.0 / RENEWALS_PER_TIMEOUT * self.timeout_s)
            return
        from pysyncobj import SyncObjException

        sent = self.clock()
        try:
            ok = raft.renew(self.me, epoch, sync=True, timeout=LEASE_SHARE * self.timeout_s / 2)
        except SyncObjException:
            ok = False
        if not ok:
            return  # the lease runs out on its own (Replica.leading)
        if self.replica.role != "leader" or self.replica.epoch != epoch:
            role_change.become_leader(self.replica, epoch)
        self.replica.lease_until = sent + LEASE_SHARE * self.timeout_s
        self._stop.wait(max(0.0, sent + self.timeout_s / RENEWALS_PER_TIMEOUT - self.clock()))

    def _takes(self, epoch: int) -> bool:
        """Whether this replica, named by the voters in ``epoch``, leads in it or can
        (:meth:`~store.replication.replica.Replica.takes_term`).  A leader restarted while
        the voters still name it in its old term cannot: it does not renew that term's
        lease (a renewal would keep the voters from naming anyone) and waits, with one
        warning, until they name a leader in a later epoch, which they do once no renewal
        came for ``election_timeout_ms``."""
        replica = self.replica
        if (replica.role == "leader" and replica.epoch == epoch) or replica.takes_term(epoch):
            self._stale_term = None
            return True
        if self._stale_term != epoch:
            self._stale_term = epoch
            log.warning("%s: the voters still name it leader in epoch %d, a term it held "
                        "before it restarted and does not take again; waiting for them to "
                        "name a leader in a later epoch (within election_timeout_ms, %d ms, "
                        "of the last renewal)", self.me, epoch, round(self.timeout_s * 1000))
        self._changed.clear()
        self._changed.wait(self.timeout_s / RENEWALS_PER_TIMEOUT)
        return False
