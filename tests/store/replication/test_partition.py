"""A leader cut off by a network partition stops acknowledging within the election timeout,
the other side elects, and on healing the old leader follows the new one.

Hosts are simulated with a network namespace: the leader runs inside it, reached over a
veth pair; the partition takes the pair's link down.  Needs root and ``ip netns`` (skipped
otherwise); every process started is killed and the namespace deleted at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from test_election import ENV, wait_for
from test_replica_set import free_port

from store import Message, connect, server_status

pytestmark = pytest.mark.slow

#: The replica set's election timeout (the default).
TIMEOUT_S = 1.5
CLIENT = r"""
import sys, time
from store import Message, NotLeaderError, StoreError, connect
with connect(sys.argv[1], timeout_s=0.5) as store:
    p = store.producer("g")
    while True:
        try:
            p.send(Message("orders", b"x"), queue_id=0)
            print("ok", time.monotonic(), flush=True)
        except NotLeaderError:
            print("refused", time.monotonic(), flush=True)
        except StoreError:
            print("error", time.monotonic(), flush=True)
        time.sleep(0.01)
"""


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


@pytest.fixture
def netns():
    name = f"rmqp{os.getpid() % 100000}"
    if os.geteuid() != 0 or ip("netns", "add", name, check=False).returncode != 0:
        pytest.skip("network namespaces need root and `ip netns` here")
    host, inner = f"vh{name}"[:15], f"vn{name}"[:15]
    net = f"10.251.{os.getpid() % 250}"
    try:
        ip("link", "add", host, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", name)
        ip("addr", "add", f"{net}.1/24", "dev", host)
        ip("link", "set", host, "up")
        ip("netns", "exec", name, "ip", "addr", "add", f"{net}.2/24", "dev", inner)
        ip("netns", "exec", name, "ip", "link", "set", inner, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name, host, net
    finally:
        ip("link", "del", host, check=False)
        ip("netns", "del", name, check=False)


def test_a_leader_cut_off_stops_acknowledging_and_the_other_side_elects(tmp_path, netns):
    name, link, net = netns
    port, raft = free_port(), free_port()
    a, b, w = f"rmq://{net}.2:{port}", f"rmq://{net}.1:{port}", f"rmq://{net}.1:{port + 2}"
    rs = tmp_path / "replicas.json"
    rs.write_text(json.dumps({"replicas": [a, b], "witness": w, "raft": {
        a: f"{net}.2:{raft}", b: f"{net}.1:{raft}", w: f"{net}.1:{raft + 2}"}}))
    dirs = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    procs = {}

    def serve(key, url, inside=False, witness=False):
        where = ["--witness"] if witness else ["--store", dirs[key], "--create"]
        cmd = [sys.executable, "-m", "rmq_cli.cli", "serve", *where, "--listen",
               url.split("//")[1], "--replica-set", str(rs), "--insecure",
               "--log-level", "WARNING"]
        with open(tmp_path / f"{key}.log", "ab") as log:
            procs[key] = subprocess.Popen((["ip", "netns", "exec", name] if inside else [])
                                          + cmd, env=ENV, stdout=subprocess.DEVNULL,
                                          stderr=log)

    def role(key):
        status = server_status(dirs[key]) or {}
        return status.get("attached") and (status.get("replication") or {})

    try:
        serve("a", a, inside=True)
        serve("w", w, witness=True)
        wait_for("a leads", lambda: (r := role("a")) and r.get("leading"), timeout_s=90)
        serve("b", b)
        wait_for("b follows a", lambda: (r := role("b")) and r.get("leader") == a,
                 timeout_s=90)
        client = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", CLIENT,
                                   a], env=ENV, stdout=subprocess.PIPE, text=True)
        procs["client"] = client
        assert client.stdout.readline().startswith("ok")  # a acknowledges
        ip("link", "set", link, "down")  # the partition: a and its client on one side
        cut = time.monotonic()
        last_ok, refused = cut, None
        while refused is None and time.monotonic() < cut + 30:
            kind, at = client.stdout.readline().split()
            if kind == "ok":
                last_ok = float(at)
            elif kind == "refused":
                refused = float(at)
        assert refused is not None, "the cut-off leader never refused"
        assert last_ok - cut < TIMEOUT_S, (last_ok - cut)  # no ack past its lease
        # the other side elects b, which takes writes
        wait_for("b leads", lambda: (r := role("b")) and r.get("leading"), timeout_s=30)
        with connect(b, timeout_s=5) as store:
            store.producer("g").send(Message("orders", b"on b"), queue_id=0)
        ip("link", "set", link, "up")  # healed: a follows b
        wait_for("a follows b", lambda: (r := role("a")) and r.get("leader") == b
                 and r.get("role") == "follower", timeout_s=60)
        print(f"partition: last acknowledgement {last_ok - cut:.2f} s after the cut, "
              f"refusals from {refused - cut:.2f} s")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
