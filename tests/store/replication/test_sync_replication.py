"""Synchronous replication (``min_insync_replicas``), the cut of a former leader's diverged
tail, and a running follower promoted: servers in this process on loopback, steps called by
hand with a fake clock."""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from collections import Counter

import pyarrow as pa
import pytest
from test_replica_set import (
    SMALL,
    Clock,
    Commit,
    caught_up,
    commitlog_bytes,
    free_port,
    replica_file,
)

from store import (
    InvalidConfigError,
    Message,
    MessageStore,
    NotLeaderError,
    ReplicaAckTimeoutError,
    ReplicaBehindError,
    ReplicaWriterError,
    StoreError,
    StoreServer,
    connect,
    promote_replica,
)
from store.files.epoch_file import divergence, read_epochs
from store.replication.replica import read_state


def serve(tmp_path, name, port, rs, clock=None):
    return StoreServer(str(tmp_path / name), SMALL, clock=clock, listen=f"127.0.0.1:{port}",
                       replica_set=rs)


def following(*followers, timeout_s: float = 30) -> None:
    """Wait until each follower has heard from its leader (its first answer came)."""
    deadline = time.monotonic() + timeout_s
    for f in followers:
        while f.replica.status().get("state") != "following":
            assert time.monotonic() < deadline, f.replica.status()
            time.sleep(0.01)


def same_log(leader, follower) -> int:
    """Wait until ``follower`` holds exactly ``leader``'s log; its end."""
    following(follower)
    deadline = time.monotonic() + 30
    while follower.store.confirmed_offset() != leader.store.confirmed_offset():
        assert time.monotonic() < deadline, follower.replica.status()
        time.sleep(0.01)
    return leader.store.confirmed_offset()


def bodies(store, topic) -> Counter:
    if topic not in store.topics():
        return Counter()
    return Counter(v.body for q in store.queue_ids(topic)
                   for v in store.pull(topic, q, 0, 10_000))


@pytest.fixture
def sync_pair(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, min_insync_replicas=2, replica_ack_timeout_ms=10_000)
    clock = Clock()
    leader = serve(tmp_path, "a", ports[0], rs, clock)
    follower = serve(tmp_path, "b", ports[1], rs, clock)
    following(follower)
    yield leader, follower, clock
    follower.close()
    leader.close()


def test_every_write_is_acknowledged_only_once_the_follower_holds_it(sync_pair):
    leader, follower, _ = sync_pair

    def held() -> None:  # checked the moment a write returns: no waiting for the follower
        assert follower.store.confirmed_offset() >= leader.store.confirmed_offset()

    local = leader.store.producer("g")  # the embedded store of the server's own process
    local.send(Message("t", b"local"))
    held()
    local.send_batch([Message("t", b"lb-%d" % i) for i in range(50)], queue_id=1)
    held()
    with connect(leader.url) as remote:
        p = remote.producer("g")
        for i in range(5):
            p.send(Message("t", b"one-%d" % i))
            held()
        p.send_batch([Message("t", b"b-%d" % i) for i in range(100)])
        held()
        p.send_table(pa.table({"body": [b"x%d" % i for i in range(5000)]}), topic="bulk")
        held()
        sink = remote.sink("s1")
        staged = sink.stage(pa.table({"body": [b"s%d" % i for i in range(100)]}), topic="t")
        held()
        sink.commit(1, staged)
        held()
        tx = remote.transaction_producer("tg", Commit())
        tx.send_in_transaction(Message("t", b"in-tx"))
        held()
    status = leader.replica.status()
    assert status["min_insync_replicas"] == 2 and status["acked_end"] >= \
        leader.store.confirmed_offset() and status["ack_timeouts"] == 0
    end = leader.store.confirmed_offset()
    assert commitlog_bytes(follower.path, end) == commitlog_bytes(leader.path, end)


