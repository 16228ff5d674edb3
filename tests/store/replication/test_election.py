"""Automatic election (store/replication/election.py) with three ``rmq serve`` processes on
loopback addresses: two data replicas and a witness.  The leader SIGKILLed in the middle of a
burst of sends -> the other replica leads within the election timeout and holds what it had
copied, a client given both replicas' URL goes on sending, and the killed leader, restarted,
follows the new one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from test_replica_set import free_port

from store import (
    InvalidConfigError,
    Message,
    NotLeaderError,
    RemoteError,
    ReplicaAckTimeoutError,
    SendOutcomeUnknownError,
    StoreGroup,
    connect,
    server_status,
)
from store.replication.replica_set import ReplicaSet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
ENV = dict(os.environ, PYTHONPATH=ROOT)
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
#: The failover bound the issue sets at the default settings (s).
FAILOVER_S = 5.0
#: With both replicas in sync, the failover includes restarting the killed one (s).
FAILOVER_SYNC_S = 30.0

pytestmark = pytest.mark.slow


def replica_set_file(tmp_path, **more) -> tuple[str, list[str], str]:
    port, raft = free_port(), free_port()
    urls = [f"rmq://{h}:{port}" for h in HOSTS]
    data = {"replicas": urls[:2], "witness": urls[2],
            "raft": {u: f"{h}:{raft}" for u, h in zip(urls, HOSTS)}, **more}
    try:
        ReplicaSet.of(data)
    except InvalidConfigError as exc:  # (synchronous replication: not in this version yet)
        pytest.skip(f"this replica set is not taken yet: {exc}")
    path = tmp_path / "replicas.json"
    path.write_text(json.dumps(data))
    return str(path), urls, f"rmq://{HOSTS[0]}:{port},{HOSTS[1]}:{port}"


class Cluster:
    """Three ``rmq serve`` processes; every one started is killed at the end."""

    def __init__(self, tmp_path, **more) -> None:
        self.rs, self.urls, self.url = replica_set_file(tmp_path, **more)
        self.dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
        self.logs = tmp_path
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, i: int) -> subprocess.Popen:
        host, port = self.urls[i].rpartition("/")[2].split(":")
        where = ["--witness"] if i == 2 else ["--store", self.dirs[i], "--create",
                                              *self.serve_options(i)]
        with open(self.logs / f"serve-{i}.log", "ab") as log:
            self.procs[i] = subprocess.Popen(
                [sys.executable, "-m", "rmq_cli.cli", "serve", *where, "--listen",
                 f"{host}:{port}", "--replica-set", self.rs, "--log-level", "WARNING"],
                env=ENV, stdout=subprocess.DEVNULL, stderr=log)
        return self.procs[i]

    def serve_options(self, i: int) -> list[str]:
        """More options of data replica ``i``'s ``rmq serve``."""
        return []

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=30)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    def replication(self, i: int) -> dict | None:
        status = server_status(self.dirs[i]) or {}
        if status.get("attached") and status.get("pid") == self.procs[i].pid:
            return status.get("replication")
        return None

    def log(self) -> str:
        return "".join((self.logs / f"serve-{i}.log").read_text()[-1500:] for i in range(3))


def wait_for(what, check, timeout_s=60.0, cluster=None):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}\n{cluster.log() if cluster else ''}"
        time.sleep(0.05)


def bodies(url: str, topic: str) -> list[bytes]:
    with connect(url, timeout_s=10) as store:
        return [b for q in store.queue_ids(topic) for b in store.read_arrow(
            topic, q, store.min_offset(topic, q), store.max_offset(topic, q)).column(
            "body").to_pylist()]


