"""``rmq serve --grpc --acl``: every call is authorized by what it touches, not by the names
it gives.  An account without rights on a topic cannot get the check-back of its open
transactions, end them, take over or end another account's client id, ack another account's
hand-outs, or recall a delay message by a handle it made up."""

from __future__ import annotations

import base64
import time

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq.grpc_protocol import definition_pb2 as pb  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as rpc  # noqa: E402

from store import StoreConfig  # noqa: E402
from tests.store.proxy.signing import (Stream, message, metadata, serving,  # noqa: E402
                                       stored, write_acl)

pytestmark = pytest.mark.xdist_group("grpc")

CONFIG = StoreConfig(transaction_timeout_ms=1000, transaction_check_interval_ms=300,
                     timer_precision_ms=100)


@pytest.fixture
def acl_server(tmp_path):
    with serving(str(tmp_path / "store"), CONFIG, acl=write_acl(tmp_path / "acl.json")) as both:
        yield both


def _producer_settings(*topics) -> rpc.TelemetryCommand:
    return rpc.TelemetryCommand(settings=pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics])))


def _open_transaction(s, topic: str = "orders") -> str:
    r = s.SendMessage(rpc.SendMessageRequest(messages=[
        message(topic, b"secret order", pb.MessageType.TRANSACTION)]),
        metadata=metadata("orders-svc"))
    assert r.status.code == pb.Code.OK, r.status
    return r.entries[0].transaction_id


def _is_check_back(command) -> bool:
    return command.HasField("recover_orphaned_transaction_command")


def test_check_back_goes_only_to_producers_that_may_publish_the_topic(acl_server):
    srv, s = acl_server
    _open_transaction(s)
    thief = Stream(s, metadata("thief"))
    try:
        thief.send(_producer_settings("orders", "mine"))
        assert thief.wait(lambda c: c.HasField("settings"), 10)
        # the check rounds run every 300 ms once the half is 1 s old: old code sent the
        # thief the whole half message here
        assert not thief.wait(_is_check_back, 3.0)
        owner = Stream(s, metadata("orders-svc"))
        try:
            owner.send(_producer_settings("orders"))
            assert owner.wait(_is_check_back, 10)  # the rounds ran; the owner is asked
        finally:
            owner.close()
        assert not any(_is_check_back(c) for c in thief.received)
    finally:
        thief.close()


def test_end_transaction_is_authorized_by_the_transactions_own_topic(acl_server):
    srv, s = acl_server
    tid = _open_transaction(s)
    r = s.EndTransaction(rpc.EndTransactionRequest(
        topic=pb.Resource(name="mine"), transaction_id=tid,
        resolution=pb.TransactionResolution.COMMIT), metadata=metadata("thief"))
    assert r.status.code == pb.Code.FORBIDDEN, r.status
    assert "orders" in r.status.message
    assert stored(srv.path, "orders") == 0  # still open: not committed
    r = s.EndTransaction(rpc.EndTransactionRequest(
        topic=pb.Resource(name="orders"), transaction_id=tid,
        resolution=pb.TransactionResolution.COMMIT), metadata=metadata("orders-svc"))
    assert r.status.code == pb.Code.OK, r.status
    assert stored(srv.path, "orders") == 1


def test_end_transaction_refuses_halves_not_sent_through_the_endpoint(acl_server):
    from store import Message as StoreMessage
    from store.produce.transaction_producer import LeaveOpen

    srv, s = acl_server
    other = srv.store.transaction_producer("in-process", LeaveOpen()).send_in_transaction(
        StoreMessage("orders", b"another producer group's"))
    r = s.EndTransaction(rpc.EndTransactionRequest(
        topic=pb.Resource(name="orders"), transaction_id=other.transaction_id,
        resolution=pb.TransactionResolution.COMMIT), metadata=metadata("admin"))
    assert r.status.code == pb.Code.INVALID_TRANSACTION_ID, r.status


def test_a_client_id_belongs_to_the_account_that_opened_it(acl_server):
    srv, s = acl_server
    owner = Stream(s, metadata("orders-svc", "client-1"))
    try:
        owner.send(_producer_settings("orders"))
        assert owner.wait(lambda c: c.HasField("settings"), 10)
        # another account can neither end the session nor take the client id over
        r = s.NotifyClientTermination(rpc.NotifyClientTerminationRequest(),
                                      metadata=metadata("thief", "client-1"))
        assert r.status.code == pb.Code.FORBIDDEN, r.status
        taken = Stream(s, metadata("thief", "client-1"))
        try:
            assert taken.wait(lambda c: c.status.code == pb.Code.FORBIDDEN, 10)
        finally:
            taken.close()
        service = srv._asks.service
        assert [x.client_id for x in service.producers_of("orders")] == ["client-1"]
        # its owner can
        r = s.NotifyClientTermination(rpc.NotifyClientTerminationRequest(),
                                      metadata=metadata("orders-svc", "client-1"))
        assert r.status.code == pb.Code.OK, r.status
        assert service.producers_of("orders") == []
    finally:
        owner.close()


def _receive(s, access_key: str, topic: str, group: str):
    responses = list(s.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic)), batch_size=1,
        long_polling_timeout={"seconds": 2}), metadata=metadata(access_key)))
    return [r.message for r in responses if r.HasField("message")]


