"""``rmq serve --grpc-processes N``: one endpoint as several processes on one port; sends
through any process are stored, and a consumer group gets every message once, whichever
process it receives from and acks through."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("rocketmq.grpc_protocol")
psutil = pytest.importorskip("psutil")

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from store import InvalidConfigError, MessageStore, StoreServer
from store.proxy import GrpcEndpoint

from .signing import message, metadata, stored, write_acl

pytestmark = pytest.mark.xdist_group("grpc")

TOPIC = "orders"
CHANNELS = 12


@pytest.fixture
def two_processes(tmp_path):
    srv = StoreServer(str(tmp_path / "store"), grpc="127.0.0.1:0",
                      acl=write_acl(tmp_path / "acl.json"), grpc_processes=2)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.stop()
        thread.join(timeout=60)


def stub(endpoint: str):
    """A stub on a connection of its own (gRPC shares one between channels otherwise)."""
    channel = grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
    return service_pb2_grpc.MessagingServiceStub(channel), channel


def _workers_connected(srv) -> int:
    """Client connections the worker processes hold on the endpoint's port."""
    port = srv.endpoint.port
    n = 0
    for p in srv.endpoint.workers.processes:
        n += sum(1 for c in psutil.Process(p.pid).net_connections("tcp")
                 if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)
    return n


def _receive(s, md, group: str) -> list[tuple[str, str]]:
    request = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=-1),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=8)
    request.invisible_duration.seconds = 60
    request.long_polling_timeout.seconds = 0
    return [(r.message.system_properties.message_id, r.message.system_properties.receipt_handle)
            for r in s.ReceiveMessage(request, metadata=md, timeout=30)
            if r.HasField("message")]


def test_every_message_is_stored_and_received_once_across_processes(two_processes):
    srv = two_processes
    assert len(srv.endpoint.workers.processes) == 1
    # many connections: the kernel spreads them over the processes on the port
    clients = [stub(srv.grpc_endpoint) for _ in range(CHANNELS)]
    md = metadata("orders-svc", "multi-client")
    sent = set()
    try:
        for i in range(120):
            s, _ = clients[i % CHANNELS]
            m = message(TOPIC, body=b"m%d" % i)
            r = s.SendMessage(rpc.SendMessageRequest(messages=[m]), metadata=md, timeout=30)
            assert r.status.code == pb.Code.OK, r.status
            sent.add(m.system_properties.message_id)
        assert _workers_connected(srv) > 0  # a worker served some of them
        # receive through one connection, ack through another (often another process)
        got: list[str] = []
        for round_ in range(200):
            s, _ = clients[round_ % CHANNELS]
            batch = _receive(s, md, "billing")
            if not batch:
                break
            acker, _ = clients[(round_ + 5) % CHANNELS]
            for msg_id, handle in batch:
                a = acker.AckMessage(rpc.AckMessageRequest(
                    group=pb.Resource(name="billing"), topic=pb.Resource(name=TOPIC),
                    entries=[rpc.AckMessageEntry(message_id=msg_id, receipt_handle=handle)]),
                    metadata=md, timeout=30)
                assert a.status.code == pb.Code.OK, a.status
                got.append(msg_id)
        assert sorted(got) == sorted(sent)  # every message once, none twice
        assert stored(srv.path, TOPIC) == len(sent)
    finally:
        for _, channel in clients:
            channel.close()


def test_a_worker_refuses_what_the_primary_refuses(two_processes):
    """Forwarded calls keep their signature check: a forged handle and an unsigned call
    are refused whichever process takes them."""
    srv = two_processes
    clients = [stub(srv.grpc_endpoint) for _ in range(CHANNELS)]
    md = metadata("orders-svc", "forger")
    try:
        r = clients[0][0].SendMessage(rpc.SendMessageRequest(messages=[message(TOPIC)]),
                                      metadata=md, timeout=30)
        assert r.status.code == pb.Code.OK
        for s, _ in clients:
            a = s.AckMessage(rpc.AckMessageRequest(
                group=pb.Resource(name="billing"), topic=pb.Resource(name=TOPIC),
                entries=[rpc.AckMessageEntry(message_id="X", receipt_handle="0:rmq1.0.0.1.9:ff")]),
                metadata=md, timeout=30)
            assert a.status.code == pb.Code.INVALID_RECEIPT_HANDLE
            r = s.SendMessage(rpc.SendMessageRequest(messages=[message(TOPIC)]), timeout=30)
            assert r.status.code == pb.Code.UNAUTHORIZED
        assert _workers_connected(srv) > 0
    finally:
        for _, channel in clients:
            channel.close()


def test_workers_end_with_the_endpoint(tmp_path):
    store = MessageStore.open(str(tmp_path / "s"))
    try:
        endpoint = GrpcEndpoint(store, "127.0.0.1:0", processes=3)
        workers = list(endpoint.workers.processes)
        assert len(workers) == 2 and all(p.poll() is None for p in workers)
        endpoint.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(p.poll() is None for p in workers):
            time.sleep(0.1)
        assert all(p.poll() is not None for p in workers)
        with pytest.raises(InvalidConfigError, match="endpoint processes"):
            GrpcEndpoint([("a", store), ("b", store)], "127.0.0.1:0", processes=2)
    finally:
        store.close()


def test_rmq_serve_grpc_processes_needs_grpc(tmp_path):
    from click.testing import CliRunner

    from rmq_cli.cli import main

    result = CliRunner().invoke(main, ["serve", "--store", str(tmp_path / "s"), "--create",
                                       "--grpc-processes", "2", "--duration-s", "0"])
    assert result.exit_code != 0 and "--grpc-processes needs --grpc" in result.output


@pytest.fixture
def through_a_worker(tmp_path):
    """A primary (``rmq serve``'s endpoint, whose check rounds ask its sessions) and a
    worker endpoint on a port of its own forwarding to it: every call of a client of the
    worker takes the worker's path."""
    from types import SimpleNamespace

    from .test_grpc_clients import CONFIG

    srv = StoreServer(str(tmp_path / "store"), CONFIG, grpc="127.0.0.1:0")
    worker = GrpcEndpoint(srv.store, "127.0.0.1:0", primary=srv.grpc_endpoint)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(grpc_endpoint=worker.endpoint)
    finally:
        worker.close()
        srv.stop()
        thread.join(timeout=60)


def test_official_clients_through_a_worker_send_consume_and_get_check_backs(through_a_worker):
    from .test_grpc_clients import _Checker, _Consumer, _drain, _message, _name, _Producer

    topic, group = _name("pay"), _name("g")
    checker = _Checker()
    with _Producer(through_a_worker, [topic], checker) as p:
        sent = {p.send(_message(topic, b"plain %d" % i)).message_id for i in range(5)}
        t1 = p.begin_transaction()
        sent.add(p.send(_message(topic, b"commit"), t1).message_id)
        t1.commit()  # EndTransaction, forwarded
        t2 = p.begin_transaction()
        orphan = p.send(_message(topic, b"orphan"), t2)  # the check-back ends it
        sent.add(orphan.message_id)
        with _Consumer(through_a_worker, group, topic, await_s=1) as c:
            got = _drain(c, len(sent), timeout_s=30)
        assert sorted(m.message_id for m in got) == sorted(sent)  # each once
        assert orphan.message_id in checker.asked  # asked over the forwarded stream
