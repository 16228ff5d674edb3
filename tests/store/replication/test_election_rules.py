"""The rules of an election (store/replication/election.py) without a network: whom the Raft
leader names, and a leader's lease on a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from store import MessageStore, NotLeaderError, StoreError
from store.replication import role_change
from store.replication.election import Voter
from store.replication.replica import Replica
from store.replication.replica_set import ReplicaSet

URLS = ["rmq://127.0.0.1:7911", "rmq://127.0.0.2:7911", "rmq://127.0.0.3:7911"]


def voter(positions: dict, epoch: int = 0) -> Voter:
    """A voter whose Raft state and probes are given (its Raft node is never made)."""
    v = object.__new__(Voter)
    v.replica_set = ReplicaSet.of({"replicas": URLS[:2], "witness": URLS[2]})

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
