"""A transaction's check-back reaches its producer wherever the producer's telemetry stream
is: a follower mirrors a producer's session on the leader (with the producer's own
headers), hands the leader's check-backs to the producer's stream, and passes the answer
(``EndTransaction`` from the check) on to the leader.  The leader checks the account: a
producer that may not publish to the topic gets no check-back through a follower either."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from test_grpc_replicas import bodies, grpc_set
from test_replica_set import caught_up

from store.proxy import follower_calls
from tests.store.proxy.signing import ACCOUNTS, Stream, message, metadata, stub

pytestmark = pytest.mark.xdist_group("grpc")


class Clock:
    """The leader's clock: real time (signatures are checked against it), moved on by the
    test past the transactions' immunity."""

    def __init__(self) -> None:
        self.ahead_ms = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.ahead_ms


def producer_settings(*topics) -> rpc.TelemetryCommand:
    return rpc.TelemetryCommand(settings=pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics])))


def is_check_back(command) -> bool:
    return command.HasField("recover_orphaned_transaction_command")


def open_half(s, md, topic: str, body: bytes) -> str:
    r = s.SendMessage(rpc.SendMessageRequest(messages=[
        message(topic, body, pb.MessageType.TRANSACTION)]), metadata=md)
    assert r.status.code == pb.Code.OK, r.status
    return r.entries[0].transaction_id


def wait_for(predicate, timeout_s: float = 10) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def sessions_of(server) -> set[str]:
    """The client ids of the telemetry sessions a server's gRPC endpoint holds."""
    service = server.endpoint.service
    with service._sessions_lock:
        return {c for c, s in service._sessions.items() if s.open and s.topics}


@pytest.fixture
def check_set(tmp_path):
    """``make(**server options)``: a leader and a follower (on a clock the test moves),
    each with its gRPC face; ``(leader, follower, clock)``."""
    made = []

    def make(**options):
        serve = grpc_set(tmp_path, **options)
        clock = Clock()
        made.append(serve(0, clock=clock))
        made.append(serve(1, clock=clock))
        return made[0], made[1], clock

    yield make
    for server in reversed(made):
        server.close()


def test_a_producer_on_a_follower_is_checked_back_and_its_answer_commits(check_set):
    leader, follower, clock = check_set()
    topic, md = "orders", metadata("orders-svc")  # (no ACL: the headers name a client id)
    s, channel = stub(follower.grpc_endpoint)  # the producer reaches the follower only
    producer = Stream(s, md)
    try:
        tid = open_half(s, md, topic, b"left open")  # passed on: the leader holds the half
        producer.send(producer_settings(topic))
        assert producer.wait(lambda c: c.HasField("settings"), 10)
        # the follower mirrors the producer's session on the leader (old code: never)
        wait_for(lambda: md[1][1] in sessions_of(leader), 5)
        clock.ahead_ms = 60_000  # past the transaction's immunity
        assert leader.check_round() == 1
        assert producer.wait(is_check_back, 10)
        (check,) = [c.recover_orphaned_transaction_command for c in producer.received
                    if is_check_back(c)]
        assert check.transaction_id == tid and check.message.body == b"left open"
        assert bodies(leader.store, topic) == []  # still a half
        answer = s.EndTransaction(rpc.EndTransactionRequest(
            topic=pb.Resource(name=topic), transaction_id=tid,
            message_id=check.message.system_properties.message_id,
            resolution=pb.TransactionResolution.COMMIT,
            source=pb.TransactionSource.SOURCE_SERVER_CHECK), metadata=md)
        assert answer.status.code == pb.Code.OK, answer.status
        assert bodies(leader.store, topic) == [b"left open"]  # committed on the leader
        caught_up(leader, follower)
        assert bodies(follower.store, topic) == [b"left open"]
    finally:
        producer.close()
        channel.close()
    # the producer's stream ended: so did its mirror on the leader
    assert wait_for(lambda: md[1][1] not in sessions_of(leader))


def test_a_follower_mirrors_no_right_the_account_lacks(check_set, tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": ACCOUNTS + [
        {"accessKey": "replicator", "secretKey": "replicator-secret", "replicate": True}]}))
    secret = tmp_path / "replicator.secret"
    secret.write_text("replicator-secret")
    leader, follower, clock = check_set(server={"acl": str(acl)}, account="replicator",
                                        secret_file=str(secret))
    topic, owner_md, thief_md = "orders", metadata("orders-svc"), metadata("thief")
    s, channel = stub(follower.grpc_endpoint)
    thief = Stream(s, thief_md)
    owner = None
    try:
        open_half(s, owner_md, topic, b"secret order")
        thief.send(producer_settings(topic, "mine"))  # "orders" it may not publish to
        assert thief.wait(lambda c: c.HasField("settings"), 10)
        owner = Stream(s, owner_md)
        owner.send(producer_settings(topic))
        both = {thief_md[1][1], owner_md[1][1]}
        assert wait_for(lambda: both <= sessions_of(leader)), sessions_of(leader)
        clock.ahead_ms = 60_000
        assert leader.check_round() == 1
        assert owner.wait(is_check_back, 10)  # the round asked the one that may publish
        assert not any(is_check_back(c) for c in thief.received)
    finally:
        thief.close()
        if owner is not None:
            owner.close()
        channel.close()


def test_a_producer_stream_ends_when_its_leader_goes_away(check_set, monkeypatch):
    """The mirror's stream ends with the leader: the follower, still not leading once the
    election had its time, ends the producer's stream, which the client opens again
    (signed anew) wherever it reaches."""
    monkeypatch.setattr(follower_calls, "LEADER_SETTLE_S", 0.5)
    leader, follower, _ = check_set()
    md = metadata("orders-svc")
    s, channel = stub(follower.grpc_endpoint)
    producer = Stream(s, md)
    try:
        producer.send(producer_settings("orders"))
        assert wait_for(lambda: md[1][1] in sessions_of(leader))
        leader.close()
        producer._reader.join(timeout=10)
        assert not producer._reader.is_alive()  # the stream ended
    finally:
        producer.close()
        channel.close()


def test_a_follower_that_comes_to_lead_keeps_its_producers_and_asks_them(check_set):
    """Another replica leads: the mirror on the old leader ends (looked at every second);
    the new leader is this replica, so the producer's stream stays and its own check
    rounds ask the producer."""
    leader, follower, clock = check_set()
    topic, md = "orders", metadata("orders-svc")
    s, channel = stub(follower.grpc_endpoint)
    producer = Stream(s, md)
    try:
        tid = open_half(s, md, topic, b"left open")
        producer.send(producer_settings(topic))
        assert wait_for(lambda: md[1][1] in sessions_of(leader))
        caught_up(leader, follower)
        follower.replica.become_leader(force=True)
        leader.replica.become_follower(follower.replica.me)
        assert wait_for(lambda: md[1][1] not in sessions_of(leader))  # the mirror ended
        assert producer._reader.is_alive()  # the producer's stream did not
        clock.ahead_ms = 60_000
        assert follower.check_round() == 1
        assert producer.wait(is_check_back, 10)
        (check,) = [c.recover_orphaned_transaction_command for c in producer.received
                    if is_check_back(c)]
        assert check.transaction_id == tid
    finally:
        producer.close()
        channel.close()