def test_receipt_handles_are_bound_to_the_account_group_and_topic(acl_server):
    srv, s = acl_server
    r = s.SendMessage(rpc.SendMessageRequest(messages=[message("shared", b"one")]),
                      metadata=metadata("orders-svc"))
    assert r.status.code == pb.Code.OK
    (got,) = _receive(s, "orders-svc", "shared", "g")
    handle = got.system_properties.receipt_handle

    def ack(access_key, text, group="g"):
        return s.AckMessage(rpc.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name="shared"),
            entries=[rpc.AckMessageEntry(message_id=got.system_properties.message_id,
                                         receipt_handle=text)]), metadata=metadata(access_key))

    # another account of the same group, a forged handle (the handle without its tag, as
    # the old code made them), another group: refused
    assert ack("thief", handle).status.code == pb.Code.INVALID_RECEIPT_HANDLE
    assert ack("orders-svc", handle.rpartition(":")[0]).status.code == \
        pb.Code.INVALID_RECEIPT_HANDLE
    assert ack("orders-svc", handle, group="other").status.code == \
        pb.Code.INVALID_RECEIPT_HANDLE
    r = s.ChangeInvisibleDuration(rpc.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="g"), topic=pb.Resource(name="shared"), receipt_handle=handle,
        invisible_duration={"seconds": 5}), metadata=metadata("thief"))
    assert r.status.code == pb.Code.INVALID_RECEIPT_HANDLE
    assert ack("orders-svc", handle).status.code == pb.Code.OK


def test_recall_handles_cannot_be_made_from_a_message_id(acl_server):
    srv, s = acl_server
    due = int(time.time() * 1000) + 60_000
    m = message("orders", b"later", pb.MessageType.DELAY)
    m.system_properties.delivery_timestamp.FromMilliseconds(due)
    r = s.SendMessage(rpc.SendMessageRequest(messages=[m]), metadata=metadata("orders-svc"))
    assert r.status.code == pb.Code.OK, r.status
    entry = r.entries[0]
    assert entry.recall_handle

    def recall(text):
        return s.RecallMessage(rpc.RecallMessageRequest(
            topic=pb.Resource(name="orders"), recall_handle=text),
            metadata=metadata("orders-svc"))

    # what the old code accepted: the id and the timer queue offset, base64-encoded
    forged = base64.urlsafe_b64encode(
        f"rmq1 orders {entry.message_id} 0 0".encode()).decode()
    assert recall(forged).status.code == pb.Code.BAD_REQUEST
    encoded, _, tag = entry.recall_handle.partition(".")
    plain = base64.urlsafe_b64decode(encoded).decode().replace(" 0 0", " 1 0")
    assert recall(base64.urlsafe_b64encode(plain.encode()).decode() + "." + tag).status.code \
        == pb.Code.BAD_REQUEST
    assert recall(entry.recall_handle).status.code == pb.Code.OK


# -- the signature window ----------------------------------------------------------------
@pytest.mark.parametrize("age_s, code", [(0, pb.Code.OK), (14 * 60, pb.Code.OK),
                                         (-14 * 60, pb.Code.OK),
                                         (16 * 60, pb.Code.UNAUTHORIZED),
                                         (-16 * 60, pb.Code.UNAUTHORIZED)])
def test_a_signature_older_than_the_window_is_refused(acl_server, age_s, code):
    srv, s = acl_server
    r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="orders")),
                     metadata=metadata("orders-svc", at=time.time() - age_s))
    assert r.status.code == code, r.status


def test_the_signature_window_is_set_in_the_acl_file(tmp_path):
    import json

    from store.base.errors import InvalidConfigError
    from store.proxy.access import AccessControl
    from store.proxy.convert import Refused
    from tests.store.proxy.signing import ACCOUNTS

    path = tmp_path / "acl.json"
    path.write_text(json.dumps({"signatureWindowSeconds": 60, "accounts": ACCOUNTS}))
    access = AccessControl.load(str(path))
    headers = dict(metadata("thief", at=1_000_000))
    assert access.account(headers, now_ms=1_000_000_000 + 59_000).access_key == "thief"
    with pytest.raises(Refused, match="not within 60 s"):
        access.account(headers, now_ms=1_000_000_000 + 61_000)
    bad = dict(headers, **{"x-mq-date-time": "yesterday"})
    with pytest.raises(Refused):
        access.account(bad, now_ms=1_000_000_000)
    path.write_text(json.dumps({"signatureWindowSeconds": 0, "accounts": ACCOUNTS}))
    with pytest.raises(InvalidConfigError, match="signatureWindowSeconds"):
        AccessControl.load(str(path))


def test_a_listener_off_loopback_without_tls_warns(tmp_path, caplog):
    import logging

    from store import MessageStore
    from store.proxy import GrpcEndpoint

    store = MessageStore.open(str(tmp_path / "s"))
    try:
        with caplog.at_level(logging.WARNING, logger="store.proxy"):
            GrpcEndpoint(store, "0.0.0.0:0").close(grace_s=0)
            GrpcEndpoint(store, "127.0.0.1:0").close(grace_s=0)
    finally:
        store.close()
    warned = [r.getMessage() for r in caplog.records if "without TLS" in r.getMessage()]
    assert len(warned) == 1 and "0.0.0.0" in warned[0] and "in clear" in warned[0]
