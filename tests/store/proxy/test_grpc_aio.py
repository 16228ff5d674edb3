"""The endpoint on ``grpc.aio``: sends of concurrent calls stored by group commit, each
answered with its own result; a remembered signature still held to its window; a receive
with messages to hand out answered on the event loop."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from store import MessageStore
from store.proxy import GrpcEndpoint
from store.proxy.access import AccessControl
from store.proxy.convert import Refused

from .signing import message, metadata, stored, stub, write_acl

pytestmark = pytest.mark.xdist_group("grpc")


def test_a_remembered_signature_is_still_held_to_its_window(tmp_path):
    path = tmp_path / "acl.json"
    write_acl(path)
    access = AccessControl.load(str(path))
    md = dict(metadata("orders-svc", at=1_700_000_000))
    at_ms = 1_700_000_000_000
    assert access.account(md, at_ms).access_key == "orders-svc"
    assert access.account(md, at_ms + 1000).access_key == "orders-svc"  # remembered
    with pytest.raises(Refused, match="not within"):
        access.account(md, at_ms + access.window_ms + 1000)
    forged = dict(md, authorization=md["authorization"][:-4] + "0000")
    for _ in range(2):  # a failed check is never remembered as a success
        with pytest.raises(Refused, match="does not match"):
            access.account(forged, at_ms)


@pytest.mark.parametrize("writer_thread", [False, True])
def test_concurrent_sends_are_grouped_and_each_answered_alone(tmp_path, writer_thread):
    store = MessageStore.open(str(tmp_path / "s"))
    endpoint = GrpcEndpoint(store, "127.0.0.1:0", acl=write_acl(tmp_path / "acl.json"),
                            writer_thread=writer_thread)
    s, channel = stub(endpoint.endpoint)
    md = metadata("orders-svc", "grouped")
    try:
        def send(i: int):
            m = message("orders", body=b"" if i % 10 == 3 else b"m%d" % i)
            return i, m.system_properties.message_id, s.SendMessage(
                rpc.SendMessageRequest(messages=[m]), metadata=md, timeout=30)

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(send, range(80)))
        good = [(msg_id, r) for i, msg_id, r in results if i % 10 != 3]
        bad = [r for i, _, r in results if i % 10 == 3]
        assert all(r.status.code == pb.Code.MESSAGE_BODY_EMPTY for r in bad)
        assert all(r.status.code == pb.Code.OK and r.entries[0].message_id == msg_id
                   for msg_id, r in good)
        commits = endpoint.service.commits
        assert commits.sends == len(good) and 1 <= commits.groups <= commits.sends
        assert stored(store.root, "orders") == len(good)
    finally:
        channel.close()
        endpoint.close()
        store.close()


def test_a_receive_that_finds_messages_is_answered_on_the_loop_and_acked(tmp_path):
    """No hand-off to a pool thread for a receive with something to hand out (nor for its
    acks): answered while every pool thread is busy; only a long poll waits in the pool."""
    store = MessageStore.open(str(tmp_path / "s"))
    endpoint = GrpcEndpoint(store, "127.0.0.1:0", acl=write_acl(tmp_path / "acl.json"))
    s, channel = stub(endpoint.endpoint)
    md = metadata("orders-svc", "loop-receiver")
    busy = ThreadPoolExecutor(1)
    release = threading.Event()
    try:
        sent = [message("orders", body=b"m%d" % i) for i in range(3)]
        assert s.SendMessage(rpc.SendMessageRequest(messages=sent), metadata=md,
                             timeout=30).status.code == pb.Code.OK
        busy.submit(release.wait, 60)  # the pool's only thread, taken
        endpoint.service.pool = busy

        def receive(polling_ms: int, timeout: float):
            request = rpc.ReceiveMessageRequest(
                group=pb.Resource(name="loop-group"), batch_size=16,
                message_queue=pb.MessageQueue(topic=pb.Resource(name="orders")))
            request.long_polling_timeout.FromMilliseconds(polling_ms)
            return list(s.ReceiveMessage(request, metadata=md, timeout=timeout))

        got = [r.message for r in receive(5_000, 20) if r.HasField("message")]
        assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
        acks = s.AckMessage(rpc.AckMessageRequest(
            group=pb.Resource(name="loop-group"), topic=pb.Resource(name="orders"),
            entries=[rpc.AckMessageEntry(message_id=m.system_properties.message_id,
                                         receipt_handle=m.system_properties.receipt_handle)
                     for m in got]), metadata=md, timeout=20)
        assert acks.status.code == pb.Code.OK
        assert [r.status.code for r in receive(0, 20)] == [pb.Code.MESSAGE_NOT_FOUND]
        with pytest.raises(grpc.RpcError) as waited:  # a long poll needs a pool thread
            receive(500, 2)
        assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        release.set()
        busy.shutdown(wait=True)
        channel.close()
        endpoint.close()
        store.close()


class _Context:
    def __init__(self, access_key: str) -> None:
        self.md = metadata(access_key, "checked-once")

    def invocation_metadata(self):
        return self.md

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def is_active(self) -> bool:
        return True


def test_a_consumers_names_rights_and_topic_are_checked_once_per_account(tmp_path,
                                                                           monkeypatch):
    """Every ack of a consumer asks the same: its group's and topic's names, its account's
    rights and whether the topic exists (a look at the store's files) are checked once per
    (account, group, topic); another account is checked on its own."""
    from store.proxy.grpc_service import MessagingService

    store = MessageStore.open(str(tmp_path / "s"))
    service = MessagingService([("s", store)],
                               access=AccessControl.load(write_acl(tmp_path / "acl.json")))
    try:
        owner, thief = _Context("orders-svc"), _Context("thief")
        ok = service.SendMessage(rpc.SendMessageRequest(
            messages=[message("orders", body=b"m%d" % i) for i in range(4)]), owner)
        assert ok.status.code == pb.Code.OK
        looks = []
        real = store.topics
        monkeypatch.setattr(store, "topics", lambda **kw: (looks.append(1), real(**kw))[1])
        group, topic = pb.Resource(name="checked"), pb.Resource(name="orders")
        request = rpc.ReceiveMessageRequest(group=group, batch_size=4,
                                            message_queue=pb.MessageQueue(topic=topic))
        got = [r.message for r in service.ReceiveMessage(request, owner)
               if r.HasField("message")]
        assert len(got) == 4
        for m in got:
            r = service.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=[
                rpc.AckMessageEntry(message_id=m.system_properties.message_id,
                                    receipt_handle=m.system_properties.receipt_handle)]),
                owner)
            assert r.status.code == pb.Code.OK
        assert len(looks) <= 1  # not once a call
        for _ in range(2):  # another account's rights are its own, every time
            r = service.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=[
                rpc.AckMessageEntry(message_id="x", receipt_handle="0:rmq1.0.0.0.0:00")]),
                thief)
            assert r.status.code == pb.Code.FORBIDDEN
    finally:
        service.close()
        store.close()