def test_a_write_the_replicas_do_not_hold_in_time_is_an_error_to_its_sender(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, min_insync_replicas=2, replica_ack_timeout_ms=300)
    leader = serve(tmp_path, "a", ports[0], rs)  # its follower never runs
    try:
        with pytest.raises(ReplicaAckTimeoutError, match="not acknowledged"):
            leader.store.producer("g").send(Message("t", b"local"))
        with connect(leader.url) as remote:
            with pytest.raises(ReplicaAckTimeoutError, match="min_insync_replicas"):
                remote.producer("g").send(Message("t", b"remote"))  # the typed error
            with pytest.raises(ReplicaAckTimeoutError):
                remote.producer("g").send_table(pa.table({"body": [b"x"] * 10}), topic="t")
        assert leader.replica.status()["ack_timeouts"] == 3
        assert leader.step() == 0  # the server's own step is not a sender: it does not fail
    finally:
        leader.close()
    # a process that is not the server cannot be waited for: it may not append
    with MessageStore.open(str(tmp_path / "a"), SMALL) as other:
        with pytest.raises(ReplicaWriterError, match="through the server"):
            other.producer("g").send(Message("t", b"bypass"))
        assert bodies(other, "t") == Counter({b"local": 1, b"remote": 1, b"x": 10})


def test_the_grpc_face_answers_a_replica_timeout_with_a_persistence_status():
    pytest.importorskip("grpc")
    from store.proxy.grpc_service import Code, store_error_code

    assert store_error_code(ReplicaAckTimeoutError("late")) == Code.SLAVE_PERSISTENCE_TIMEOUT


def test_divergence_of_epoch_histories():
    assert divergence([(1, 0)], [(1, 0)]) is None                 # same term: nothing to cut
    assert divergence([(1, 0)], [(1, 0), (2, 700)]) == 700        # a deposed leader of 1
    assert divergence([(1, 0), (2, 500)], [(1, 0), (3, 400)]) == 400
    assert divergence([(1, 0), (2, 500)], [(1, 0), (3, 600)]) == 500  # its term 2 is not theirs
    assert divergence([], [(1, 0)]) is None and divergence([(2, 0)], [(1, 0)]) is None


def _rejoin(tmp_path, ports, name_new, name_old, clock=None, **more):
    """Start ``name_new`` as the leader the file names and ``name_old`` as its follower."""
    rs = replica_file(tmp_path, ports, leader=f"rmq://127.0.0.1:{ports[1]}", **more)
    new = serve(tmp_path, name_new, ports[1], rs, clock)
    old = serve(tmp_path, name_old, ports[0], rs, clock)
    return new, old


def test_a_former_leader_cuts_its_unreplicated_tail_sets_it_aside_and_follows(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)  # asynchronous
    a, b = serve(tmp_path, "a", ports[0], rs), serve(tmp_path, "b", ports[1], rs)
    try:
        for i in range(20):
            a.store.producer("g").send(Message("t", b"both-%d" % i))
        shared = caught_up(a, b)
    finally:
        b.close()  # b stops: what a acknowledges now is on a only
    try:
        for i in range(7):  # (across a segment's end: the cut spans segments)
            a.store.producer("g").send(Message("t", b"only-a-%d" % i + b"." * 60_000))
        a_end = a.store.confirmed_offset()
        a_tail = commitlog_bytes(a.path, a_end)[shared:]
    finally:
        a.close()
    assert promote_replica(str(tmp_path / "b"))["start_offset"] == shared
    new, old = _rejoin(tmp_path, ports, "b", "a")
    try:
        new.store.producer("g").send(Message("t", b"after"))
        end = same_log(new, old)
        assert commitlog_bytes(old.path, end) == commitlog_bytes(new.path, end)
        assert bodies(old.store, "t") == bodies(new.store, "t")
        assert not [m for m in bodies(old.store, "t") if m.startswith(b"only-a")]
        assert len(os.listdir(os.path.join(old.path, "commitlog"))) == \
            len(os.listdir(os.path.join(new.path, "commitlog")))
        assert read_epochs(old.path) == [(1, 0), (2, shared)]
        cut = old.replica.status()["last_cut"]
        assert cut["from"] == shared and cut["to"] == a_end and cut["records"] == 7
    finally:
        old.close()
        new.close()
    aside = glob.glob(str(tmp_path / "a" / "config" / "truncated" / "*"))
    assert sorted(os.path.basename(p) for p in aside) == [f"1-{shared}.bin", f"1-{shared}.json"]
    with open(str(tmp_path / "a" / "config" / "truncated" / f"1-{shared}.bin"), "rb") as fh:
        assert fh.read() == a_tail
    note = json.loads((tmp_path / "a" / "config" / "truncated" / f"1-{shared}.json").read_text())
    assert note["bytes"] == len(a_tail) and note["leader"] == f"rmq://127.0.0.1:{ports[1]}"


