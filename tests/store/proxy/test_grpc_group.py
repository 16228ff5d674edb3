"""A store group served as one gRPC endpoint (``rmq serve --store GROUP --grpc``): sends spread
over the members as ``StoreGroup`` spreads them, consumers receive from every member."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,  # noqa: E402
                      Producer, SimpleConsumer, TransactionChecker, TransactionResolution)

from store import StoreConfig, StoreGroup, StoreServer  # noqa: E402
from store.formats.message import sharding_queue  # noqa: E402

pytestmark = pytest.mark.xdist_group("grpc")


@pytest.fixture
def group_endpoint(tmp_path):
    root = tmp_path / "group"
    StoreGroup.create(str(root), 2).close()
    members = StoreGroup.members(str(root))
    config = StoreConfig(transaction_timeout_ms=1000, transaction_check_interval_ms=300)
    servers = [StoreServer(path, config) for _, path in members]
    endpoint = StoreServer.share_grpc_endpoint(servers, [n for n, _ in members],
                                               "127.0.0.1:0")
    threads = [threading.Thread(target=s.run, daemon=True) for s in servers]
    for t in threads:
        t.start()
    yield str(root), endpoint.endpoint
    for s in servers:
        s.stop()
    for t in threads:
        t.join(timeout=30)


class _Commit(TransactionChecker):
    def check(self, message):
        return TransactionResolution.COMMIT


def _message(topic, body, group=None, deliver_at=None):
    m = Message()
    m.topic, m.body = topic, body
    if group:
        m.message_group = group
    if deliver_at:
        m.delivery_timestamp = deliver_at
    return m


def test_group_endpoint_spreads_sends_and_serves_consumers_from_every_member(group_endpoint):
    root, endpoint = group_endpoint
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    p = Producer(config, ("orders",), _Commit())
    p.startup()
    try:
        normal = [p.send(_message("orders", f"n{i}".encode())).message_id for i in range(10)]
        fifo = [p.send(_message("orders", f"f{i}".encode(), group="cust-1")).message_id
                for i in range(5)]
        due = int(time.time() * 1000) + 1500
        gone = p.send(_message("orders", b"recalled", deliver_at=due))
        kept = p.send(_message("orders", b"delayed", deliver_at=due))
        assert p.recall_message("orders", gone.recall_handle) == gone.message_id
        t = p.begin_transaction()
        tx = p.send(_message("orders", b"committed"), t)
        t.commit()
    finally:
        p.shutdown()
    group = StoreGroup.open(root, read_only=True)
    try:
        where = {}
        for name, store in group.stores():
            for q in store.queue_ids("orders"):
                for v in store.pull("orders", q, 0, 100):
                    where[v.msg_id] = (name, q, bytes(v.body))
        route = [(n, q) for n, s in group.stores() for q in s.queue_ids("orders")]
    finally:
        group.close()
    assert {where[i][0] for i in normal} == {n for n, _ in route}  # both members
    fifo_at = {where[i][:2] for i in fifo}
    assert fifo_at == {route[sharding_queue("cust-1", len(route))]}
    c = SimpleConsumer(config, "billing", {"orders": FilterExpression()}, await_duration=1)
    c.startup()
    got = []
    try:
        end = time.time() + 20
        while len(got) < 17 and time.time() < end:
            for m in c.receive(32, 20):
                got.append((m.message_id, m.body))
                c.ack(m)
        got += [(m.message_id, m.body) for m in c.receive(32, 20)]
    finally:
        c.shutdown()
    ids = [i for i, _ in got]
    assert sorted(ids) == sorted(normal + fifo + [kept.message_id, tx.message_id])
    assert [b for _, b in got if b.startswith(b"f")] == [f"f{i}".encode() for i in range(5)]
