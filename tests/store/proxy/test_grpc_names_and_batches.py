"""``rmq serve --grpc``: every path that names something checks the name before the store
sees it (a route query creating a topic, a send, a consumer's group, a client id, keys and
properties), and a batch is checked whole: a bad message refuses it before anything of it
is stored."""

from __future__ import annotations

import gzip
import uuid

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq.grpc_protocol import definition_pb2 as pb  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as rpc  # noqa: E402

from store import StoreConfig, StoreReader  # noqa: E402
from tests.store.proxy.signing import Stream, message, serving, stored  # noqa: E402

pytestmark = pytest.mark.xdist_group("grpc")

CONFIG = StoreConfig(max_message_size_bytes=64 * 1024)
BAD_NAMES = ["/etc/passwd", "a\x00b", "x" * 200_000, "..", "rmq_sys_wheel_timer", "a b"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(str(tmp_path_factory.mktemp("names") / "store"), CONFIG) as both:
        yield both


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _store_still_reads(srv) -> None:
    from rmq_cli.stats import collect_stats

    reader = StoreReader.open(srv.path)
    try:
        topics = reader.topics()
    finally:
        reader.close()
    assert not set(topics) & set(BAD_NAMES)
    collect_stats(srv.store, include_system=True)  # what `rmq stats` shows


@pytest.mark.parametrize("name", BAD_NAMES, ids=["path", "nul", "200k", "dots", "system",
                                                 "space"])
def test_a_bad_topic_name_is_refused_on_every_path(server, name):
    srv, s = server
    r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=name)))
    assert r.status.code == pb.Code.ILLEGAL_TOPIC, r.status
    r = s.SendMessage(rpc.SendMessageRequest(messages=[message(name)]))
    assert r.status.code == pb.Code.ILLEGAL_TOPIC, r.status
    group = pb.Resource(name=_name("g"))
    (only,) = list(s.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=pb.Resource(name=name)),
        batch_size=1)))
    assert only.status.code == pb.Code.ILLEGAL_TOPIC
    r = s.QueryAssignment(rpc.QueryAssignmentRequest(topic=pb.Resource(name=name), group=group))
    assert r.status.code == pb.Code.ILLEGAL_TOPIC
    assert len(r.status.message) < 1000  # the name is cut in the answer
    _store_still_reads(srv)


@pytest.mark.parametrize("group", ["/etc/passwd", "g\x00", "g" * 121, "a b"])
def test_a_bad_consumer_group_is_refused(server, group):
    srv, s = server
    topic = _name("t")
    assert s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=topic))).status.code == \
        pb.Code.OK
    (only,) = list(s.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic)), batch_size=1)))
    assert only.status.code == pb.Code.ILLEGAL_CONSUMER_GROUP
    r = s.ForwardMessageToDeadLetterQueue(rpc.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle="x"))
    assert r.status.code == pb.Code.ILLEGAL_CONSUMER_GROUP
    _store_still_reads(srv)


def test_bad_client_ids_keys_tags_and_properties_are_refused(server):
    srv, s = server
    stream = Stream(s, [("x-mq-client-id", "c" * 1000)])
    try:
        assert stream.wait(lambda c: c.status.code == pb.Code.BAD_REQUEST, 10)
    finally:
        stream.close()
    topic = _name("t")
    cases = []
    m = message(topic)
    m.system_properties.keys.append("k" * 200_000)
    cases.append((m, pb.Code.ILLEGAL_MESSAGE_KEY))
    m = message(topic)
    m.system_properties.tag = "t" * 200_000
    cases.append((m, pb.Code.ILLEGAL_MESSAGE_TAG))
    cases.append((message(topic, big="v" * 40_000), pb.Code.MESSAGE_PROPERTIES_TOO_LARGE))
    cases.append((message(topic, message_id="i" * 200_000), pb.Code.BAD_REQUEST))
    cases.append((message(topic, message_id="a\x00b"), pb.Code.BAD_REQUEST))
    for m, code in cases:
        r = s.SendMessage(rpc.SendMessageRequest(messages=[m]))
        assert r.status.code == code, (code, r.status)
    assert stored(srv.path, topic) == 0


@pytest.mark.parametrize("bad", ["message_id", "blank_property", "large_properties"])
def test_a_half_bad_batch_stores_nothing(server, bad):
    srv, s = server
    topic = _name("batch")
    second = {"message_id": message(topic, b"second", message_id="bad id"),
              "blank_property": message(topic, b"second", color=""),
              "large_properties": message(topic, b"second", big="v" * 40_000)}[bad]
    r = s.SendMessage(rpc.SendMessageRequest(messages=[message(topic, b"first"), second]))
    assert r.status.code != pb.Code.OK, r.status
    assert stored(srv.path, topic) == 0
    r = s.SendMessage(rpc.SendMessageRequest(messages=[message(topic, b"first")]))
    assert r.status.code == pb.Code.OK
    assert stored(srv.path, topic) == 1


def test_a_gzip_body_is_inflated_within_the_body_limit(server):
    srv, s = server
    topic = _name("gzip")
    for body, code in [(gzip.compress(b"small"), pb.Code.OK),
                       (gzip.compress(b"\0" * (CONFIG.max_message_size_bytes + 1)),
                        pb.Code.MESSAGE_BODY_TOO_LARGE),
                       (b"not gzip at all", pb.Code.MESSAGE_CORRUPTED)]:
        m = message(topic, body)
        m.system_properties.body_encoding = pb.Encoding.GZIP
        r = s.SendMessage(rpc.SendMessageRequest(messages=[m]))
        assert r.status.code == code, (code, r.status)
    assert stored(srv.path, topic) == 1
