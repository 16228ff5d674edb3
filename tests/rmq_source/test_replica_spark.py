"""Spark given the URL of a replica set's two replicas (``rmq://h1:P,h2:P``): the sink writes
to the elected leader and a batch read reads it; the leader closed, both go on with the one
elected next.  A streaming query restarted from its checkpoint across a failover reads every
message once with synchronous replication; with asynchronous replication a checkpoint past
the new leader's end fails the query, or with ``failOnDataLoss=false`` goes on from the end."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from store import (
    Message,
    ReplicaAckTimeoutError,
    SendOutcomeUnknownError,
    StoreServer,
    Witness,
    connect,
)

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


class _ReplicaSet:
    """Two in-process StoreServers and a Witness on 127.0.0.1-3 (elected leader); each
    replica can be closed and started again on its own directory."""

    def __init__(self, tmp_path, **more) -> None:
        port, raft = _port(), _port()
        self.urls = [f"rmq://{h}:{port}" for h in HOSTS]
        self.rs = tmp_path / "replicas.json"
        self.rs.write_text(json.dumps({"replicas": self.urls[:2], "witness": self.urls[2],
                                       "raft": {u: f"{h}:{raft}"
                                                for u, h in zip(self.urls, HOSTS)}, **more}))
        self.dirs = [str(tmp_path / f"s{i}") for i in range(2)]
        self.port = port
        self.url = f"rmq://{HOSTS[0]}:{port},{HOSTS[1]}:{port}"
        self.witness = Witness(str(self.rs), f"{HOSTS[2]}:{port}").start()
        self.servers: list[StoreServer | None] = [None, None]
        for i in range(2):
            self.start(i)

    def start(self, i: int) -> StoreServer:
        self.servers[i] = StoreServer(self.dirs[i], listen=f"{HOSTS[i]}:{self.port}",
                                      replica_set=str(self.rs))
        return self.servers[i]

    def stop(self, i: int) -> None:
        server, self.servers[i] = self.servers[i], None
        server.close()  # its votes and its lease go with it

    def leader(self) -> int:
        with connect(self.url) as client:
            client.info()
            return self.urls.index(client.address.url)

    def wait(self, what: str, check, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    def status(self, i: int) -> dict:
        server = self.servers[i]
        return {} if server is None else server.replica.status()

    def close(self) -> None:
        for i in range(2):
            if self.servers[i] is not None:
                self.stop(i)
        self.witness.close()


def test_spark_writes_and_reads_a_replica_set_across_a_failover(spark, tmp_path):
    replicas = _ReplicaSet(tmp_path)
    url = replicas.url
    try:
        _write(spark, url, 0, "job-a")
        assert _bodies(spark, url) == sorted(f"p{i}".encode() for i in range(50))
        leader = replicas.leader()
        with connect(url) as client:
            end = client.replica_epochs()["end"]
        replicas.wait("the follower never caught up",
                      lambda: replicas.status(1 - leader).get("end") == end)
        replicas.stop(leader)
        _write(spark, url, 50, "job-b")
        assert _bodies(spark, url) == sorted(f"p{i}".encode() for i in range(100))
        assert replicas.status(1 - leader)["leading"]
    finally:
        replicas.close()


def _stream_once(spark, url, checkpoint, out, **options) -> None:
    """One ``Trigger.AvailableNow`` run of the query: ``paid`` into parquet files (the file
    sink commits each micro-batch once, through its ``_spark_metadata`` log).  A run that
    Spark itself could not start (its Python worker not connecting back within Spark's fixed
    10 s, on a loaded machine) is started again from the same checkpoint, as a user would."""
    for attempt in range(3):
        try:
            return _run_available_now(spark, url, checkpoint, out, options)
        except Exception as exc:  # only Spark's own start failure is retried
            if "failed to connect back" not in str(exc) or attempt == 2:
                raise


def _run_available_now(spark, url, checkpoint, out, options: dict) -> None:
    reader = (spark.readStream.format("rmq").option("subscribe", "paid")
              .option("startingOffsets", "earliest"))
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (reader.load(url).select("body").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120), "the AvailableNow run did not end within 120 s"
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()


def _stored(url) -> list[bytes]:
    with connect(url) as store:
        return [b for q in store.queue_ids("paid") for b in store.read_arrow(
            "paid", q, store.min_offset("paid", q), store.max_offset("paid", q)).column(
            "body").to_pylist()]


def test_a_streaming_query_reads_every_message_once_across_a_synchronous_failover(
        spark, tmp_path):
    """``min_insync_replicas: 2``: messages sent before, during and after the leader is
    closed (and started again, so that the new leader has a follower to acknowledge with);
    AvailableNow runs before and after, from one checkpoint, read every stored message once,
    and every acknowledged one is stored."""
    replicas = _ReplicaSet(tmp_path, min_insync_replicas=2, replica_ack_timeout_ms=60_000)
    checkpoint, out = tmp_path / "chk", tmp_path / "out"
    try:
        replicas.wait("a replica follows the elected leader", lambda: any(
            replicas.status(i).get("state") == "following" for i in (0, 1)))
        acked, unknown = [], []
        with connect(replicas.url, failover_timeout_s=60) as client:
            producer = client.producer("g")
            for i in range(30):
                producer.send(Message("paid", b"before-%d" % i))
                acked.append(b"before-%d" % i)
            _stream_once(spark, replicas.url, checkpoint, out)

            stop = threading.Event()

            def burst() -> None:
                i = 0
                while not stop.is_set():
                    body = b"during-%d" % i
                    try:
                        producer.send(Message("paid", body))
                        acked.append(body)
                    except (SendOutcomeUnknownError, ReplicaAckTimeoutError):
                        unknown.append(body)
                    i += 1

            sender = threading.Thread(target=burst)
            sender.start()
            try:
                replicas.wait("a burst under way", lambda: len(acked) >= 50)
                leader = replicas.leader()
                replicas.stop(leader)
                before = len(acked)
                replicas.wait("the other replica elected",
                              lambda: replicas.status(1 - leader).get("leading"))
                replicas.start(leader)  # the only other replica: back, it follows the new one
                replicas.wait("a send acknowledged after the failover",
                              lambda: len(acked) > before + 10)
            finally:
                stop.set()
                sender.join(60)
            assert replicas.leader() == 1 - leader
            for i in range(20):
                producer.send(Message("paid", b"after-%d" % i))
                acked.append(b"after-%d" % i)
        _stream_once(spark, replicas.url, checkpoint, out)

        read = [r.body for r in spark.read.parquet(str(out)).collect()]
        stored = _stored(replicas.url)
        assert len(read) == len(set(read)), "a message read twice"
        assert sorted(read) == sorted(stored)  # every stored message once
        assert set(acked) <= set(read)  # every acknowledged message stored
        assert len(unknown) <= 2, unknown  # the sends cut off by the close, if any
    finally:
        replicas.close()


def test_a_checkpoint_past_the_new_leaders_end_fails_or_goes_on_from_its_end(spark, tmp_path):
    """Asynchronous replication: the follower stopped, the leader acknowledges 10 messages
    alone and the query reads them; the leader lost, the follower elected holds less than
    the query's checkpoint.  ``failOnDataLoss=true``: the query fails saying so;
    ``false``: it goes on from the queue's end and reads the new leader's next messages."""
    replicas = _ReplicaSet(tmp_path, election_timeout_ms=1000)
    checkpoint, out = tmp_path / "chk", tmp_path / "out"
    try:
        leader = replicas.leader()
        follower = 1 - leader
        with connect(replicas.url) as client:
            producer = client.producer("g")
            producer.send_batch([Message("paid", b"copied-%d" % i) for i in range(20)],
                                queue_id=0)
            end = client.replica_epochs()["end"]
        replicas.wait("the follower caught up",
                      lambda: replicas.status(follower).get("end") == end)
        replicas.stop(follower)
        with connect(replicas.url) as client:  # acknowledged by the leader alone
            client.producer("g").send_batch([Message("paid", b"lost-%d" % i)
                                             for i in range(10)], queue_id=0)
        _stream_once(spark, replicas.url, checkpoint, out)  # the checkpoint: offset 30
        replicas.stop(leader)
        replicas.start(follower)  # the witness and it elect it, with its 20 messages
        replicas.wait("the follower elected", lambda: replicas.status(follower).get("leading"))

        with pytest.raises(Exception, match=r"queue paid/0 now ends at offset 20, but this "
                           r"query's checkpoint says it already read up to offset 30"):
            _stream_once(spark, replicas.url, checkpoint, out)
        _stream_once(spark, replicas.url, checkpoint, out, failOnDataLoss="false")
        with connect(replicas.url) as client:
            client.producer("g").send_batch([Message("paid", b"new-%d" % i)
                                             for i in range(5)], queue_id=0)
        _stream_once(spark, replicas.url, checkpoint, out)
        read = sorted(r.body for r in spark.read.parquet(str(out)).collect())
        # the lost messages were read before the failover (no replica keeps them now);
        # the new leader's messages at offsets 20 to 24 are read, each once
        assert read == sorted([b"copied-%d" % i for i in range(20)] +
                              [b"lost-%d" % i for i in range(10)] +
                              [b"new-%d" % i for i in range(5)])
    finally:
        replicas.close()


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