def test_with_synchronous_replication_nothing_acknowledged_is_in_a_cut_tail(tmp_path):
    ports = free_port(), free_port()
    more = {"min_insync_replicas": 2, "replica_ack_timeout_ms": 300}
    rs = replica_file(tmp_path, ports, **more)
    a, b = serve(tmp_path, "a", ports[0], rs), serve(tmp_path, "b", ports[1], rs)
    following(b)
    acked, refused = [], []
    try:
        for i in range(20):
            a.store.producer("g").send(Message("t", b"m-%d" % i))
            acked.append(b"m-%d" % i)
    finally:
        b.close()
    try:
        for i in range(3):
            with pytest.raises(ReplicaAckTimeoutError):
                a.store.producer("g").send(Message("t", b"late-%d" % i))
            refused.append(b"late-%d" % i)
    finally:
        a.close()
    promote_replica(str(tmp_path / "b"))
    new, old = _rejoin(tmp_path, ports, "b", "a", **more)
    try:
        following(old)
        new.store.producer("g").send(Message("t", b"after"))  # waits for a: a follows
        got = bodies(new.store, "t")
        assert all(got[m] == 1 for m in acked) and not any(got[m] for m in refused)
        assert bodies(old.store, "t") == got
        assert old.replica.status()["last_cut"]["records"] == 3  # only what was refused
    finally:
        old.close()
        new.close()


def test_a_running_follower_is_promoted_and_due_timers_are_delivered_once_never_early(
        tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, min_insync_replicas=2, replica_ack_timeout_ms=300)
    clock = Clock()
    a, b = serve(tmp_path, "a", ports[0], rs, clock), serve(tmp_path, "b", ports[1], rs, clock)
    following(b)
    due = {}
    try:
        p = a.store.producer("g")
        for i in range(10):
            body = b"timer-%d" % i
            p.send(Message("orders", body), delay_ms=1000 * (i + 1))
            due[body] = clock.now + 1000 * (i + 1)
        p.send(Message("orders", b"level-1"), delay_level=1)  # 1 s
        due[b"level-1"] = clock.now + 1000
        clock.now += 4500
        assert a.step() == 5  # timers 0-3 and the level: delivered by a, copied to b
        caught_up(a, b)  # (a's services wait for no copy)
        before = bodies(b.store, "orders")
        assert set(before) == {b"timer-0", b"timer-1", b"timer-2", b"timer-3", b"level-1"}
    finally:
        a.close()  # the leader is lost
    try:
        heard = b.replica.follower.leader_end
        b.replica.follower.leader_end = heard + 100  # as if a had confirmed more
        with pytest.raises(ReplicaBehindError, match="100 bytes would be lost"):
            b.replica.become_leader()
        assert b.replica.is_follower
        b.replica.follower.leader_end = heard
        answer = {}
        asker = threading.Thread(target=lambda: answer.update(
            promote_replica(b.path, timeout_s=20)))
        asker.start()
        while asker.is_alive():  # the running server answers at its next step
            b.step()
            asker.join(0.02)
        assert answer["epoch"] == 2 and answer["start_offset"] == b.store.confirmed_offset()
        assert b.replica.role == "leader" and read_state(b.path)["role"] == "leader"
        assert b.step() == 0  # the same time: what a delivered is not delivered again
        assert bodies(b.store, "orders") == before
        clock.now += 1000
        assert b.step() == 1  # timer-4, due now: not before
        clock.now += 10_000
        assert b.step() == 5
        got = bodies(b.store, "orders")
        assert set(got) == set(due) and set(got.values()) == {1}  # each once
        for q in b.store.queue_ids("orders"):
            for view in b.store.pull("orders", q, 0, 100):
                assert view.store_timestamp_ms >= due[view.body]  # never early
        with pytest.raises(ReplicaAckTimeoutError):  # it leads; its follower a is lost
            b.store.producer("g").send(Message("orders", b"new leader"))
    finally:
        b.close()


