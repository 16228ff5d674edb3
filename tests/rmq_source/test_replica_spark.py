"""Spark given the URL of a replica set's two replicas (``rmq://h1:P,h2:P``): the sink writes
to the elected leader and a batch read reads it; the leader closed, both go on with the one
elected next."""

from __future__ import annotations

import json
import socket
import time

import pytest

from store import StoreServer, Witness, connect

pytestmark = [pytest.mark.spark, pytest.mark.slow]
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bodies(spark, url):
    return sorted(r.body for r in spark.read.format("rmq").option("subscribe", "paid")
                  .load(url).select("body").collect())


def _write(spark, url, start, sink_id):
    df = spark.createDataFrame([("paid", f"p{i}".encode()) for i in range(start, start + 50)],
                               "topic string, body binary")
    df.write.format("rmq").option("sinkId", sink_id).mode("append").save(url)


def test_spark_writes_and_reads_a_replica_set_across_a_failover(spark, tmp_path):
    port, raft = _port(), _port()
    urls = [f"rmq://{h}:{port}" for h in HOSTS]
    rs = tmp_path / "replicas.json"
    rs.write_text(json.dumps({"replicas": urls[:2], "witness": urls[2],
                              "raft": {u: f"{h}:{raft}" for u, h in zip(urls, HOSTS)}}))
    witness = Witness(str(rs), f"{HOSTS[2]}:{port}").start()
    servers = [StoreServer(str(tmp_path / f"s{i}"), listen=f"{HOSTS[i]}:{port}",
                           replica_set=str(rs)) for i in range(2)]
    url = f"rmq://{HOSTS[0]}:{port},{HOSTS[1]}:{port}"
    try:
        _write(spark, url, 0, "job-a")
        assert _bodies(spark, url) == sorted(f"p{i}".encode() for i in range(50))
        with connect(url) as client:
            client.info()
            leader = urls.index(client.address.url)
            end = client.replica_epochs()["end"]
        deadline = time.monotonic() + 60
        while servers[1 - leader].replica.status().get("end") != end:
            assert time.monotonic() < deadline, "the follower never caught up"
            time.sleep(0.05)
        servers[leader].close()  # the leader gone: its votes and its lease with it
        _write(spark, url, 50, "job-b")
        assert _bodies(spark, url) == sorted(f"p{i}".encode() for i in range(100))
        assert servers[1 - leader].replica.leading()
    finally:
        for server in servers:
            server.close()
        witness.close()


def test_spark_reads_a_synchronous_leader_up_to_its_high_watermark(spark, tmp_path):
    """With min_insync_replicas 2 and the follower stopped, a write that timed out is in the
    leader's log but not read; once the follower holds it, it is."""
    from store import Message, ReplicaAckTimeoutError

    ports = _port(), _port()
    rs = tmp_path / "replicas.json"
    rs.write_text(json.dumps({"replicas": [f"rmq://127.0.0.1:{p}" for p in ports],
                              "min_insync_replicas": 2, "replica_ack_timeout_ms": 2000}))

    def serve(name, port):
        return StoreServer(str(tmp_path / name), listen=f"127.0.0.1:{port}",
                           replica_set=str(rs))

    leader, follower = serve("a", ports[0]), serve("b", ports[1])
    try:
        deadline = time.monotonic() + 60
        while follower.replica.status().get("state") != "following":
            assert time.monotonic() < deadline, "the follower never followed"
            time.sleep(0.05)
        for i in range(10):
            leader.store.producer("g").send(Message("paid", f"p{i}".encode()))
        follower.close()
        with pytest.raises(ReplicaAckTimeoutError):
            leader.store.producer("g").send(Message("paid", b"late"))
        assert _bodies(spark, leader.url) == sorted(f"p{i}".encode() for i in range(10))
        follower = serve("b", ports[1])
        deadline = time.monotonic() + 60
        while leader.replica.status()["high_watermark"] < leader.store.confirmed_offset():
            assert time.monotonic() < deadline, "the watermark never moved"
            time.sleep(0.05)
        assert _bodies(spark, leader.url) == sorted([b"late"] + [f"p{i}".encode()
                                                                 for i in range(10)])
    finally:
        follower.close()
        leader.close()
