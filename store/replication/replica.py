"""One served store as a member of a replica set: its role, its epoch, and what it refuses.

:class:`Replica` is what :class:`~store.operations.server.StoreServer` holds when it is given
a replica-set file (:mod:`.replica_set`):

* the **leader** takes writes and runs the store's services (delivery of delayed messages,
  recurring schedules, transaction check rounds, retention), and answers its followers'
  ``replicate`` requests (:mod:`store.remote.replication_stream`), noting how far each has come;
* a **follower** copies the leader's CommitLog (:class:`.follower.Follower`), serves reads of
  what it holds, runs none of those services, and refuses every write with
  :class:`~store.base.errors.NotLeaderError` naming the leader.

The role and the epoch are recorded in ``config/replication.json`` (written atomically at
start: ``role``, ``epoch``, ``leader``, ``self``, ``replicas``), so ``rmq stats`` shows them for
a stopped store too.  The epoch starts at 1 and grows by one whenever a start finds another
leader recorded than the file names; ``rmq promote`` (:mod:`store.operations.promotion`)
starts a new one.  A leader records each term it starts, with the CommitLog offset it starts
at, in its epoch file (:mod:`store.files.epoch_file`); a follower keeps a copy of its
leader's (asked with ``epochs`` at each connection).
"""

from __future__ import annotations

import json
import os
import threading
import time

from ..base.errors import InvalidConfigError, NotLeaderError, StoreError
from ..files.epoch_file import read_epochs, with_term, write_epochs
from ..files.fileio import atomic_write
from .follower import Follower
from .replica_set import ReplicaSet

STATE_FILE = os.path.join("config", "replication.json")
#: Actions a follower answers (reads; ``deliver_due`` delivers nothing there, as its leader
#: delivers, so that readers asking for delivery, Spark's ``deliverDue`` and ``rmq tail``,
#: read a follower as they read any store); every other call is a write, refused.
READ_ACTIONS = frozenset({"info", "snapshot", "offset_for_timestamp", "query_messages",
                          "view_message", "schedules", "known_transactions",
                          "last_check_round", "flush", "epochs", "deliver_due",
                          "leader"})
#: Followers a leader keeps note of (the most recently seen).
MAX_NOTED_FOLLOWERS = 64


