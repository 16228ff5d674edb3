"""``rmq serve --grpc`` with Apache's official RocketMQ 5 Python client (rocketmq-python-client).

One server (a :class:`store.StoreServer` with ``grpc=``, in a thread) serves the module; every
test uses its own topics and consumer groups.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

import grpc  # noqa: E402
from rocketmq import (ClientConfiguration, ConsumeResult, Credentials,  # noqa: E402
                      FilterExpression, Message, MessageListener, Producer, PushConsumer,
                      SimpleConsumer, TransactionChecker, TransactionResolution)
from rocketmq.grpc_protocol import definition_pb2 as pb  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as rpc  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc  # noqa: E402

from store import StoreConfig, StoreReader, StoreServer  # noqa: E402

pytestmark = pytest.mark.xdist_group("grpc")

CONFIG = StoreConfig(transaction_timeout_ms=1000, transaction_check_interval_ms=300,
                     timer_precision_ms=100)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("grpc") / "store"
    srv = StoreServer(str(path), CONFIG, grpc="127.0.0.1:0")
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(timeout=30)


def _config(server) -> ClientConfiguration:
    return ClientConfiguration(server.grpc_endpoint, Credentials(), request_timeout=10)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _message(topic, body, *, tag=None, keys=None, props=None, group=None, deliver_at=None):
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    for k, v in (props or {}).items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    if deliver_at:
        m.delivery_timestamp = deliver_at
    return m


class _Producer:
    def __init__(self, server, topics, checker=None):
        self.p = Producer(_config(server), tuple(topics), checker)

    def __enter__(self) -> Producer:
        self.p.startup()
        return self.p

    def __exit__(self, *exc):
        self.p.shutdown()


class _Consumer:
    def __init__(self, server, group, topic, await_s=2):
        self.c = SimpleConsumer(_config(server), group, {topic: FilterExpression()},
                                await_duration=await_s)

    def __enter__(self) -> SimpleConsumer:
        self.c.startup()
        return self.c

    def __exit__(self, *exc):
        self.c.shutdown()


def _drain(consumer, want: int, timeout_s: float = 15, invisible_s: int = 20, ack=True):
    got = []
    end = time.time() + timeout_s
    while len(got) < want and time.time() < end:
        for m in consumer.receive(32, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def test_normal_and_fifo_messages_reach_a_simple_consumer_once(server):
    topic, group = _name("orders"), _name("g")
    with _Producer(server, [topic]) as p:
        sent = {}
        for i in range(5):
            r = p.send(_message(topic, f"n{i}".encode(), tag="created", keys=f"order-{i}",
                                props={"region": "eu"}))
            sent[r.message_id] = f"n{i}".encode()
        for i in range(5):
            r = p.send(_message(topic, f"f{i}".encode(), group="customer-7"))
            sent[r.message_id] = f"f{i}".encode()
    with _Consumer(server, group, topic) as c:
        got = _drain(c, len(sent))
        assert {m.message_id: m.body for m in got} == sent
        assert len(got) == len(sent)  # each once
        normal = [m for m in got if m.body.startswith(b"n")]
        assert all(m.tag == "created" and m.properties == {"region": "eu"} for m in normal)
        assert {next(iter(m.keys)) for m in normal} == {f"order-{i}" for i in range(5)}
        fifo = [m for m in got if m.body.startswith(b"f")]
        assert [m.body for m in fifo] == [f"f{i}".encode() for i in range(5)]  # one queue
        assert all(m.message_group == "customer-7" for m in fifo)
        assert c.receive(32, 20) == []  # nothing more once acked


def test_store_keeps_the_clients_ids_tags_keys_and_properties(server):
    topic = _name("ids")
    with _Producer(server, [topic]) as p:
        r = p.send(_message(topic, b"x", tag="t1", keys="k1", props={"a": "1"}))
    reader = StoreReader.open(server.path)
    try:
        views = [v for q in reader.queue_ids(topic) for v in reader.pull(topic, q, 0, 10)]
    finally:
        reader.close()
    (v,) = views
    assert (v.msg_id, v.tags, v.keys, dict(v.properties), bytes(v.body)) == (
        r.message_id, "t1", ("k1",), {"a": "1"}, b"x")


def test_delay_message_is_never_received_early(server):
    topic, group = _name("delay"), _name("g")
    due_ms = int(time.time() * 1000) + 2000
    with _Producer(server, [topic]) as p:
        r = p.send(_message(topic, b"later", deliver_at=due_ms))
        assert r.recall_handle
    with _Consumer(server, group, topic, await_s=1) as c:
        seen_at = None
        end = time.time() + 15
        while seen_at is None and time.time() < end:
            got = c.receive(32, 20)
            now_ms = int(time.time() * 1000)
            for m in got:
                assert m.message_id == r.message_id
                assert now_ms >= due_ms, f"received {due_ms - now_ms} ms early"
                seen_at = now_ms
                c.ack(m)
        assert seen_at is not None, "the delay message never surfaced"
        assert seen_at - due_ms < 3000


def test_recall_cancels_a_delay_message(server):
    topic, group = _name("recall"), _name("g")
    due_ms = int(time.time() * 1000) + 1500
    with _Producer(server, [topic]) as p:
        kept = p.send(_message(topic, b"kept", deliver_at=due_ms))
        gone = p.send(_message(topic, b"gone", deliver_at=due_ms))
        assert p.recall_message(topic, gone.recall_handle) == gone.message_id
        with pytest.raises(Exception, match="40400|no pending"):
            p.recall_message(topic, gone.recall_handle)  # already recalled
    time.sleep(2)
    with _Consumer(server, group, topic, await_s=1) as c:
        got = _drain(c, 1, timeout_s=5)
        got += c.receive(32, 20)
        assert [m.message_id for m in got] == [kept.message_id]


class _Checker(TransactionChecker):
    def __init__(self):
        self.asked = []

    def check(self, message):
        self.asked.append(message.message_id)
        return TransactionResolution.COMMIT


def test_transactions_commit_rollback_and_check_back(server):
    topic, group = _name("pay"), _name("g")
    checker = _Checker()
    with _Producer(server, [topic], checker) as p:
        t1 = p.begin_transaction()
        committed = p.send(_message(topic, b"commit"), t1)
        t1.commit()
        t2 = p.begin_transaction()
        p.send(_message(topic, b"rollback"), t2)
        t2.rollback()
        t3 = p.begin_transaction()
        orphan = p.send(_message(topic, b"orphan"), t3)  # never ended by its sender
        with _Consumer(server, group, topic, await_s=1) as c:
            got = _drain(c, 2, timeout_s=20)
            got += c.receive(32, 20)
        assert sorted(m.body for m in got) == [b"commit", b"orphan"]
        assert {m.message_id for m in got} == {committed.message_id, orphan.message_id}
        assert orphan.message_id in checker.asked
        assert committed.message_id not in checker.asked


def test_unacked_message_is_received_again_after_its_invisible_duration(server):
    topic, group = _name("retry"), _name("g")
    with _Producer(server, [topic]) as p:
        r = p.send(_message(topic, b"once more"))
    with _Consumer(server, group, topic, await_s=1) as c:
        (first,) = _drain(c, 1, invisible_s=2, ack=False)
        assert first.message_id == r.message_id
        assert c.receive(32, 2) == []  # invisible
        time.sleep(2.2)
        (second,) = _drain(c, 1, invisible_s=2, ack=False)
        assert second.message_id == r.message_id and second.delivery_attempt == 2
        c.ack(second)
        with pytest.raises(Exception, match="40013"):
            c.ack(first)  # the first hand-out's handle is stale


class _Listener(MessageListener):
    def __init__(self):
        self.bodies = []
        self.done = threading.Event()

    def consume(self, message):
        self.bodies.append(message.body)
        if len(self.bodies) >= 3:
            self.done.set()
        return ConsumeResult.SUCCESS


def test_push_consumer_consumes_a_topic(server):
    topic, group = _name("push"), _name("g")
    with _Producer(server, [topic]) as p:
        for i in range(3):
            p.send(_message(topic, f"p{i}".encode()))
    listener = _Listener()
    c = PushConsumer(_config(server), group, listener, {topic: FilterExpression()})
    c.startup()
    try:
        assert listener.done.wait(20), listener.bodies
    finally:
        c.shutdown()
    assert sorted(listener.bodies) == [b"p0", b"p1", b"p2"]


# -- bad input through the raw protocol ------------------------------------------------
@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(server.grpc_endpoint)
    yield service_pb2_grpc.MessagingServiceStub(channel), channel
    channel.close()


def _raw_message(topic, body=b"x", **props):
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = props.pop("message_id", uuid.uuid4().hex.upper())
    m.system_properties.message_type = props.pop("message_type", pb.MessageType.NORMAL)
    m.system_properties.body_encoding = pb.Encoding.IDENTITY
    for k, v in props.items():
        m.user_properties[k] = v
    return m


def test_bad_sends_get_their_status_and_store_nothing(server, stub):
    s, _ = stub
    topic = _name("bad")
    cases = [
        (_raw_message(topic, b""), pb.Code.MESSAGE_BODY_EMPTY),
        (_raw_message(topic, b"x" * (CONFIG.max_message_size_bytes + 1)),
         pb.Code.MESSAGE_BODY_TOO_LARGE),
        (_raw_message("bad topic!"), pb.Code.ILLEGAL_TOPIC),
        (_raw_message(topic, UNIQ_KEY="x"), pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (_raw_message(topic, message_id="bad id"), pb.Code.BAD_REQUEST),
        (_raw_message(topic, message_type=pb.MessageType.FIFO), pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (_raw_message(topic, message_type=pb.MessageType.DELAY), pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    ]
    for message, code in cases:
        r = s.SendMessage(rpc.SendMessageRequest(messages=[message]))
        assert r.status.code == code, (code, r.status)
        assert r.status.message
    # a batch with one bad message stores none of it
    good = _raw_message(topic, b"good")
    r = s.SendMessage(rpc.SendMessageRequest(messages=[good, _raw_message(topic, b"")]))
    assert r.status.code == pb.Code.MESSAGE_BODY_EMPTY
    reader = StoreReader.open(server.path)
    try:
        assert topic not in reader.topics() or all(
            reader.max_offset(topic, q) == 0 for q in reader.queue_ids(topic))
    finally:
        reader.close()
    # and the server still serves
    r = s.SendMessage(rpc.SendMessageRequest(messages=[good]))
    assert r.status.code == pb.Code.OK


def test_consumer_errors_unknown_topic_and_bad_handles(server, stub):
    s, _ = stub
    group = pb.Resource(name=_name("g"))
    missing = pb.Resource(name=_name("missing"))
    responses = list(s.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=missing), batch_size=1)))
    assert [r.status.code for r in responses] == [pb.Code.TOPIC_NOT_FOUND]
    topic = pb.Resource(name=_name("acks"))
    assert s.SendMessage(rpc.SendMessageRequest(
        messages=[_raw_message(topic.name)])).status.code == pb.Code.OK
    r = s.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=[
        rpc.AckMessageEntry(message_id="x", receipt_handle="garbage")]))
    assert r.status.code == pb.Code.INVALID_RECEIPT_HANDLE
    assert r.entries[0].status.code == pb.Code.INVALID_RECEIPT_HANDLE
    r = s.ChangeInvisibleDuration(rpc.ChangeInvisibleDurationRequest(
        group=group, topic=topic, receipt_handle="rmq1.0.0.0.0"))
    assert r.status.code == pb.Code.INVALID_RECEIPT_HANDLE
    r = list(s.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=topic), batch_size=1000)))
    assert r[0].status.code == pb.Code.BAD_REQUEST


def test_malformed_requests_and_vanishing_clients_leave_the_server_serving(server, stub):
    s, channel = stub
    raw = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff\xff not a protobuf")
    assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    # a telemetry stream whose client goes away mid-stream
    settings = rpc.TelemetryCommand(settings=pb.Settings(
        client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing()))
    stream = s.Telemetry(iter([settings]), metadata=[("x-mq-client-id", "vanishing")])
    first = next(stream)
    assert first.settings.publishing.max_body_size == CONFIG.max_message_size_bytes
    stream.cancel()
    # a telemetry stream without a client id
    (only,) = list(s.Telemetry(iter([settings])))
    assert only.status.code == pb.Code.CLIENT_ID_REQUIRED
    r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=_name("still"))))
    assert r.status.code == pb.Code.OK and len(r.message_queues) == 4


def test_check_back_asks_only_about_the_endpoints_own_halves(server):
    from store import LocalTransactionState
    from store import Message as StoreMessage

    class Unknown:
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, view):
            return LocalTransactionState.UNKNOW

    topic = _name("mixed")
    checker = _Checker()
    with _Producer(server, [topic], checker) as p:
        other = server.store.transaction_producer("another-group", Unknown()).send_in_transaction(
            StoreMessage(topic, b"another group's"))
        t = p.begin_transaction()
        mine = p.send(_message(topic, b"mine"), t)  # left open: the check-back asks
        end = time.time() + 20
        while mine.message_id not in checker.asked and time.time() < end:
            time.sleep(0.2)
        time.sleep(1.0)  # more rounds pass
    assert mine.message_id in checker.asked
    assert other.msg_id not in checker.asked
