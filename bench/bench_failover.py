"""Failover time of an elected replica set: from the leader's SIGKILL to the first send the new
leader acknowledges.

``PYTHONPATH=. python bench/bench_failover.py [--kills 20]`` starts three ``rmq serve``
processes on loopback addresses (two data replicas on 127.0.0.1 and 127.0.0.2, the witness on
127.0.0.3; default settings: ``election_timeout_ms`` 1500).  Each round a client given both
replicas' URL sends (one message per call, no pause) to the leader, waits until the follower
holds everything (asynchronous replication: so that the killed leader, restarted, follows
without a diverged tail), SIGKILLs the leader while sending, and times the first send
acknowledged after the kill; the killed replica is restarted and caught up before the next
round.  Prints each time, then p50 / p99 / max.

``--grpc``: the replicas also serve RocketMQ 5 clients (``--grpc``, each on the same port of
its own address, given in the replica-set file's ``grpc``), and the sender is Apache's
official Python client (``rocketmq.Producer``) given both gRPC endpoints; the time is from
the kill to the first send it sees acknowledged (a send failing meanwhile, after the client's
own retries, is sent again).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from store import Message, connect, server_status

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GrpcSender:
    """Sends through Apache's RocketMQ 5 Python client given ``endpoints``."""

    def __init__(self, endpoints: str) -> None:
        from rocketmq import ClientConfiguration, Credentials, Producer

        self.producer = Producer(ClientConfiguration(endpoints, Credentials(),
                                                     request_timeout=10), ("t",))
        self.producer.startup()

    def send(self, message: Message, queue_id=None) -> None:
        from rocketmq import Message as ClientMessage

        m = ClientMessage()
        m.topic, m.body = message.topic, message.body
        self.producer.send(m)

    def close(self) -> None:
        self.producer.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--grpc", action="store_true",
                        help="send with the official RocketMQ 5 Python client over --grpc")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="rmq-failover-")
    port, raft, grpc_port = free_port(), free_port(), free_port()
    urls = [f"rmq://{h}:{port}" for h in HOSTS]
    grpc = [f"{h}:{grpc_port}" for h in HOSTS[:2]]
    rs = os.path.join(work, "replicas.json")
    with open(rs, "w") as fh:
        json.dump({"replicas": urls[:2], "witness": urls[2],
                   "raft": {u: f"{h}:{raft}" for u, h in zip(urls, HOSTS)},
                   **({"grpc": dict(zip(urls[:2], grpc))} if args.grpc else {})}, fh)
    dirs = [os.path.join(work, "a"), os.path.join(work, "b")]
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs: dict[int, subprocess.Popen] = {}

    def start(i):
        where = ["--witness"] if i == 2 else ["--store", dirs[i], "--create"]
        if args.grpc and i < 2:
            where += ["--grpc", grpc[i]]
        procs[i] = subprocess.Popen(
            [sys.executable, "-m", "rmq_cli.cli", "serve", *where, "--listen",
             f"{HOSTS[i]}:{port}", "--replica-set", rs, "--log-level", "ERROR"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def replication(i):
        status = server_status(dirs[i]) or {}
        ok = status.get("attached") and status.get("pid") == procs[i].pid
        return status.get("replication") if ok else None

    def wait(check, timeout_s=120):
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise SystemExit("timed out")
            time.sleep(0.05)

    times = []
    try:
        for i in range(3):
            start(i)
        url = f"rmq://{HOSTS[0]}:{port},{HOSTS[1]}:{port}"
        with connect(url, timeout_s=5, failover_timeout_s=60) as client:
            p = client.producer("bench")
            if args.grpc:  # (its first route asks for a leader to create the topic)
                wait(lambda: any((replication(i) or {}).get("leading") for i in (0, 1)))
                p = GrpcSender(";".join(grpc))
            for n in range(args.kills):
                p.send(Message("t", b"warm"), queue_id=0)
                if args.grpc:
                    wait(lambda: sum(bool((replication(i) or {}).get("leading"))
                                     for i in (0, 1)) == 1)
                    k = next(i for i in (0, 1) if (replication(i) or {}).get("leading"))
                else:
                    k = urls.index(client.address.url)
                with connect(urls[k], timeout_s=5) as leader:
                    end = leader.replica_epochs()["end"]  # (its status file lags a second)
                wait(lambda k=k, end=end: (r := replication(1 - k))
                     and r.get("state") == "following" and r.get("end") == end)
                procs[k].send_signal(signal.SIGKILL)
                killed = time.monotonic()
                procs[k].wait()
                while True:
                    try:
                        p.send(Message("t", b"after"), queue_id=0)
                        break
                    except Exception as exc:  # noqa: BLE001 - an unknown outcome: again
                        print(f"  ({type(exc).__name__})", flush=True)
                times.append(time.monotonic() - killed)
                print(f"kill {n + 1}: {times[-1]:.2f} s to the first acknowledged send on "
                      f"{urls[1 - k] if args.grpc else client.address.url}", flush=True)
                start(k)
                wait(lambda k=k: (r := replication(k)) and r.get("state") == "following")
    finally:
        if args.grpc and isinstance(p, GrpcSender):
            p.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    print(f"{len(times)} kills: p50 {times[len(times) // 2]:.2f} s, p99 {p99:.2f} s, "
          f"max {times[-1]:.2f} s (target: p99 <= 5 s)")


if __name__ == "__main__":
    main()