def read_state(root: str) -> dict | None:
    """The recorded ``config/replication.json`` of the store at ``root`` (``None``: none, or
    unreadable)."""
    try:
        with open(os.path.join(root, STATE_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Replica:
    """``store`` (an open :class:`~store.MessageStore`) as the member ``me`` (a URL) of
    ``replica_set``; ``credentials``: what a follower presents to its leader (``token`` or
    ``account`` with ``secret_file``, as :class:`~store.remote.flight_client.RemoteStore` takes)."""

    def __init__(self, store, replica_set: ReplicaSet, me: str, *, clock=time.monotonic,
                 **credentials) -> None:
        self.store = store
        self.clock = clock  # monotonic seconds: the lease's clock
        self.replica_set = replica_set
        self.me = me
        self.elected = replica_set.elected
        #: while elected: acknowledge writes until this monotonic time (:mod:`.election`)
        self.lease_until = 0.0
        self.voter = None
        recorded = read_state(store.root) or {}
        if self.elected:  # a follower of nobody until the voters name the leader
            self._init_elected(recorded)
        else:
            self._init_static(recorded)
        self._write_state()
        self._credentials = credentials
        self.follower: Follower | None = None
        self._asked: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def _init_elected(self, recorded: dict) -> None:
        self.leader = None
        self.role = "follower"
        epoch = recorded.get("epoch")
        self.epoch = epoch if isinstance(epoch, int) and epoch >= 1 else 1
        self._promoted = False

    def _init_static(self, recorded: dict) -> None:
        replica_set, me, store = self.replica_set, self.me, self.store
        self.leader = replica_set.leader
        self.role = "leader" if me == self.leader else "follower"
        if recorded.get("promoted") and recorded.get("leader") == me and self.leader != me:
            raise InvalidConfigError(
                f"{me} was promoted to leader (epoch {recorded.get('epoch')}), but the "
                f"replica-set file {replica_set.path} names {self.leader}; allowed: the file's "
                f"\"leader\" set to {me} on every replica (or the other leader promoted)")
        epoch = recorded.get("epoch")
        epoch = epoch if isinstance(epoch, int) and epoch >= 1 else 1
        if recorded.get("leader") not in (None, self.leader):
            epoch += 1
        terms = read_epochs(store.root)
        if self.role == "leader":  # its term starts where its log ends (the first: at 0)
            epoch = max(epoch, terms[-1][0] if terms else 1)
            if not terms or terms[-1][0] < epoch:
                write_epochs(store.root, with_term(
                    terms, epoch, store.confirmed_offset() if terms else 0))
        self.epoch = epoch
        self._promoted = bool(recorded.get("promoted")) and self.role == "leader"

    def _write_state(self) -> None:
        state = {"role": self.role, "epoch": self.epoch, "leader": self.leader,
                 "self": self.me, "replicas": list(self.replica_set.replicas)}
        if self._promoted:
            state["promoted"] = True
        atomic_write(os.path.join(self.store.root, STATE_FILE),
                     json.dumps(state, sort_keys=True).encode())

    def leader_epochs(self, answer: dict) -> None:
        """Keep the leader's terms (its ``epochs`` answer) as this follower's: its epoch
        file and recorded epoch."""
        terms = [tuple(t) for t in answer.get("epochs") or []]
        if terms:
            write_epochs(self.store.root, terms)
        epoch = answer.get("epoch")
        if isinstance(epoch, int) and epoch != self.epoch:
            self.epoch = epoch
            self._write_state()

    def epochs_answer(self) -> dict:
        """What a follower asking ``epochs`` gets: this replica's epoch and terms; and what
        an election asks (:mod:`.election`): its CommitLog ``end``, the epoch of its last
        term (``last_epoch``), its follower ``state``."""
        terms = read_epochs(self.store.root)
        return {"epoch": self.epoch, "epochs": [list(t) for t in terms],
                "end": self.store.confirmed_offset(),
                "last_epoch": terms[-1][0] if terms else 0,
                "state": None if self.follower is None else self.follower.state,
                "elected_epoch": None if self.voter is None else self.voter.raft.epoch}

    def leader_answer(self) -> dict:
        """Who leads, as this replica knows (the ``leader`` action clients ask)."""
        return {"leader": self.leader, "epoch": self.epoch, "self": self.me,
                "leading": self.leading()}

    def leading(self) -> bool:
        """Whether this replica takes writes now: the leader, and (elected) within its
        lease."""
        return self.role == "leader" and (
            not self.elected or self.clock() < self.lease_until)

    @property
    def is_follower(self) -> bool:
        return not self.leading()

    def start(self) -> None:
        """Start copying the leader (a follower; a leader has nothing to start); elected,
        start voting (:mod:`.election`), which makes it leader or follower."""
        if self.elected:
            from .election import Voter

            self.voter = Voter(self.replica_set, self.me, replica=self, probe=self._probe,
                               journal_dir=os.path.join(self.store.root, "config", "raft"),
                               clock=self.clock)
            self.voter.start()
        elif self.role == "follower" and self.follower is None:
            self.follow()

    def follow(self) -> None:
        """Start copying :attr:`leader` (the role-change door, :mod:`.role_change`)."""
        from ..remote.flight_client import RemoteStore

        self.follower = Follower(self.store, RemoteStore(self.leader, **self._credentials),
                                 on_epochs=self.leader_epochs)
        self.follower.start()

    def _probe(self, url: str) -> dict:
        """The position of replica ``url`` for an election (itself: without a call)."""
        if url == self.me:
            answer = self.epochs_answer()
            return {**answer, "epoch": answer["last_epoch"]}
        return probe_replica(url, self._credentials)

    def stop(self) -> None:
        if self.voter is not None:
            self.voter.stop()
        if self.follower is not None:
            self.follower.stop()

    def check_write(self, what: str) -> None:
        """Refuse a write unless leading (:class:`NotLeaderError` naming the leader)."""
        if self.leading():
            return
        if self.role == "leader":
            raise NotLeaderError(f"{what}: {self.me} lost its lease as leader of its replica "
                                 "set (the voters did not renew it in time) and takes no "
                                 "writes; allowed: writes to the newly elected leader")
        if self.leader is None:
            raise NotLeaderError(f"{what}: {self.me} is a replica of a set with no elected "
                                 "leader yet; allowed: writes to the leader, once elected")
        raise NotLeaderError(f"{what}: {self.me} is a follower of its replica set and "
                             f"takes no writes; allowed: writes to the leader {self.leader}")

    def check_action(self, name: str) -> None:
        if name not in READ_ACTIONS:
            self.check_write(name)

    def follower_asked(self, peer: str, offset: int) -> None:
        """A follower at ``peer`` asked for the log from ``offset`` (its end)."""
        with self._lock:
            self._asked[peer] = (offset, time.monotonic())
            if len(self._asked) > MAX_NOTED_FOLLOWERS:
                oldest = min(self._asked, key=lambda p: self._asked[p][1])
                del self._asked[oldest]

    def status(self) -> dict:
        """``role``, ``epoch``, ``leader``, ``self``, ``lag_bytes`` and ``lag_messages``
        (a leader's: 0; a follower's: see :mod:`.follower`), and for a leader its followers'
        last requests."""
        out = {"role": self.role, "epoch": self.epoch, "leader": self.leader, "self": self.me}
        if self.voter is not None:
            out.update(self.voter.status(), leading=self.leading())
        if self.follower is not None:
            out.update(self.follower.status())
            return out
        end = self.store.confirmed_offset()
        now = time.monotonic()
        with self._lock:
            asked = dict(self._asked)
        out.update(lag_bytes=0, lag_messages=0, end=end, followers=[
            {"peer": peer, "end": offset, "lag_bytes": max(0, end - offset),
             "seen_s_ago": round(now - seen, 3)} for peer, (offset, seen) in sorted(asked.items())])
        return out


def probe_replica(url: str, credentials: dict) -> dict:
    """Replica ``url``'s position for an election: its ``epochs`` answer with ``epoch`` the
    epoch of its last term, within :data:`~store.replication.election.PROBE_TIMEOUT_S` (a
    :class:`StoreError` otherwise)."""
    from ..remote.flight_client import RemoteStore
    from .election import PROBE_TIMEOUT_S

    with RemoteStore(url, timeout_s=PROBE_TIMEOUT_S, **credentials) as remote:
        answer = remote.replica_epochs()
    return {**answer, "epoch": answer.get("last_epoch", 0)}


def replication_status(root: str, server: dict | None) -> dict | None:
    """What ``rmq stats`` shows of a replica-set member: the recorded role, epoch and leader
    (``config/replication.json``) and, while a server runs it (``server``: what
    :func:`~store.server_status` read), its live figures (``lag_bytes``, ``lag_messages``,
    ``state``, ...); stopped, ``lag_bytes`` and ``lag_messages`` are ``None``.  ``None`` for
    a store that was never a member."""
    state = read_state(root)
    if state is None:
        return None
    out = {"role": state.get("role"), "epoch": state.get("epoch"), "leader": state.get("leader"),
           "self": state.get("self"), "running": False, "lag_bytes": None, "lag_messages": None,
           "promoted": bool(state.get("promoted"))}
    try:
        out["epochs"] = [list(t) for t in read_epochs(root)]
    except StoreError as exc:  # a damaged epoch file is shown, not fatal to stats
        out["epochs"] = None
        out["epochs_error"] = str(exc)
    live = (server or {}).get("replication") if (server or {}).get("attached") else None
    if isinstance(live, dict):
        out.update(live, running=True)
    return out
