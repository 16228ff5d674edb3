"""RocketMQ 5 clients and Spark on one store: what the official Python client sends through
``rmq serve --grpc`` is what ``spark.read.format("rmq")`` reads (ids, tags, keys, properties,
bodies), and what ``df.write.format("rmq")`` writes is received by the official consumer."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,  # noqa: E402
                      Producer, SimpleConsumer)

from store import StoreServer  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("grpc")]


@pytest.fixture
def server(tmp_path):
    srv = StoreServer(str(tmp_path / "store"), grpc="127.0.0.1:0")
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(timeout=30)


def _config(srv):
    return ClientConfiguration(srv.grpc_endpoint, Credentials(), request_timeout=10)


def test_spark_reads_what_the_official_client_sent(spark, server):
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    p = Producer(_config(server), (topic,))
    p.startup()
    sent = {}
    try:
        for i in range(4):
            m = Message()
            m.topic, m.body, m.tag = topic, f"order {i}".encode(), "created"
            m.keys = f"order-{i}"
            m.add_property("amount", str(10 * i))
            sent[p.send(m).message_id] = (b"order %d" % i, "created", [f"order-{i}"],
                                          {"amount": str(10 * i)})
    finally:
        p.shutdown()
    rows = (spark.read.format("rmq").option("subscribe", topic).load(server.path)
            .select("msg_id", "body", "tags", "keys", "properties").collect())
    got = {r.msg_id: (bytes(r.body), r.tags, list(r.keys), dict(r.properties)) for r in rows}
    assert got == sent


def test_official_consumer_receives_what_the_spark_sink_wrote(spark, server):
    topic = f"reminders-{uuid.uuid4().hex[:6]}"
    df = spark.createDataFrame([(topic, f"remind {i}", "due") for i in range(3)],
                               "topic string, body string, tags string")
    df.write.format("rmq").mode("append").save(server.path)
    written = {r.msg_id: bytes(r.body) for r in spark.read.format("rmq")
               .option("subscribe", topic).load(server.path).collect()}
    assert len(written) == 3
    c = SimpleConsumer(_config(server), "reminder-service", {topic: FilterExpression("due")},
                       await_duration=2)
    c.startup()
    got = {}
    try:
        end = time.time() + 20
        while len(got) < 3 and time.time() < end:
            for m in c.receive(16, 20):
                got[m.message_id] = m.body
                c.ack(m)
    finally:
        c.shutdown()
    assert got == written
