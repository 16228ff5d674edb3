"""The rules of an election (store/replication/election.py) without a network: whom the Raft
leader names, and a leader's lease on a fake clock."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from store import LeaderDeposedError, Message, MessageStore, NotLeaderError, StoreError
from store.files.epoch_file import held_epoch
from store.replication import role_change
from store.replication.election import Voter
from store.replication.replica import Replica
from store.replication.replica_set import ReplicaSet

URLS = ["rmq://127.0.0.1:7911", "rmq://127.0.0.2:7911", "rmq://127.0.0.3:7911",
        "rmq://127.0.0.4:7911"]


def voter(positions: dict, epoch: int = 0, replicas: int = 2, insync: int = 1) -> Voter:
    """A voter whose Raft state and probes are given (its Raft node is never made)."""
    v = object.__new__(Voter)
    v.replica_set = ReplicaSet.of({"replicas": URLS[:replicas], "witness": URLS[replicas],
                                   "min_insync_replicas": insync})

    def probe(url):
        found = positions[url]
        if isinstance(found, Exception):
            raise found
        return found

    v.probe, v.raft = probe, SimpleNamespace(epoch=epoch)
    return v


def test_the_replica_with_the_highest_epoch_then_end_is_named_in_a_new_epoch():
    a, b = URLS[:2]
    assert voter({a: {"epoch": 1, "end": 900}, b: {"epoch": 2, "end": 100}})._choose() == (b, 3)
    assert voter({a: {"epoch": 2, "end": 900}, b: {"epoch": 2, "end": 100}})._choose() == (a, 3)
    # ties: the file's order; the epoch after every one the voters or replicas know
    assert voter({a: {"epoch": 0, "end": 0}, b: {"epoch": 0, "end": 0}}, 4)._choose() == (a, 5)
    # an unreachable or diverged replica is not named; none reachable: nobody
    assert voter({a: StoreError("down"), b: {"epoch": 1, "end": 5}})._choose() == (b, 2)
    assert voter({a: {"epoch": 3, "end": 9, "state": "diverged"},
                  b: {"epoch": 1, "end": 5}})._choose() == (b, 4)
    assert voter({a: StoreError("down"), b: StoreError("down")})._choose()[0] is None


def test_the_epoch_compared_is_that_of_the_last_term_a_replica_holds_bytes_of():
    """A follower copies its leader's terms before their bytes: with the newest term on file
    but not yet the older bytes, it must not win over a replica that holds them (an
    acknowledged message would be lost)."""
    terms = [(1, 0), (2, 5000)]
    assert [held_epoch(terms, end) for end in (0, 4999, 5000, 9000)] == [1, 1, 2, 2]
    assert held_epoch([], 10) == 0
    a, b, c = URLS[:3]
    # a: the old leader's bytes up to 6000 (epoch 1); b: elected in 2 at 5000, then gone;
    # c: b's follower, its terms copied, its bytes only up to 3000 (still epoch 1's)
    positions = {a: {"epoch": 1, "held_epoch": 1, "end": 6000},
                 b: StoreError("down"),
                 c: {"epoch": 2, "held_epoch": 1, "end": 3000}}
    assert voter(positions, 2, replicas=3, insync=2)._choose() == (a, 3)
    # without held_epoch (an older replica's answer) its last term counts, as before
    assert voter({a: {"epoch": 1, "end": 6000}, b: StoreError("down"),
                  c: {"epoch": 2, "end": 3000}}, 2, replicas=3)._choose() == (c, 3)


def test_with_synchronous_replication_a_leader_is_named_only_when_enough_replicas_answer():
    """min_insync_replicas m of n: an acknowledged message is on m replicas, so n - m + 1
    answers include one; fewer answers name nobody."""
    a, b, c = URLS[:3]
    down = StoreError("down")
    assert voter({a: down, b: down, c: {"epoch": 1, "end": 5}}, replicas=3,
                 insync=2)._choose()[0] is None
    assert voter({a: down, b: {"epoch": 1, "end": 9}, c: {"epoch": 1, "end": 5}}, replicas=3,
                 insync=2)._choose() == (b, 2)
    # a diverged replica counts for nothing
    assert voter({a: down, b: {"epoch": 1, "end": 9, "state": "diverged"},
                  c: {"epoch": 1, "end": 5}}, replicas=3, insync=2)._choose()[0] is None
    # every replica in sync (m = n): any one answer; asynchronous: any one too
    assert voter({a: down, b: down, c: {"epoch": 1, "end": 5}}, replicas=3,
                 insync=3)._choose() == (c, 2)
    assert voter({a: down, b: {"epoch": 1, "end": 5}})._choose() == (b, 2)
    assert voter({a: down, b: {"epoch": 1, "end": 5}}, insync=2)._choose() == (b, 2)


def _elected_leader(store, now: list) -> Replica:
    """``store`` as the elected leader (epoch 1, a lease of 1.2 s on the clock ``now[0]``) of
    two replicas and a witness with ``min_insync_replicas`` 2."""
    rs = ReplicaSet.of({"replicas": URLS[:2], "witness": URLS[2], "min_insync_replicas": 2,
                        "replica_ack_timeout_ms": 30_000})
    replica = Replica(store, rs, URLS[0], clock=lambda: now[0])
    role_change.become_leader(replica, 1)
    replica.lease_until = now[0] + 1.2
    return replica


def _sending(store):
    """A local send on its own thread; returns the thread and its outcome."""
    outcome: dict = {}

    def send():
        try:
            outcome["done"] = store.producer("g").send(Message("t", b"x"))
        except StoreError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=send)
    thread.start()
    return thread, outcome


def _waiting(acks, seen: int = 0) -> None:
    deadline = time.monotonic() + 10
    while acks.signal.seq == seen:  # (a writer that waits wakes the followers' polls first)
        assert time.monotonic() < deadline, "the send never waited for its copy"
        time.sleep(0.005)


def test_a_write_copied_after_its_leader_lost_the_lease_is_not_acknowledged(tmp_path):
    """Synchronous acks check the lease before acknowledging: a write that waited for its
    copy on a leader whose lease ran out meanwhile, and was not renewed within the election
    timeout, fails (LeaderDeposedError, a NotLeaderError), even though the follower reported
    holding it."""
    now = [100.0]
    with MessageStore.open(str(tmp_path / "a")) as store:
        replica = _elected_leader(store, now)
        acks = replica.acks
        assert acks is not None and store.replica_acks is acks
        thread, outcome = _sending(store)
        _waiting(acks)
        now[0] += 2.0  # the lease ran out while the write waited
        replica.follower_asked("peer", store.confirmed_offset(), URLS[1])
        thread.join(10)
        assert isinstance(outcome.get("error"), LeaderDeposedError), outcome
        assert isinstance(outcome["error"], NotLeaderError)
        # within the lease, the same report acknowledges
        replica.lease_until = now[0] + 1.2
        seen = acks.signal.seq
        thread, outcome = _sending(store)
        _waiting(acks, seen)
        replica.follower_asked("peer", store.confirmed_offset(), URLS[1])
        thread.join(10)
        assert "done" in outcome, outcome
        # the lease ran out while it waited, but a renewal commits within the election
        # timeout: the voters still name it, so the write is acknowledged
        seen = acks.signal.seq
        thread, outcome = _sending(store)
        _waiting(acks, seen)
        now[0] += 2.0
        replica.follower_asked("peer", store.confirmed_offset(), URLS[1])
        time.sleep(0.2)
        assert thread.is_alive()  # (waiting for a renewal)
        replica.lease_until = now[0] + 1.2
        thread.join(10)
        assert "done" in outcome, outcome


def test_a_change_of_role_fails_the_writes_waiting_for_their_copies_at_once(tmp_path):
    now = [100.0]
    with MessageStore.open(str(tmp_path / "a")) as store:
        replica = _elected_leader(store, now)
        acks = replica.acks
        thread, outcome = _sending(store)
        _waiting(acks)
        started = time.monotonic()
        replica.follow = lambda: None  # (no copying in this test)
        role_change.become_follower(replica, URLS[1], 2)
        thread.join(10)
        assert time.monotonic() - started < 5  # not the 30 s of the ack timeout
        assert isinstance(outcome.get("error"), LeaderDeposedError), outcome
        assert store.replica_acks is None and replica.acks is None
        # and the elected replica set's replica is not promoted by hand
        with pytest.raises(StoreError, match="elects its leader"):
            replica.become_leader(force=True)


def test_a_leader_takes_writes_only_within_its_lease(tmp_path):
    now = [100.0]
    rs = ReplicaSet.of({"replicas": URLS[:2], "witness": URLS[2]})
    with MessageStore.open(str(tmp_path / "a")) as store:
        replica = Replica(store, rs, URLS[0], clock=lambda: now[0])
        with pytest.raises(NotLeaderError, match="no elected leader yet"):
            replica.check_write("send")
        role_change.become_leader(replica, 1)
        assert not replica.leading()  # named, but no renewal committed yet
        replica.lease_until = now[0] + 1.2
        replica.check_write("send")
        now[0] += 1.19
        assert replica.leading() and not replica.is_follower
        now[0] += 0.02  # the lease ran out: refused at once, the services stop
        with pytest.raises(NotLeaderError, match="lost its lease"):
            replica.check_write("send")
        assert replica.is_follower
        replica.follow = lambda: None  # (no copying in this test)
        role_change.become_follower(replica, URLS[1], 2)
        with pytest.raises(NotLeaderError, match="127.0.0.2"):
            replica.check_write("send")
        assert replica.epoch == 2 and replica.leader == URLS[1]


def test_the_replicated_leader_survives_a_restart_of_its_voter(tmp_path):
    """A voter restarted finds the leader and epoch in its dump file and journal (a voter
    that forgot them would, as Raft leader, depose the leader at once)."""
    import socket
    import time

    from store.replication.election import _state_class, raft_conf

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        me = f"127.0.0.1:{s.getsockname()[1]}"
    state = _state_class()

    def node():
        return state(me, [], raft_conf(1.0, str(tmp_path), me), lambda: None)

    first = node()
    try:
        deadline = time.monotonic() + 20
        while not first._isLeader():
            assert time.monotonic() < deadline, "a single voter never led"
            time.sleep(0.02)
        assert first.set_leader(URLS[1], 3, sync=True, timeout=10)
        first.forceLogCompaction()
        while not (tmp_path / "dump").exists():
            assert time.monotonic() < deadline, "no dump written"
            time.sleep(0.02)
    finally:
        first.destroy()
    time.sleep(0.5)
    again = node()
    try:
        deadline = time.monotonic() + 20
        while not again.isReady():  # (the dump is loaded, the journal applied, in its ticks)
            assert time.monotonic() < deadline, "the voter never got ready"
            time.sleep(0.02)
        assert (again.leader, again.epoch) == (URLS[1], 3)
    finally:
        again.destroy()


def _lease_voter(replica: Replica, leader: str, epoch: int, renewals: list) -> Voter:
    """A voter of ``replica`` whose Raft state names ``leader`` in ``epoch`` (its Raft node
    is never made); each renewal asked is counted in ``renewals``."""
    v = object.__new__(Voter)
    v.replica, v.me, v.clock, v.timeout_s = replica, replica.me, time.monotonic, 0.05
    v._stop, v._changed, v._stale_term = threading.Event(), threading.Event(), None

    def renew(url, epoch_, **_):
        renewals.append((url, epoch_))
        return True

    v.raft = SimpleNamespace(leader=leader, epoch=epoch, renew=renew)
    return v


def test_a_restarted_leader_still_named_in_its_old_term_waits_with_one_warning(tmp_path,
                                                                              caplog):
    """Restarted while the voters still name it in the term it led, a replica cannot take
    that term again: it does not renew it (so the voters name a leader in a later epoch),
    and says so once, not with a traceback per step; named in the later epoch, it leads."""
    rs = ReplicaSet.of({"replicas": URLS[:2], "witness": URLS[2]})
    with MessageStore.open(str(tmp_path / "a")) as store:
        role_change.become_leader(Replica(store, rs, URLS[0]), 1)
    with MessageStore.open(str(tmp_path / "a")) as store:  # restarted: a follower of nobody
        replica = Replica(store, rs, URLS[0])
        assert (replica.role, replica.epoch) == ("follower", 1)
        assert not replica.takes_term(1) and replica.takes_term(2)
        renewals: list = []
        v = _lease_voter(replica, URLS[0], 1, renewals)
        caplog.clear()
        with caplog.at_level("INFO", logger="store.replication"):
            for _ in range(4):
                v._lease_step()
        assert renewals == [] and replica.role == "follower"
        said = [r for r in caplog.records if r.name.startswith("store.replication")]
        assert len(said) == 1 and not said[0].exc_info, said
        assert "later epoch" in said[0].getMessage() and "epoch 1" in said[0].getMessage()
        v.raft.epoch = 2  # the voters name it again, in a later epoch
        v._lease_step()
        assert renewals == [(URLS[0], 2)]
        assert (replica.role, replica.epoch) == ("leader", 2) and replica.lease_until > 0


def test_a_refused_election_step_is_logged_once_per_refusal(caplog):
    """A step the store refuses (a typed StoreError) is logged as one line while the same
    refusal repeats, without a traceback; another refusal is logged again."""
    v = object.__new__(Voter)
    v._stop, v.timeout_s = threading.Event(), 0.001
    refusals = iter(["waiting for x"] * 5 + ["waiting for y"] * 3)

    def step():
        text = next(refusals, None)
        if text is None:
            v._stop.set()
            return
        raise StoreError(text)

    with caplog.at_level("INFO", logger="store.replication.election"):
        v._loop(step)
    said = [r for r in caplog.records if r.name == "store.replication.election"]
    assert [("waiting for x" in r.getMessage(), "waiting for y" in r.getMessage())
            for r in said] == [(True, False), (False, True)]
    assert not any(r.exc_info for r in said)


def test_a_write_let_in_as_leader_but_appended_after_a_change_of_role_is_refused(tmp_path):
    """A face checks the role when a request comes in; the write may then wait for the
    append lock behind a change of role (which holds it). Appended after it, by what is
    now a follower, it would be a record of the follower's own, acknowledged with no copy
    (a follower waits for no replica), in the tail the new leader's history cuts: the
    hour-long fault run lost 9 acknowledged messages so. It must fail, nothing stored."""
    now = [100.0]
    with MessageStore.open(str(tmp_path / "a")) as store:
        replica = _elected_leader(store, now)
        replica.follow = lambda: None  # (no copying in this test)
        end = store.confirmed_offset()
        with store.write_lock():  # the change of role's lock, taken first
            thread, outcome = _sending(store)  # checked as leader: waits for the lock
            time.sleep(0.2)
            role_change.become_follower(replica, URLS[1], 2)
        thread.join(10)
        assert isinstance(outcome.get("error"), LeaderDeposedError), outcome
        assert store.confirmed_offset() == end  # nothing appended
        # a follower's copies of its leader's log are appended all the same (test_follower),
        # and a replica that leads again takes writes
        role_change.become_leader(replica, 3)
        replica.lease_until = now[0] + 1.2
        seen = replica.acks.signal.seq
        thread, outcome = _sending(store)
        _waiting(replica.acks, seen)
        replica.follower_asked("peer", 10**9, URLS[1])
        thread.join(10)
        assert "done" in outcome, outcome


@pytest.mark.parametrize("how", ["send", "send_batch"])
def test_a_change_of_role_between_an_append_and_its_wait_fails_the_write(tmp_path, how):
    """The wait for the copies comes after the append lock is released; a change of role
    may come in between. The write must wait on the acks of the term it was appended in
    (closed by the change: LeaderDeposedError), not on what the store holds now (a
    follower's: none, which acknowledged it at once)."""
    now = [100.0]
    with MessageStore.open(str(tmp_path / "a")) as store:
        replica = _elected_leader(store, now)
        replica.follow = lambda: None
        unlock, armed = store._unlock, [True]

        def unlock_then_change_role(outermost: bool) -> None:
            unlock(outermost)
            if outermost and armed[0]:
                armed[0] = False
                role_change.become_follower(replica, URLS[1], 2)

        store._unlock = unlock_then_change_role
        producer = store.producer("g")
        with pytest.raises(LeaderDeposedError):
            if how == "send":
                producer.send(Message("t", b"x"))
            else:
                producer.send_batch([Message("t", b"x"), Message("t", b"y")])
        assert not armed[0]  # (the change of role came in the window)
