"""A RocketMQ 5 consumer group across a failover of a replica set served in this process:
the follower copies the leader's consumer progress, and once promoted hands out what the
group had not acked (and what was in flight), not everything again from 0."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_grpc_replicas import grpc_set, raw_message
from test_replica_set import caught_up

from store.files.consumer_progress import read_progress

pytestmark = pytest.mark.xdist_group("grpc")

TOPIC, GROUP = "orders", "billing"


def receive(stub, wait_s: int = 1) -> list:
    """The messages one ReceiveMessage of the group hands out (up to 32)."""
    got = stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=TOPIC)), batch_size=32,
        invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": wait_s}),
        timeout=wait_s + 10)
    return [r.message for r in got if r.HasField("message")]


def receive_n(stub, n: int, timeout_s: float = 20) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += receive(stub)
    return got


def ack(stub, messages) -> None:
    answer = stub.AckMessage(rpc.AckMessageRequest(
        group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC), entries=[
            rpc.AckMessageEntry(message_id=m.system_properties.message_id,
                                receipt_handle=m.system_properties.receipt_handle)
            for m in messages]))
    assert answer.status.code == pb.Code.OK, answer.status


def send(stub, bodies) -> None:
    for body in bodies:
        sent = stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message(TOPIC, body)]))
        assert sent.status.code == pb.Code.OK, sent.status


def committed(root: str) -> int:
    """The group's committed offsets on ``TOPIC`` in the files at ``root``, summed."""
    return sum(o for (g, t, _), o in read_progress(root).offsets.items()
               if (g, t) == (GROUP, TOPIC))


@pytest.mark.slow
def test_a_promoted_follower_hands_out_after_what_the_group_acked(tmp_path):
    serve = grpc_set(tmp_path, consumer_progress_sync_ms=100)
    leader, follower = serve(0), serve(1)
    old = [b"old-%d" % i for i in range(10)]
    new = [b"new-%d" % i for i in range(3)]
    try:
        with grpc.insecure_channel(leader.grpc_endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            send(stub, old)
            got = receive_n(stub, len(old))
            assert sorted(m.body for m in got) == old
            ack(stub, got)
            send(stub, new)
            in_flight = receive_n(stub, len(new))  # handed out, never acked
            assert sorted(m.body for m in in_flight) == new
        caught_up(leader, follower)
        deadline = time.monotonic() + 20
        while committed(follower.store.root) < len(old):  # the copy came
            assert time.monotonic() < deadline, follower.replica.status()
            time.sleep(0.02)
        status = follower.replica.status()
        assert status["consumer_progress_error"] is None, status
        assert status["consumer_progress_copied_ms"] is not None
        leader.close()  # the leader is gone
        follower.replica.become_leader(force=True)
        with grpc.insecure_channel(follower.grpc_endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            again = receive_n(stub, len(new))
            again += receive(stub)  # nothing more
            # what was in flight comes again (at least once); nothing acked does
            assert sorted(m.body for m in again) == new
            ack(stub, again)
            send(stub, [b"after"])
            assert [m.body for m in receive_n(stub, 1)] == [b"after"]
    finally:
        follower.close()
        leader.close()


@pytest.mark.slow
def test_a_group_resumes_after_its_acks_when_the_elected_leader_is_killed(tmp_path):
    """Three ``rmq serve`` processes (two replicas with ``--grpc``, a witness): the group
    acks on the leader, the leader is SIGKILLed, and the elected follower hands out only
    what was not acked."""
    from test_election import wait_for
    from test_grpc_failover import START_S, GrpcCluster

    cluster = GrpcCluster(tmp_path, consumer_progress_sync_ms=200, election_timeout_ms=3000)
    old = [b"old-%d" % i for i in range(10)]
    try:
        k = cluster.start_all()
        other = 1 - k
        with grpc.insecure_channel(cluster.grpc[k]) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            send(stub, old)
            got = receive_n(stub, len(old), timeout_s=60)
            assert sorted(m.body for m in got) == old
            ack(stub, got)
        wait_for("the follower's copy of the group's progress",
                 lambda: committed(cluster.dirs[other]) == len(old), timeout_s=60,
                 cluster=cluster)
        cluster.kill(k)
        wait_for("the other replica leads", lambda: cluster.leader() == other,
                 timeout_s=START_S, cluster=cluster)
        with grpc.insecure_channel(cluster.grpc[other]) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            assert [m.body for m in receive(stub, wait_s=2)] == []  # nothing acked again
            send(stub, [b"after"])
            assert [m.body for m in receive_n(stub, 1, timeout_s=60)] == [b"after"]
    finally:
        cluster.close()