def test_a_diverged_follower_holds_nothing_for_the_leader(tmp_path):
    """A follower whose log is not a prefix of the leader's reports an end past the write:
    it is not counted, and the write times out instead of being acknowledged."""
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, min_insync_replicas=2, replica_ack_timeout_ms=500)
    with MessageStore.open(str(tmp_path / "b"), SMALL) as own:  # a longer history of its own
        own.producer("g").send_batch([Message("t", b"mine-%d" % i) for i in range(50)])
    a = serve(tmp_path, "a", ports[0], rs)
    b = serve(tmp_path, "b", ports[1], rs)
    try:
        with pytest.raises(ReplicaAckTimeoutError):
            a.store.producer("g").send(Message("t", b"theirs"))
        assert a.store.confirmed_offset() < b.store.confirmed_offset()
        assert a.replica.acks.acked == -1
    finally:
        b.close()
        a.close()


def test_flight_writers_append_while_others_wait_for_their_replicas(tmp_path):
    """The served store's write section is released before the replica wait: a second
    sender appends while the first waits (and one report would release both)."""
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, min_insync_replicas=2, replica_ack_timeout_ms=3000)
    leader = serve(tmp_path, "a", ports[0], rs)  # its follower does not run: every wait is long
    errors = []

    def send(body: bytes) -> None:
        with connect(leader.url) as remote:
            try:
                remote.producer("g").send(Message("t", body))
            except ReplicaAckTimeoutError as exc:
                errors.append(exc)

    try:
        senders = [threading.Thread(target=send, args=(b"w%d" % i,)) for i in range(3)]
        for t in senders:
            t.start()
        deadline = time.monotonic() + 2.5  # (before the first sender's wait ends)
        while bodies(leader.store, "t") != Counter({b"w0": 1, b"w1": 1, b"w2": 1}):
            assert time.monotonic() < deadline, bodies(leader.store, "t")
            time.sleep(0.01)
        for t in senders:
            t.join(30)
        assert len(errors) == 3  # none acknowledged: no follower holds them
    finally:
        leader.close()


def test_running_replicas_swap_roles_and_the_deposed_leader_cuts_its_tail(tmp_path):
    """become_leader on the running follower, then become_follower on the running leader
    (what an election calls): the old leader's writes of its last moments are cut and set
    aside, and it refuses writes naming the new leader."""
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    a, b = serve(tmp_path, "a", ports[0], rs), serve(tmp_path, "b", ports[1], rs)
    try:
        for i in range(10):
            a.store.producer("g").send(Message("t", b"m-%d" % i))
        shared = caught_up(a, b)
        b.replica.follower.stop()  # (b hears no more: a's next write stays a's alone)
        a.store.producer("g").send(Message("t", b"a-alone"))
        done = b.replica.become_leader()
        assert done["epoch"] == 2 and done["start_offset"] == shared  # (a-alone: not heard of)
        assert b.replica.role == "leader" and b.replica.leader == b.replica.me
        b.store.producer("g").send(Message("t", b"b-first"))
        with pytest.raises(StoreError, match="leads"):
            b.replica.become_leader()
        with pytest.raises(InvalidConfigError):
            a.replica.become_follower(a.replica.me)
        a.replica.become_follower(b.replica.me, epoch=2)
        end = same_log(b, a)
        assert commitlog_bytes(a.path, end) == commitlog_bytes(b.path, end)
        assert b"a-alone" not in bodies(a.store, "t") and bodies(a.store, "t")[b"b-first"] == 1
        assert a.replica.status()["last_cut"]["records"] == 1
        assert read_epochs(a.path) == [(1, 0), (2, shared)] == read_epochs(b.path)
        with connect(a.url) as remote, pytest.raises(NotLeaderError, match=b.url):
            remote.producer("g").send(Message("t", b"refused"))
        assert read_state(a.path)["role"] == "follower"
    finally:
        a.close()
        b.close()
