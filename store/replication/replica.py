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

With a witness the set **elects** its leader (:mod:`.election`): every replica starts as a
follower of nobody, and a leader takes writes only while its lease lasts
(:meth:`Replica.leading`); its epochs are the ones the voters name.

**Role changes** happen in two methods, whoever decides them (``rmq promote`` on a running
follower of a static set, an election through :mod:`.role_change`):
:meth:`Replica.become_leader` and :meth:`Replica.become_follower`, under one lock that a
server step holds too (:meth:`Replica.services`).  A leader with ``min_insync_replicas`` above 1 acknowledges a write once enough followers
hold it (:mod:`.acks`).  A former leader that follows cuts the tail its new leader's history
does not hold (:mod:`.truncation`).  Either change sets the services' progress files aside
(:func:`~store.replication.truncation.set_aside_service_progress`): they were not copied, and
a leader rebuilds them from its log, where every delivered copy names its origin, so that no
due message is delivered twice nor early.

The recurring schedules' book is recorded in the log
(:attr:`~store.schedule.schedule_book.ScheduleBook.replicated`, set here), so a follower
holds it and a new leader goes on with it.  Clients of a replica read only below its
**high watermark** (:mod:`.watermark`, :meth:`Replica.high_watermark`); a follower's
retention follows its leader's (:meth:`Replica.follow_retention`).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

from ..base.errors import (
    InvalidConfigError,
    LeaderDeposedError,
    NotLeaderError,
    StoreError,
)
from ..files.epoch_file import held_epoch, read_epochs, with_term, write_epochs
from ..files.replication_state import STATE_FILE, read_state, write_state
from ..remote.replication_stream import AppendSignal
from .acks import InSyncAcks
from .consumer_progress import ASK_TIMEOUT_S, ProgressCopy
from .follower import Follower
from .promote_request import refuse_if_behind
from .replica_set import ReplicaSet
from .truncation import cut_diverged_tail, set_aside_progress_of
from .watermark import HighWatermark

__all__ = ["STATE_FILE", "Replica", "read_state", "replication_status"]

#: Actions a follower answers (reads; ``deliver_due`` delivers nothing there, as its leader
#: delivers, so that readers asking for delivery, Spark's ``deliverDue`` and ``rmq tail``,
#: read a follower as they read any store); every other call is a write, refused.
READ_ACTIONS = frozenset({"info", "snapshot", "offset_for_timestamp", "query_messages",
                          "view_message", "schedules", "known_transactions",
                          "last_check_round", "flush", "epochs", "deliver_due",
                          "leader", "consumer_progress"})
