"""The RocketMQ gRPC face (``--grpc``) of a replica set served in this process: a follower
passes the leader's calls on to it, refuses them when it cannot (``HA_NOT_AVAILABLE``,
which the official clients retry), routes name every replica, and the official Python
client given both endpoints sends and consumes through either."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

import grpc
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_replica_set import SMALL, caught_up, free_port

from store import StoreServer
from store.base.errors import NotLeaderError

pytestmark = pytest.mark.xdist_group("grpc")


def bodies(store, topic: str) -> list[bytes]:
    return [b for q in store.queue_ids(topic) for b in store.read_arrow(
        topic, q, store.min_offset(topic, q), store.max_offset(topic, q)).column(
        "body").to_pylist()]


def raw_message(topic: str, body: bytes) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = uuid.uuid4().hex.upper()
    m.system_properties.message_type = pb.MessageType.NORMAL
    m.system_properties.body_encoding = pb.Encoding.IDENTITY
    return m


def grpc_set(tmp_path, server: dict | None = None, **more):
    """``serve(i)``: starts replica ``i`` of a static set of two (0 leads), each with its
    gRPC face; ``server``: more arguments of the ``StoreServer``s (``serve(i, **options)``
    adds more still); ``more``: further fields of the replica-set file."""
    ports, grpc_ports = (free_port(), free_port()), (free_port(), free_port())
    urls = [f"rmq://127.0.0.1:{p}" for p in ports]
    rs = tmp_path / "replicas.json"
    rs.write_text(json.dumps({"replicas": urls, "grpc": {
        u: f"127.0.0.1:{g}" for u, g in zip(urls, grpc_ports)}, **more}))

    def serve(i: int, **options) -> StoreServer:
        return StoreServer(str(tmp_path / f"s{i}"), SMALL, listen=f"127.0.0.1:{ports[i]}",
                           replica_set=str(rs), grpc=f"127.0.0.1:{grpc_ports[i]}",
                           **(server or {}), **options)
    return serve


@pytest.fixture
def static_set(tmp_path):
    """A leader and a follower (a static set), each with its gRPC face."""
    serve = grpc_set(tmp_path)
    servers = []
    try:
        for i in (0, 1):
            servers.append(serve(i))
        yield servers
    finally:
        for s in servers:
            s.close()


def test_a_follower_passes_sends_on_to_the_leader_and_routes_name_both(static_set):
    leader, follower = static_set
    assert follower.replica.is_follower and not leader.replica.is_follower
    topic = "orders"
    with grpc.insecure_channel(follower.grpc_endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=topic)))
        assert route.status.code == pb.Code.OK
        named = {(a.host, a.port) for q in route.message_queues
                 for a in q.broker.endpoints.addresses}
        assert named == {("127.0.0.1", int(s.grpc_endpoint.rpartition(":")[2]))
                         for s in static_set}
        sent = stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message(topic, b"one")]))
        assert sent.status.code == pb.Code.OK, sent.status
        assert bodies(leader.store, topic) == [b"one"]  # stored by the leader, once
        caught_up(leader, follower)
        assert bodies(follower.store, topic) == [b"one"]  # copied as any write
        # a call passed on already is answered where it arrives: a follower refuses it
        refused = stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message(topic, b"x")]),
                                   metadata=(("x-rmq-forwarded", "1"),))
        assert refused.status.code == pb.Code.HA_NOT_AVAILABLE, refused.status
        assert follower.replica.leader in refused.status.message
        assert bodies(leader.store, topic) == [b"one"]  # nothing stored
        passed_on = (("x-rmq-forwarded", "1"),)
        where = {"group": pb.Resource(name="g"), "topic": pb.Resource(name=topic)}
        for call, request in (
                ("EndTransaction", rpc.EndTransactionRequest(
                    topic=pb.Resource(name=topic), transaction_id="T1", message_id="T1",
                    resolution=pb.TransactionResolution.COMMIT)),
                ("RecallMessage", rpc.RecallMessageRequest(topic=pb.Resource(name=topic),
                                                           recall_handle="x")),
                ("AckMessage", rpc.AckMessageRequest(**where, entries=[
                    rpc.AckMessageEntry(message_id="M", receipt_handle="h")])),
                ("ChangeInvisibleDuration", rpc.ChangeInvisibleDurationRequest(
                    **where, receipt_handle="h", invisible_duration={"seconds": 5})),
                ("QueryAssignment", rpc.QueryAssignmentRequest(**where))):
            answer = getattr(stub, call)(request, metadata=passed_on)
            assert answer.status.code == pb.Code.HA_NOT_AVAILABLE, (call, answer.status)
        # the consumer groups are the leader's: a receive through the follower hands out
        # the leader's messages, an ack through it acks there
        got = list(stub.ReceiveMessage(rpc.ReceiveMessageRequest(
            group=pb.Resource(name="g"), message_queue=pb.MessageQueue(
                topic=pb.Resource(name=topic)), batch_size=8,
            long_polling_timeout={"seconds": 1})))
        handed = [r.message for r in got if r.HasField("message")]
        assert [m.body for m in handed] == [b"one"]
        acked = stub.AckMessage(rpc.AckMessageRequest(
            group=pb.Resource(name="g"), topic=pb.Resource(name=topic),
            entries=[rpc.AckMessageEntry(message_id=handed[0].system_properties.message_id,
                                         receipt_handle=handed[0].system_properties.
                                         receipt_handle)]))
        assert acked.status.code == pb.Code.OK, acked.status


def test_a_replica_that_does_not_lead_refuses_every_write_of_the_grpc_face(static_set):
    """The check the calls go through when they are not passed on (no leader known, a lease
    lapsed): every write and consumer-group call of the face, before anything is stored."""
    _, follower = static_set
    service = follower.endpoint.service
    with pytest.raises(NotLeaderError, match="follower"), service.leader_write("SendMessage"):
        pass
    with pytest.raises(NotLeaderError):
        service.check_leading("AckMessage")


def test_the_official_client_given_both_endpoints_sends_and_consumes(static_set):
    leader, _ = static_set
    topic, group = "payments", "billing"
    endpoints = ";".join(s.grpc_endpoint for s in static_set)
    config = ClientConfiguration(endpoints, Credentials(), request_timeout=10)
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        ids = set()
        for i in range(20):
            m = Message()
            m.topic, m.body = topic, b"p%d" % i
            ids.add(producer.send(m).message_id)
    finally:
        producer.shutdown()
    assert sorted(bodies(leader.store, topic)) == sorted(b"p%d" % i for i in range(20))
    consumer = SimpleConsumer(ClientConfiguration(endpoints, Credentials(), request_timeout=10),
                              group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        got, end = {}, time.monotonic() + 20
        while len(got) < len(ids) and time.monotonic() < end:
            for m in consumer.receive(32, 20):
                got[m.message_id] = m.body
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert set(got) == ids


def test_no_change_of_role_comes_between_the_check_and_the_append(static_set):
    """A write of the gRPC face holds the store's append lock from its check to its append:
    a change of role (which takes that lock) waits for it, and the next write is refused."""
    leader, follower = static_set
    service = leader.endpoint.service
    changed = threading.Event()

    def depose():
        leader.replica.become_follower(follower.replica.me)
        changed.set()

    with service.leader_write("SendMessage"):
        thread = threading.Thread(target=depose)
        thread.start()
        assert not changed.wait(0.5)  # (waits for the write in progress)
    assert changed.wait(10)
    thread.join(10)
    with pytest.raises(NotLeaderError), service.leader_write("SendMessage"):
        pass


def receive(stub, topic: str, group: str = "g", wait_s: int = 1) -> list[bytes]:
    """The bodies one ReceiveMessage of ``group`` hands out (up to 32, long polling
    ``wait_s``)."""
    got = stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic)), batch_size=32,
        long_polling_timeout={"seconds": wait_s}), timeout=wait_s + 10)
    return [r.message.body for r in got if r.HasField("message")]


def test_a_grpc_consumer_gets_a_message_only_once_enough_replicas_hold_it(tmp_path):
    """With ``min_insync_replicas: 2`` and the follower stopped, a send the leader stored
    but could not acknowledge is not handed out (a failover would lose it) until the
    follower, back, holds it: the consumer groups read below the high watermark."""
    serve = grpc_set(tmp_path, min_insync_replicas=2, replica_ack_timeout_ms=300)
    leader, follower = serve(0), serve(1)
    topic = "orders"
    try:
        with grpc.insecure_channel(leader.grpc_endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            for body in (b"m-0", b"m-1"):
                sent = stub.SendMessage(rpc.SendMessageRequest(
                    messages=[raw_message(topic, body)]))
                assert sent.status.code == pb.Code.OK, sent.status
            follower.close()  # nothing new is held by two replicas from now on
            sent = stub.SendMessage(rpc.SendMessageRequest(
                messages=[raw_message(topic, b"late")]))
            assert sent.status.code == pb.Code.SLAVE_PERSISTENCE_TIMEOUT, sent.status
            assert sorted(bodies(leader.store, topic)) == [b"late", b"m-0", b"m-1"]
            assert sorted(receive(stub, topic)) == [b"m-0", b"m-1"]
            assert receive(stub, topic) == []  # "late" is in the log, not handed out
            follower = serve(1)  # back: it copies "late", the watermark passes it
            got, deadline = [], time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                got = receive(stub, topic)
            assert got == [b"late"]
    finally:
        follower.close()
        leader.close()