@pytest.mark.parametrize("insync", [1, 2])
def test_the_leader_killed_mid_burst_is_replaced_and_the_client_follows(tmp_path, insync):
    """``insync`` 2 (synchronous replication, both replicas): no acknowledged send may be
    lost.  With two replicas, the new leader acknowledges again only once the killed one,
    restarted at once (its disk kept), follows it and holds the writes: the failover time
    then includes that restart, and sends wait for it (a long ack timeout)."""
    more = {} if insync == 1 else {"replica_ack_timeout_ms": 60_000}
    cluster = Cluster(tmp_path, min_insync_replicas=insync, **more)
    try:
        for i in range(3):
            cluster.start(i)
        if insync > 1:  # (a send waits for the follower: let it start and follow first)
            wait_for("a replica follows the elected leader", lambda: any(
                (cluster.replication(i) or {}).get("state") == "following" for i in (0, 1)),
                cluster=cluster)
        with connect(cluster.url, timeout_s=10, failover_timeout_s=60) as client:
            p = client.producer("g")
            first = [p.send(Message("orders", b"before-%d" % i), queue_id=0) for i in range(50)]
            old = client.address.url
            k = cluster.urls.index(old)
            assert {m.msg_id for m in first}
            # everything before the burst is copied (asynchronous: wait for it)
            with connect(old, timeout_s=10) as leader:
                end = leader.replica_epochs()["end"]  # (its status file lags up to 1 s)
            wait_for("the follower caught up", lambda: (r := cluster.replication(1 - k))
                     and r.get("end") == end, cluster=cluster)

            acked, unknown, stop = [], [], threading.Event()

            def burst():
                i = 0
                while not stop.is_set():
                    try:
                        p.send(Message("orders", b"burst-%d" % i), queue_id=0)
                        acked.append(b"burst-%d" % i)
                    except (SendOutcomeUnknownError, ReplicaAckTimeoutError):
                        unknown.append(b"burst-%d" % i)
                    i += 1

            sender = threading.Thread(target=burst)
            sender.start()
            wait_for("a burst under way", lambda: len(acked) >= 100)
            cluster.kill(k)
            killed = time.monotonic()
            before = len(acked)
            if insync > 1:  # the only other replica: back at once, it rejoins as follower
                cluster.start(k)
            wait_for("a send acknowledged after the kill", lambda: len(acked) > before + 1,
                     timeout_s=60, cluster=cluster)
            failover_s = time.monotonic() - killed
            stop.set()
            sender.join(60)
            # asynchronous: the other replica leads; synchronous, the killed one restarted at
            # once holds every acknowledged write too, and the voters may name it again
            new = client.address.url
            assert new == cluster.urls[1 - k] or (insync > 1 and new == old), new
            assert failover_s < (FAILOVER_S if insync == 1 else FAILOVER_SYNC_S), failover_s

            stored = bodies(new, "orders")
            # nothing twice, and every message acknowledged before the burst is there
            assert len(stored) == len(set(stored)), (
                [b for b in set(stored) if stored.count(b) > 1], unknown, acked[before - 2:],
                cluster.log())
            assert all(b"before-%d" % i in stored for i in range(50))
            # asynchronous replication (min_insync_replicas 1): what the old leader
            # acknowledged but had not yet copied is lost -- one run of sends just before the
            # kill, never a hole elsewhere; everything acknowledged by the new leader is there
            lost = [i for i, b in enumerate(acked) if b not in set(stored)]
            assert lost == list(range(lost[0], lost[0] + len(lost))) if lost else True
            assert all(b in stored for b in acked[before + 1:]) and acked[before + 1:]
            assert len(unknown) <= 1  # the send cut off by the kill, if any
            if insync > 1:
                assert lost == []
                # the unacknowledged send cut off by the kill: at most once, never twice
                assert all(stored.count(b) <= 1 for b in unknown)
            print(f"failover {failover_s:.2f} s; {len(lost)} acknowledged sends not copied "
                  f"before the kill (min_insync_replicas {insync})")

            # a write to the old leader's address is refused now by no one: it is down;
            # the killed replica, restarted, follows the new leader
            if insync == 1:
                cluster.start(k)
            f = 1 - cluster.urls.index(new)  # (the old leader, unless it leads again)
            status = wait_for("the other replica follows the leader",
                              lambda: (r := cluster.replication(f)) and r.get("leader") == new
                              and r, cluster=cluster)
            assert status["role"] == "follower"
            with connect(cluster.urls[f], timeout_s=10) as again, \
                    pytest.raises(NotLeaderError, match=new.split("//")[1]):
                again.producer("g").send(Message("orders", b"refused"))
            p.send(Message("orders", b"after-rejoin"), queue_id=0)
        assert b"after-rejoin" in bodies(new, "orders")
        # the URL of both replicas works wherever a URL does: rmq tail, a store group's member
        tail = subprocess.run(
            [sys.executable, "-m", "rmq_cli.cli", "tail", "--store", cluster.url, "--topic",
             "orders", "--from", "earliest", "--no-follow", "--no-deliver-due", "--format",
             "json", "--max-messages", "5"], env=ENV, capture_output=True, timeout=120,
            check=False)
        assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 5, tail.stderr
        group = StoreGroup.create(str(tmp_path / "group"), ["replicated", "local"],
                                  paths=[cluster.url, str(tmp_path / "local")])
        try:
            sent = group.producer("g").send_batch([Message("grouped", b"g%d" % i)
                                                   for i in range(20)])
            assert {r.store_name for r in sent} <= {"replicated", "local"}
        finally:
            group.close()
    finally:
        cluster.close()


def test_a_client_finds_no_leader_within_its_bound_when_none_is_up(tmp_path):
    url = replica_set_file(tmp_path)[2]
    with connect(url, timeout_s=1, failover_timeout_s=0.5) as client:
        started = time.monotonic()
        with pytest.raises(RemoteError, match="no leader of the replica set"):
            client.producer("g").send(Message("orders", b"x"))
        assert time.monotonic() - started < 10