#: How often a write whose copies came while its leader's lease had run out looks for a
#: renewal (s).
LEASE_POLL_S = 0.01
#: Followers a leader keeps note of (the most recently seen).
MAX_NOTED_FOLLOWERS = 64


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
        #: The highest high watermark known (:mod:`.watermark`), not past this log's end.
        self.watermark = HighWatermark(recorded.get("high_watermark"))
        self._state_lock = threading.Lock()  # (the state file: a step, a role change, ...)
        self.watermark.cut(store.confirmed_offset())
        if self.elected:  # a follower of nobody until the voters name the leader
            self._init_elected(recorded)
        else:
            self._init_static(recorded)
        self._credentials = credentials
        self.follower: Follower | None = None
        self._asked: dict[str, tuple[int, float]] = {}
        self._notes = threading.Lock()  # (the followers' last requests)
        self._lock = threading.RLock()  # (role changes, and a server step: see services)
        #: Wakes the followers' waiting requests when a writer waits for its copies.
        self.append_signal = AppendSignal()
        self.acks: InSyncAcks | None = None
        self._exempt = threading.local()
        #: Told ``"leader"`` or ``"follower"`` at each change of role, under the store's
        #: append lock (the gRPC face's consumer groups, :meth:`~store.proxy.consumers.
        #: ConsumerGroups.take_role`): a new leader's before it takes writes.
        self.role_listeners: list = []
        #: What the last cut of a diverged tail set aside (:mod:`.truncation`), if any.
        self.last_cut: dict | None = None
        #: Shares the role with the gRPC endpoint's worker processes (:meth:`share_role`).
        self.role_publisher = None
        store.appender.refusal = None  # (the server's process: its appends are waited for)
        # the recurring schedules' book is recorded in the log, and so copied
        store.recurring.replicated = True
        if self.role != "leader":
            self._refuse_writes()
        if self.role == "leader":
            self._install_acks()
            self._take_delay_keys()
            with self.services():  # (a book the log lacks yet: the followers get it)
                store.recurring.record()
        self._write_state()

    def _take_delay_keys(self) -> None:
        """A leader's timer drops the keyed messages that a later send replaced or a cancel
        cancelled (:mod:`store.timer.delay_keys`) only once its key table exists; a follower
        never made one (it sends nothing), so a new leader builds it from the timer topic
        it copied: one scan of that topic, at each change to leader (its file, if it
        had one, was set aside with the services' progress)."""
        self.store.timer.keys.take_over()

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
            if recorded.get("role") == "follower":  # its progress files were not copied
                set_aside_progress_of(store, "a follower starting as leader")
        self.epoch = epoch
        self._promoted = bool(recorded.get("promoted")) and self.role == "leader"

    @contextmanager
    def services(self):
        """The server's services run inside (one step): their appends (deliveries, check
        rounds) acknowledge no sender, so they wait for no replica (they reach the
        followers as every record does); and no change of role happens meanwhile, so that a
        step that began as leader never appends after the replica became a follower."""
        with self._lock:
            self._exempt.depth = getattr(self._exempt, "depth", 0) + 1
            try:
                yield
            finally:
                self._exempt.depth -= 1

    def _exempted(self) -> bool:
        return getattr(self._exempt, "depth", 0) > 0

    def _install_acks(self) -> None:
        rs = self.replica_set
        if rs.min_insync_replicas > 1:
            self.acks = InSyncAcks([u for u in rs.replicas if u != self.me],
                                   rs.min_insync_replicas, rs.replica_ack_timeout_ms,
                                   self.append_signal, self._exempted,
                                   still_leading=self._still_leading)
            self.acks.on_acked = self._publish_role
        self.store.replica_acks = self.acks

    def _write_state(self) -> None:
        with self._state_lock:  # (one temporary file per process: one writer at a time)
            self._write_state_now()

    def _write_state_now(self) -> None:
        state = {"role": self.role, "epoch": self.epoch, "leader": self.leader,
                 "self": self.me, "replicas": list(self.replica_set.replicas),
                 "min_insync_replicas": self.replica_set.min_insync_replicas,
                 "high_watermark": self.watermark.recorded()}
        if self._promoted:
            state["promoted"] = True
        if self.elected:
            state["elected"] = True
        write_state(self.store.root, state)

    def leader_epochs(self, answer: dict) -> None:
        """Take the leader's terms (its ``epochs`` answer): first cut this log back to where
        the histories part, when it holds a tail the leader's history does not
        (:func:`~store.replication.truncation.cut_diverged_tail`), then keep them as this
        follower's epoch file and recorded epoch."""
        terms = [tuple(t) for t in answer.get("epochs") or []]
        cut = cut_diverged_tail(self.store, terms, self.leader)
        if cut is not None:
            self.last_cut = cut
            self.watermark.cut(self.store.confirmed_offset())
        if terms:
            write_epochs(self.store.root, terms)
        epoch = answer.get("epoch")
        if isinstance(epoch, int) and epoch != self.epoch:
            self.epoch = epoch
            self._write_state()

    def epochs_answer(self) -> dict:
        """What a follower asking ``epochs`` gets: this replica's epoch and terms; and what
        an election asks (:mod:`.election`): its CommitLog ``end``, the epoch of its last
        term (``last_epoch``) and of the last term it holds bytes of (``held_epoch``:
        :func:`~store.files.epoch_file.held_epoch`), its ``role`` and follower ``state``."""
        terms = read_epochs(self.store.root)
        end = self.store.confirmed_offset()
        return {"epoch": self.epoch, "epochs": [list(t) for t in terms], "end": end,
                "role": self.role,
                "last_epoch": terms[-1][0] if terms else 0,
                "held_epoch": held_epoch(terms, end),
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

        def leader(**more):  # (a connection each: the log's copy never waits for the other)
            return RemoteStore(self.leader, **self._credentials, **more)

        self.follower = Follower(self.store, leader(),
                                 on_epochs=self.leader_epochs, me=self.me,
                                 on_watermark=self.watermark.learn,
                                 on_leader_min=self.follow_retention,
                                 progress=ProgressCopy(
                                     self.store, leader(timeout_s=ASK_TIMEOUT_S),
                                     self.replica_set.consumer_progress_sync_ms))
        self.follower.start()

    def _probe(self, url: str) -> dict:
        """The position of replica ``url`` for an election (itself: without a call)."""
        if url == self.me:
            answer = self.epochs_answer()
            return {**answer, "epoch": answer["last_epoch"]}
        return probe_replica(url, self._credentials)

    def share_role(self) -> None:
        """Publish this replica's role to worker processes that append to its store (a gRPC
        endpoint of several processes) from now until :meth:`stop`
        (:mod:`.role_publisher`)."""
        from .role_publisher import RolePublisher

        with self._lock:
            if self.role_publisher is None:
                self.role_publisher = RolePublisher(self)

    def _publish_role(self) -> None:
        publisher = self.role_publisher
        if publisher is not None:
            publisher.publish()

    def stop(self) -> None:
        """Stop voting and copying (its last figures stay in :meth:`status`); the workers
        it shares its role with refuse writes from then on."""
        if self.role_publisher is not None:
            self.role_publisher.close()
        if self.voter is not None:
            self.voter.stop()
        if self.follower is not None:
            self.follower.stop()

    def _stop_following(self) -> None:
        follower, self.follower = self.follower, None
        if follower is not None:
            follower.stop()

    # ------------------------------------------------------------------ role changes
    def become_leader(self, *, force: bool = False, epoch: int | None = None) -> dict:
        """Make this running follower the leader of a new term; returns ``epoch``,
        ``start_offset`` (its CommitLog end, where the term starts), ``leader_end`` (the
        old leader's end as last heard), ``lost_bytes`` and ``forced``.

        Refused (:class:`~store.base.errors.ReplicaBehindError`) when it holds less than its
        leader's confirmed end as last heard, or never heard from it, unless ``force`` (an
        election forces: its choice of the replica is what protects acknowledged messages,
        :mod:`.election`).  ``epoch``: the new term's epoch (an election's); by default the
        one after every epoch this replica knows.  The follower thread is stopped first, the
        term recorded in the epoch file and ``config/replication.json``, the services'
        progress set aside (they rebuild it from the log at their next run), the
        synchronous acks installed, and writes are taken from then on (elected: while its
        lease lasts): the server's next step delivers what is due.  A leader already:
        ``StoreError``, but for an elected leader named again in a later ``epoch`` (its new
        term is recorded).  An elected set's replica is not promoted by hand (``epoch``
        ``None``): its voters choose."""
        with self._lock:
            if epoch is None and self.elected:
                raise StoreError(
                    f"cannot promote {self.me}: its replica set elects its leader (it has a "
                    f"witness, {self.replica_set.witness}); allowed: stop the leader, and the "
                    "voters elect the replica that holds every acknowledged message")
            if self.role == "leader" and (epoch is None or epoch == self.epoch):
                raise StoreError(f"{self.me} leads its replica set already (epoch "
                                 f"{self.epoch})")
            heard = self.follower.status() if self.follower is not None else {}
            end = self.store.confirmed_offset()
            leader_end = heard.get("leader_end")
            lost = refuse_if_behind(self.me, self.leader, end, leader_end, force)
            self._stop_following()
            with self.store.write_lock():
                end = self.store.confirmed_offset()  # (the follower may have appended since)
                terms = read_epochs(self.store.root)
                known = self._known_epoch(terms)
                new = known + 1 if epoch is None else int(epoch)
                if new <= known:
                    raise StoreError(f"epoch {new} for {self.me}'s new term; allowed: above "
                                     f"{known}, every epoch it knows")
                write_epochs(self.store.root, with_term(terms, new, end if terms else 0))
                self.watermark.cut(end)  # (forced: it holds less than it heard)
                set_aside_progress_of(self.store, f"{self.me} becoming leader")
                if self.role != "leader":  # (named again: its groups' progress is its own)
                    self._tell_role("leader")  # (the newest copy of the consumers' progress)
                self.leader, self.role, self.epoch = self.me, "leader", new
                self._promoted = not self.elected
                if self.acks is None:  # (a leader named again keeps its followers' reports)
                    self._install_acks()
                self.store.appender.not_leading = None
                self._publish_role()  # (under the append lock: the workers take writes)
                self._write_state()
            self._take_delay_keys()  # (before a service step delivers: the lock is held)
            with self.services():  # (a book never recorded, kept: the followers get it)
                self.store.recurring.record()
            return {"epoch": new, "start_offset": end, "leader_end": leader_end,
                    "lost_bytes": lost, "forced": bool(force and (leader_end is None or lost))}

    def _known_epoch(self, terms) -> int:
        """The epoch a new term of this replica's must be above (``terms``: its epoch
        file's); elected, the voters number the terms: only recorded terms are known."""
        return max([0 if self.elected else self.epoch] + [e for e, _ in terms])

    def takes_term(self, epoch: int) -> bool:
        """Whether :meth:`become_leader` takes a term of ``epoch`` (an election's): one
        above every epoch this replica knows.  A leader restarted while the voters still
        name it in its old term does not take that term again (:mod:`.election` waits for
        a later one)."""
        return int(epoch) > self._known_epoch(read_epochs(self.store.root))

    def become_follower(self, leader_url: str, *, epoch: int | None = None) -> None:
        """Follow ``leader_url`` (one of the replica set's URLs) from now on: writes are
        refused (elected: the lease is dropped first), writers waiting for their copies fail
        (:class:`~store.base.errors.LeaderDeposedError`), the services stop (the server's
        steps skip them), the services' progress is set aside, and the follower thread
        starts; at its first contact it cuts this log's diverged tail, if any
        (:meth:`leader_epochs`).  ``epoch``: the leader's, when known (the follower takes the
        leader's at contact anyway)."""
        if leader_url not in self.replica_set.replicas or leader_url == self.me:
            raise InvalidConfigError(f"{leader_url} to follow; allowed: another replica of "
                                     f"{list(self.replica_set.replicas)}")
        self.lease_until = 0.0  # (first, before any lock: no write is acknowledged from here)
        self._publish_role()
        with self._lock:
            self._stop_following()
            with self.store.write_lock():  # (no service step appends meanwhile)
                self.leader, self.role, self._promoted = leader_url, "follower", False
                # (what its readers saw stays visible: the acknowledged end, or asynchronous
                # its whole log; a cut tail lowers the mark at the first contact)
                self.watermark.learn(self.store.confirmed_offset() if self.acks is None
                                     else self.acks.acked)
                acks, self.store.replica_acks, self.acks = self.acks, None, None
                if acks is not None:
                    acks.close()
                self._refuse_writes()
                if epoch is not None and epoch > self.epoch:
                    self.epoch = int(epoch)
                set_aside_progress_of(self.store, f"{self.me} becoming follower")
                self._tell_role("follower")
                self._write_state()
            self.follow()

    def _refuse_writes(self) -> None:
        """From now on (under the append lock, or before serving), this process's own
        appends fail (:attr:`~store.core.appender.Appender.not_leading`); its copies of the
        leader's log go on.  A write checked while this replica led but appended after it
        stopped would otherwise be a follower's own record, acknowledged with no copy."""
        self.store.appender.not_leading = (
            f"{self.me} does not lead its replica set (now: "
            f"{self.leader or 'no leader known'}): the write was not stored here nor "
            "acknowledged; allowed: retry on the leader (with a key, to recognise a "
            "duplicate)")
        self._publish_role()  # (the workers' appends too: they check it under the lock)

    def _tell_role(self, role: str) -> None:
        for listener in self.role_listeners:
            listener(role)

    def _still_leading(self) -> None:
        """After a write waited for its copies: return once this replica leads (elected:
        within a lease), :class:`LeaderDeposedError` when it does not, so that a deposed
        leader acknowledges nothing.  An elected leader whose lease ran out while the write
        waited (a renewal late) may still acknowledge it when a renewal commits within the
        election timeout: the voters then still name it in its epoch, so no other leader was
        elected before the copies were made, and any later election finds them."""
        deadline = time.monotonic() + self.replica_set.election_timeout_ms / 1000
        while not self.leading():
            if self.role != "leader" or self.acks is None or time.monotonic() >= deadline:
                raise LeaderDeposedError(
                    f"a write on {self.me} was appended and copied, but {self.me} no longer "
                    f"leads its replica set (now: {self.leader or 'no leader known'}, its "
                    "lease not renewed); it was not acknowledged and may or may not survive "
                    "the change of leader; allowed: retry on the leader (with a key, to "
                    "recognise a duplicate)")
            time.sleep(LEASE_POLL_S)

    # ------------------------------------------------------------------ refusals, reports
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

    def check_source(self, what: str) -> None:
        """Refuse to be copied unless this replica is the leader (its role; the lease is for
        acknowledgements): a follower copies only a leader's log, whose terms it was told
        (:class:`NotLeaderError`, which the follower retries)."""
        if self.role != "leader":
            raise NotLeaderError(f"{what}: {self.me} does not lead its replica set (now: "
                                 f"{self.leader or 'no leader known'}); allowed: copying from "
                                 "the leader")

    def check_term(self, what: str, epoch: int) -> None:
        """Refuse a follower's request made under another epoch than this leader's
        (:class:`NotLeaderError`): the follower takes this leader's terms again first, so
        that it never holds bytes of a term it does not know (:mod:`.election` compares
        replicas by the term of the bytes they hold)."""
        if epoch != self.epoch:
            raise NotLeaderError(f"{what}: asked under epoch {epoch}, but {self.me} leads in "
                                 f"epoch {self.epoch}; allowed: a follower that took its "
                                 "leader's terms (it takes them again)")

    def term_bound(self, epoch: int) -> int | None:
        """Where the first term after ``epoch`` starts in this log; ``None`` while this
        replica is still in ``epoch`` (or no later term is recorded)."""
        if self.epoch == epoch:
            return None
        later = [start for e, start in read_epochs(self.store.root) if e > epoch]
        return min(later) if later else None
    # ------------------------------------------------------------------ the high watermark
    def high_watermark(self) -> int | None:
        """The CommitLog offset below which this replica's readers see records
        (:mod:`.watermark`); ``None`` on a leader with ``min_insync_replicas: 1``, whose
        readers see its whole confirmed log."""
        if self.role == "leader":
            acks = self.acks
            return None if acks is None else self.watermark.current(acks)
        return self.watermark.current()

    def answer_marks(self) -> tuple[int, int]:
        """What each replication answer tells the followers: the high watermark (this
        leader's confirmed end when its readers are not bound) and the oldest CommitLog
        offset it keeps (their retention follows it)."""
        mark = self.high_watermark()
        store = self.store
        return (store.confirmed_offset() if mark is None else mark,
                store.commit_log.min_offset())

    def follow_retention(self, leader_min: int) -> None:
        """The leader's oldest CommitLog offset kept, as an answer gave it (on the follower
        thread, once the answer is appended): the segments this follower holds wholly below
        it, and not past its own end, are deleted with the queue and index files that
        pointed into them (``clean_expired_files(below=...)``), as its leader's retention
        did."""
        store = self.store
        if leader_min > store.commit_log.min_offset():
            store.clean_expired_files(below=min(leader_min, store.confirmed_offset()))

    def save_watermark(self) -> None:
        """Record the high watermark when it moved (the server's step calls this)."""
        if self.role == "leader" and self.acks is not None:
            self.watermark.learn(self.watermark.current(self.acks))
        if self.watermark.due():
            self._write_state()

    def check_action(self, name: str) -> None:
        if name not in READ_ACTIONS:
            self.check_write(name)

    def follower_asked(self, peer: str, offset: int, replica: str | None = None) -> None:
        """A follower at ``peer`` (``replica``: its URL, when it says) asked for the log from
        ``offset``: its end, which it holds (counted for synchronous acks)."""
        acks = self.acks
        if acks is not None:
            acks.report(replica, offset)
        with self._notes:
            self._asked[replica or peer] = (offset, time.monotonic())
            if len(self._asked) > MAX_NOTED_FOLLOWERS:
                oldest = min(self._asked, key=lambda p: self._asked[p][1])
                del self._asked[oldest]

    def status(self) -> dict:
        """``role``, ``epoch``, ``leader``, ``self``, ``lag_bytes`` and ``lag_messages``
        (a leader's: 0; a follower's: see :mod:`.follower`), and for a leader its followers'
        last requests."""
        out = {"role": self.role, "epoch": self.epoch, "leader": self.leader, "self": self.me,
               "min_insync_replicas": self.replica_set.min_insync_replicas}
        if self.voter is not None:
            out.update(self.voter.status(), leading=self.leading())
        if self.last_cut is not None:
            out["last_cut"] = self.last_cut
        if self.acks is not None:
            out.update(acked_end=self.acks.acked, ack_timeouts=self.acks.timeouts)
        mark, end = self.high_watermark(), self.store.confirmed_offset()
        out["high_watermark"] = end if mark is None else max(0, min(end, mark))
        if self.follower is not None:
            out.update(self.follower.status())
            return out
        end = self.store.confirmed_offset()
        now = time.monotonic()
        with self._notes:
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
           "promoted": bool(state.get("promoted")),
           "high_watermark": state.get("high_watermark")}
    try:
        out["epochs"] = [list(t) for t in read_epochs(root)]
    except StoreError as exc:  # a damaged epoch file is shown, not fatal to stats
        out["epochs"] = None
        out["epochs_error"] = str(exc)
    live = (server or {}).get("replication") if (server or {}).get("attached") else None
    if isinstance(live, dict):
        out.update(live, running=True)
    return out
