"""The RocketMQ gRPC face of an elected replica set across a failover: three ``rmq serve``
processes on loopback addresses (two data replicas, both with ``--grpc``, and a witness), the
official Python client given both gRPC endpoints sending in a loop and a ``SimpleConsumer``
receiving while the leader is SIGKILLed.  Synchronous replication (both replicas): every send
the client saw acknowledged is on the new leader exactly once; the killed replica, restarted
at once, follows, and sends resume within a bound; the consumer gets every message at least
once."""

from __future__ import annotations

import contextlib
import json
import threading
import time

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
from test_election import HOSTS, Cluster, wait_for
from test_grpc_replicas import raw_message
from test_replica_set import free_port

from store import connect

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grpc")]
#: Sends resume on the new leader within this (s): the election, and the killed replica's
#: restart (it must hold each write: min_insync_replicas 2 of 2), which takes a Python
#: server's start (6 s measured here on a quiet machine; far more on a loaded one).  The
#: failover time alone is measured by bench/bench_failover.py --grpc.
RESUME_S = 60.0
#: Starting three servers on a loaded machine (s).
START_S = 180.0


class GrpcCluster(Cluster):
    """Two data replicas with ``--grpc`` (the replica-set file's ``"grpc"`` names each one's
    endpoint) and a witness; every process started is killed at the end."""

    def __init__(self, tmp_path, **more) -> None:
        super().__init__(tmp_path, **more)
        self.grpc_port = free_port()
        self.grpc = [f"{h}:{self.grpc_port}" for h in HOSTS[:2]]
        with open(self.rs) as fh:
            data = json.load(fh)
        data["grpc"] = dict(zip(self.urls[:2], self.grpc))
        with open(self.rs, "w") as fh:
            json.dump(data, fh)

    def serve_options(self, i: int) -> list[str]:
        return ["--grpc", self.grpc[i]]

    def replication(self, i: int) -> dict:
        return super().replication(i) or {}

    def leader(self) -> int | None:
        found = [i for i in (0, 1) if self.replication(i).get("leading")]
        return found[0] if len(found) == 1 else None

    def start_all(self) -> int:
        """Start the three processes; the index of the elected leader, once the other
        replica follows."""
        for i in range(3):
            self.start(i)
        wait_for("a replica follows the elected leader", lambda: any(
            self.replication(i).get("state") == "following" for i in (0, 1)),
            timeout_s=START_S, cluster=self)
        (k,) = wait_for("one leader", lambda: (self.leader(),) if self.leader() is not None
                        else None, timeout_s=START_S, cluster=self)
        return k


def stored(url: str, topic: str) -> list[bytes]:
    with connect(url, timeout_s=10) as store:
        return [b for q in store.queue_ids(topic) for b in store.read_arrow(
            topic, q, store.min_offset(topic, q), store.max_offset(topic, q)).column(
            "body").to_pylist()]


def test_official_clients_keep_working_across_a_failover(tmp_path):
    # (a lease of 3 s: five processes on two shared cores must not lose it by load alone)
    cluster = GrpcCluster(tmp_path, min_insync_replicas=2, replica_ack_timeout_ms=60_000,
                          election_timeout_ms=3000)
    topic, group = "orders", "billing"
    try:
        k = cluster.start_all()
        follower = 1 - k
        # a follower's gRPC face refuses a send it may not pass on, with the code the
        # official clients retry; nothing is stored
        with grpc.insecure_channel(cluster.grpc[follower]) as channel:
            refused = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
                rpc.SendMessageRequest(messages=[raw_message(topic, b"refused")]),
                metadata=(("x-rmq-forwarded", "1"),), timeout=30)
        assert refused.status.code == pb.Code.HA_NOT_AVAILABLE, refused.status

        # request_timeout above the replicas' wait: a send is never retried by the client
        # for a timeout while its first attempt waits for its copies
        config = ClientConfiguration(";".join(cluster.grpc), Credentials(), request_timeout=90)
        producer = Producer(config, (topic,))
        producer.startup()
        consumer = SimpleConsumer(ClientConfiguration(";".join(cluster.grpc), Credentials(),
                                                      request_timeout=30),
                                  group, {topic: FilterExpression()}, await_duration=1)
        consumer.startup()
        acked: list[tuple[bytes, float]] = []
        failed: list[bytes] = []
        received: set[bytes] = set()
        stop, stop_consumer = threading.Event(), threading.Event()

        def send_loop():
            i = 0
            while not stop.is_set():
                m = Message()
                m.topic, m.body = topic, b"m-%d" % i
                i += 1
                try:
                    producer.send(m)
                    acked.append((m.body, time.monotonic()))
                except Exception:  # noqa: BLE001 - not acknowledged: may or may not be stored
                    failed.append(m.body)
                    time.sleep(0.05)

        def receive_loop():
            while not stop_consumer.is_set():
                try:
                    for m in consumer.receive(32, 15):
                        received.add(m.body)
                        with contextlib.suppress(Exception):  # (an old leader's handle)
                            consumer.ack(m)
                except Exception:  # noqa: BLE001 - no leader for a moment
                    time.sleep(0.1)

        threads = [threading.Thread(target=send_loop), threading.Thread(target=receive_loop)]
        for t in threads:
            t.start()
        try:
            wait_for("sends under way", lambda: len(acked) >= 50, timeout_s=START_S,
                     cluster=cluster)
            cluster.kill(k)
            killed = time.monotonic()
            cluster.start(k)  # (the other replica must hold each write: back at once)
            wait_for("a send acknowledged after the kill",
                     lambda: acked and acked[-1][1] > killed, timeout_s=RESUME_S + 30,
                     cluster=cluster)
            resumed_s = next(t for _, t in acked if t > killed) - killed
            before = sum(1 for _, t in acked if t <= killed)
            wait_for("more sends after the failover", lambda: len(acked) >= before + 50,
                     cluster=cluster)
        finally:
            stop.set()
            threads[0].join(120)
        # the leader after the failover: the other replica, or the killed one, restarted at
        # once and holding every acknowledged write too (the voters may name it again)
        (lead,) = wait_for("a leader after the failover",
                           lambda: (i := cluster.leader()) is not None and (i,), cluster=cluster)
        new = cluster.urls[lead]
        assert resumed_s < RESUME_S, resumed_s
        on_new = stored(new, topic)
        bodies = [b for b, _ in acked]
        # every acknowledged send is on the new leader, exactly once
        assert [b for b in bodies if on_new.count(b) != 1] == [], (failed, cluster.log())
        assert b"refused" not in on_new
        # the consumer gets every acknowledged message at least once across the failover
        try:
            wait_for("every acknowledged message received",
                     lambda: set(bodies) <= received, timeout_s=60, cluster=cluster)
        finally:
            stop_consumer.set()
            threads[1].join(60)
            consumer.shutdown()
            producer.shutdown()
        print(f"gRPC sends resumed {resumed_s:.2f} s after the kill; {len(bodies)} acknowledged, "
              f"{len(failed)} failed")
    finally:
        cluster.close()
