"""``rmq serve --grpc-processes N`` on a replica set's member: the worker processes append
to the replica's store under the role its server (the primary) publishes
(:mod:`store.proxy.worker_role`, :mod:`store.replication.role_publisher`): a worker's send is
acknowledged only once ``min_insync_replicas`` replicas hold it, none is appended after a
change of role, a worker of a follower passes sends on, and a frozen primary's workers stop
acknowledging within the lease."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("rocketmq.grpc_protocol")
psutil = pytest.importorskip("psutil")

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_grpc_replicas import bodies, grpc_set, raw_message
from test_replica_set import caught_up, free_port, replica_file

from store import StoreReader
from store.files.replica_role import LEASE_MS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grpc")]  # (processes start: ~10 s)

TOPIC = "orders"


def _worker_connections(port: int, pids) -> int:
    n = 0
    for pid in pids:
        n += sum(1 for c in psutil.Process(pid).net_connections("tcp")
                 if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)
    return n


@contextlib.contextmanager
def worker_and_primary(endpoint: str, port: int, worker_pids, tries: int = 64):
    """``(worker, primary)``: stubs on connections of their own, the first taken by a worker
    process, the second by the primary (the kernel spreads connections over the port)."""
    channels, found = [], {}
    try:
        for _ in range(tries):
            before = _worker_connections(port, worker_pids)
            channel = grpc.insecure_channel(endpoint,
                                            options=[("grpc.use_local_subchannel_pool", 1)])
            channels.append(channel)
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            stub.Heartbeat(rpc.HeartbeatRequest(), timeout=30)  # (connects)
            side = "worker" if _worker_connections(port, worker_pids) > before else "primary"
            found.setdefault(side, stub)
            if len(found) == 2:
                break
        assert len(found) == 2, f"the kernel gave every connection to one process: {found}"
        yield found["worker"], found["primary"]
    finally:
        for channel in channels:
            channel.close()


def send(stub, body: bytes, timeout_s: float = 30):
    return stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message(TOPIC, body)]),
                            timeout=timeout_s)


def test_a_workers_send_is_acknowledged_only_once_the_follower_holds_it(tmp_path):
    serve = grpc_set(tmp_path, min_insync_replicas=2, replica_ack_timeout_ms=1000)
    leader = serve(0, grpc_processes=2)
    follower = serve(1)
    try:
        pids = [p.pid for p in leader.endpoint.workers.processes]
        with worker_and_primary(leader.grpc_endpoint, leader.endpoint.port, pids) as (
                worker, primary):
            for i in range(5):
                for stub, who in ((worker, b"w"), (primary, b"p")):
                    sent = send(stub, b"%s-%d" % (who, i))
                    assert sent.status.code == pb.Code.OK, sent.status
                    # acknowledged: the follower holds it already
                    assert follower.store.confirmed_offset() >= leader.store.confirmed_offset()
            follower.close()  # nothing new is held by two replicas from now on
            started = time.monotonic()
            late = send(worker, b"late")
            assert late.status.code == pb.Code.SLAVE_PERSISTENCE_TIMEOUT, late.status
            assert time.monotonic() - started >= 0.9  # waited for the copies, in vain
            assert b"late" in bodies(leader.store, TOPIC)  # appended, not acknowledged
            follower = serve(1)  # back: it copies, and the worker's sends are acknowledged
            sent = send(worker, b"back")
            assert sent.status.code == pb.Code.OK, sent.status
            assert follower.store.confirmed_offset() >= leader.store.confirmed_offset()
        caught_up(leader, follower)
        assert sorted(bodies(follower.store, TOPIC)) == sorted(
            [b"w-%d" % i for i in range(5)] + [b"p-%d" % i for i in range(5)]
            + [b"late", b"back"])
    finally:
        follower.close()
        leader.close()


def test_no_worker_appends_after_a_change_of_role_and_a_followers_worker_passes_sends_on(
        tmp_path):
    """The leader's workers check its role under the append lock: a send let in while it
    led but waiting for the lock behind a change of role is refused, never appended; from
    then on the (former leader's) worker passes sends on to the new leader."""
    serve = grpc_set(tmp_path)
    leader, follower = serve(0, grpc_processes=2), serve(1)
    try:
        pids = [p.pid for p in leader.endpoint.workers.processes]
        with worker_and_primary(leader.grpc_endpoint, leader.endpoint.port, pids) as (
                worker, _):
            assert send(worker, b"before").status.code == pb.Code.OK
            caught_up(leader, follower)
            answers = []
            with leader.store.write_lock():  # as a change of role holds it
                sending = threading.Thread(target=lambda: answers.append(
                    send(worker, b"during")))
                sending.start()
                sending.join(1.0)
                assert sending.is_alive()  # let in (the replica led), waiting for the lock
                follower.replica.become_leader(force=True)
                leader.replica.become_follower(follower.replica.me)
            sending.join(30)
            assert answers[0].status.code in (pb.Code.HA_NOT_AVAILABLE,
                                              pb.Code.SLAVE_PERSISTENCE_TIMEOUT), answers
            sent = send(worker, b"after")  # through the primary, on to the new leader
            assert sent.status.code == pb.Code.OK, sent.status
        assert sorted(bodies(follower.store, TOPIC)) == [b"after", b"before"]  # once each
        caught_up(follower, leader)
        assert b"during" not in bodies(leader.store, TOPIC)
    finally:
        follower.close()
        leader.close()


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` listens on ``port`` (a worker does once started)."""
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
               for c in psutil.Process(pid).net_connections("tcp"))


def _serve(path: str, port: int, rs: str, grpc_port: int, processes: int):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    return subprocess.Popen(
        [sys.executable, "-m", "rmq_cli.cli", "serve", "--store", path, "--create",
         "--listen", f"127.0.0.1:{port}", "--replica-set", rs, "--grpc",
         f"127.0.0.1:{grpc_port}", "--grpc-processes", str(processes),
         "--log-level", "WARNING"], env=dict(os.environ, PYTHONPATH=root),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_frozen_primarys_workers_stop_acknowledging_within_the_lease(tmp_path):
    """The leader's server (``rmq serve``, the primary) frozen with SIGSTOP: its workers,
    which still run, acknowledge no send after the lease (asynchronous replication, where
    nothing else would stop them); SIGKILLed, its workers end."""
    ports, grpc_ports = (free_port(), free_port()), (free_port(), free_port())
    urls = [f"rmq://127.0.0.1:{p}" for p in ports]
    rs = replica_file(tmp_path, ports, grpc={
        u: f"127.0.0.1:{g}" for u, g in zip(urls, grpc_ports)})
    path = str(tmp_path / "a")
    primary = _serve(path, ports[0], rs, grpc_ports[0], 2)
    try:
        endpoint = f"127.0.0.1:{grpc_ports[0]}"
        deadline = time.monotonic() + 60
        while True:
            assert primary.poll() is None, primary.communicate()[1][-2000:]
            workers = [p.pid for p in psutil.Process(primary.pid).children()
                       if "store.proxy.processes" in " ".join(p.cmdline())]
            if workers and all(_listens(w, grpc_ports[0]) for w in workers):
                try:
                    with grpc.insecure_channel(endpoint) as ch:
                        if send(service_pb2_grpc.MessagingServiceStub(ch), b"up",
                                timeout_s=5).status.code == pb.Code.OK:
                            break
                except grpc.RpcError:
                    pass
            assert time.monotonic() < deadline, "the leader did not serve"
            time.sleep(0.2)
        with worker_and_primary(endpoint, grpc_ports[0], workers) as (worker, _):
            assert send(worker, b"led").status.code == pb.Code.OK
            os.kill(primary.pid, signal.SIGSTOP)
            try:
                time.sleep(LEASE_MS / 1000 + 0.2)
                try:
                    answer = send(worker, b"frozen", timeout_s=3)
                    assert answer.status.code != pb.Code.OK, answer.status
                except grpc.RpcError as exc:  # (passed on to the frozen primary)
                    assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            finally:
                os.kill(primary.pid, signal.SIGKILL)
                primary.wait(30)
        with StoreReader(path) as reader:
            stored = [b for q in reader.queue_ids(TOPIC) for b in reader.read_arrow(
                TOPIC, q, reader.min_offset(TOPIC, q), reader.max_offset(TOPIC, q)
            ).column("body").to_pylist()]
        assert b"frozen" not in stored and b"led" in stored
        deadline = time.monotonic() + 30  # the primary's end closed their standard input
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                  for p in workers):
            assert time.monotonic() < deadline, "a worker outlived its primary"
            time.sleep(0.1)
    finally:
        if primary.poll() is None:
            primary.kill()
            primary.wait(30)
