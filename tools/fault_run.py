"""Randomized faults against an elected replica set, and a checker of what its clients saw.

A Jepsen-style run: ``python tools/fault_run.py --minutes 20 --seed 7`` starts an elected
replica set (``--replicas`` 2 or 3 data replicas, each ``rmq serve --store DIR --listen ...
--replica-set FILE``, and a witness, ``rmq serve --witness``), runs a workload through
clients given the multi-replica URL (``store.connect("rmq://a,b")``) and, meanwhile, a
*nemesis* that injects faults one at a time from a schedule drawn from ``--seed``:

* ``kill-leader`` / ``kill-follower``: SIGKILL of the replica that leads (or of a follower),
  restarted, its disk kept, after a random pause;
* ``partition``: one voter (the leader, a follower or the witness) cut off from every other
  host and from the clients, then healed;
* ``freeze``: one replica stopped (SIGSTOP) and continued (SIGCONT) after a while;
* ``slow``: one voter's link given ``tc netem`` delay and loss (network namespaces only).

**Hosts.** Run as root with ``ip`` (iproute2), every voter runs in a network namespace of
its own, joined to the others and to the clients (which stay in the tool's namespace) by a
veth pair on one bridge: a partition takes the voter's link down. Otherwise (``--hosts
loopback``, or not root) the voters listen on loopback addresses (127.0.0.1, .2, ...) and a
partition is stood in for by SIGSTOP of the cut-off process for the same time (a host that
answers nothing; unlike a real partition, the process's own timers stop too). The summary
says which was used.

**Workload.** ``--producers`` threads, each with its own client, send messages whose body
is a unique payload id (``p<producer>-<seq>-<index>``) to one topic of four queues: plain
sends, batches (``send_batch``), sends carrying a business key (``keys=``), delayed sends
(``delay_ms`` of 1 to 5 s) and keyed timer sends (``key=``, which the client repeats after
a failover). Replication is synchronous by default (``min_insync_replicas`` 2, ``--sync``)
or asynchronous (``--async``). Every operation goes into the history (``--out DIR``,
``history.jsonl``): its invoke and completion times, its outcome (``ok``; ``unknown`` for
:class:`~store.SendOutcomeUnknownError`, ``ReplicaAckTimeoutError`` and
``LeaderDeposedError``, whose write may or may not survive; ``failed`` for an error that
says nothing was stored), its payload ids and the acknowledgement's queue, offset and due
time.

**The end.** Every fault is healed, killed replicas started again, the tool waits for a
leader, for every replica to hold the leader's CommitLog end and for every delayed message
to be due, reads the topic back from the leader and runs :func:`check` on the history:

* ``lost``: an acknowledged payload not stored (a violation with synchronous replication;
  with asynchronous replication counted, and allowed only after a change of leader, as the
  guarantees table of docs/operations.md says);
* ``doubled``: a payload stored twice or more (a keyed timer send repeated by the client
  after its first copy was already delivered is counted apart, ``redelivered_keyed``: the
  documented outcome of a key that replaces only what is still pending);
* ``phantom``: a stored payload that was never sent, or whose send failed outright;
* ``misplaced``: an acknowledged message stored at another queue or offset than its ack
  said;
* ``early``: a delayed message delivered (its copy's store time) before its due time (the
  ack's ``deliver_at_ms``; for an unacknowledged one or a keyed timer send, its invoke
  time plus its delay);
* ``order``: two acknowledged messages of one producer in one queue stored in the other
  order than sent;
* ``diverged``: two replicas' CommitLogs that differ before the shorter one's end (each
  replica's log is read from its directory once every server is stopped).

It prints a summary (operations, acknowledged, lost, doubled, early, order violations,
faults by kind, leader changes) as JSON and exits 1 on any violation.  The suite runs it
bounded (``tests/store/replication/test_fault_run.py``); docs/benchmarks.md lists
longer runs.
The schedule of faults (kinds, targets by role, pauses) is the same for a seed; what it
hits, and the workload's interleaving, depend on timing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pyarrow as pa

from store import (
    LeaderDeposedError,
    Message,
    ReplicaAckTimeoutError,
    SendOutcomeUnknownError,
    StoreError,
    connect,
    server_status,
)

TOPIC = "chaos"
QUEUES = 4
#: Fault kinds; ``slow`` needs network namespaces.
KINDS = ("kill-leader", "kill-follower", "partition", "freeze", "slow")
#: Errors whose write may be stored: the outcome is unknown.
UNKNOWN = (SendOutcomeUnknownError, ReplicaAckTimeoutError, LeaderDeposedError)
#: Operation kinds of the workload and their weights.
OP_WEIGHTS = {"send": 45, "batch": 15, "keys": 15, "delayed": 15, "timer-key": 10}
DELAY_MS = (1000, 5000)
#: A server's log line when its replica starts a term as leader.
_LEADS = re.compile(r"(\S+) leads its replica set in epoch (\d+) from")


# ---------------------------------------------------------------------------------------
# The history and its checker


@dataclass
class Op:
    """One operation of the workload, as the history records it."""

    producer: int
    seq: int
    kind: str
    ids: list[str]
    queue: int
    delay_ms: int | None = None
    invoke_ms: int = 0
    complete_ms: int = 0
    outcome: str = "pending"  # ok | failed | unknown
    error: str | None = None
    #: Per message of an acknowledged op: [queue_id, queue_offset, deliver_at_ms].
    acks: list[list] = field(default_factory=list)


def check(ops: list[dict], stored: list[dict], *, sync: bool, leader_changes: int,
          diverged: list[str] | None = None) -> dict:
    """Judge a history: ``ops`` (:class:`Op` as dicts) against ``stored`` (one dict per
    message read back: ``id``, ``queue``, ``offset``, ``store_ms``).  Returns counts and,
    under ``violations``, one line per problem (empty when the history is right)."""
    sent: dict[str, tuple[dict, int]] = {}
    for op in ops:
        for i, pid in enumerate(op["ids"]):
            sent[pid] = (op, i)
    copies: dict[str, list[dict]] = defaultdict(list)
    for row in stored:
        copies[row["id"]].append(row)
    violations: list[str] = []
    counts = Counter()
    for op in ops:
        counts["ops"] += 1
        counts[op["outcome"]] += 1
        counts["messages"] += len(op["ids"])
        if op["outcome"] == "ok":
            counts["acked"] += len(op["ids"])
    for pid, rows in copies.items():
        if pid not in sent:
            counts["phantom"] += 1
            violations.append(f"phantom: {pid} stored at queue {rows[0]['queue']} offset "
                              f"{rows[0]['offset']} was never sent")
            continue
        op, i = sent[pid]
        if op["outcome"] == "failed":
            counts["phantom"] += 1
            violations.append(f"phantom: {pid} stored, but its send failed ({op['error']})")
        if len(rows) > 1:
            first = min(r["store_ms"] for r in rows)
            if op["kind"] == "timer-key" and first <= op["complete_ms"]:
                counts["redelivered_keyed"] += 1
            else:
                counts["doubled"] += 1
                violations.append(f"doubled: {pid} stored {len(rows)} times at "
                                  f"{[(r['queue'], r['offset']) for r in rows]} "
                                  f"(outcome {op['outcome']})")
        if op["delay_ms"] is not None:
            # (a keyed timer send the client repeated: its ack is the last try's, and an
            # earlier try, due sooner, may have been delivered)
            due = (op["acks"][i][2] if op["outcome"] == "ok" and op["acks"][i][2]
                   and op["kind"] != "timer-key" else op["invoke_ms"] + op["delay_ms"])
            early = [r for r in rows if r["store_ms"] < due]
            if early:
                counts["early"] += 1
                violations.append(f"early: {pid} delivered at {early[0]['store_ms']}, due "
                                  f"{due} ({due - early[0]['store_ms']} ms early)")
        elif op["outcome"] == "ok":
            queue, offset = op["acks"][i][0], op["acks"][i][1]
            if not any(r["queue"] == queue and r["offset"] == offset for r in rows):
                counts["misplaced"] += 1
                violations.append(f"misplaced: {pid} acknowledged at queue {queue} offset "
                                  f"{offset}, stored at "
                                  f"{[(r['queue'], r['offset']) for r in rows]}")
    lost = [pid for op in ops if op["outcome"] == "ok" for pid in op["ids"]
            if pid not in copies]
    counts["lost"] = len(lost)
    if lost and (sync or leader_changes == 0):
        why = ("synchronous replication" if sync
               else "asynchronous replication, but no change of leader")
        violations.append(f"lost: {len(lost)} acknowledged payloads not stored ({why}); "
                          f"first {lost[:10]}")
    # per producer and queue: acknowledged, undelayed messages stored in the order sent
    where = {pid: (r["queue"], r["offset"]) for pid, rows in copies.items() for r in rows[:1]}
    chains: dict[tuple[int, int], list[tuple[int, str]]] = defaultdict(list)
    for op in sorted(ops, key=lambda o: (o["producer"], o["seq"])):
        if op["outcome"] != "ok" or op["delay_ms"] is not None:
            continue
        for pid in op["ids"]:
            if pid in where:
                queue, offset = where[pid]
                chains[(op["producer"], queue)].append((offset, pid))
    for (producer, queue), chain in chains.items():
        for (a, pa_), (b, pb) in itertools.pairwise(chain):
            if b <= a:
                counts["order"] += 1
                violations.append(f"order: producer {producer} queue {queue}: {pa_} at "
                                  f"{a}, sent before {pb} at {b}")
    for line in diverged or ():
        counts["diverged"] += 1
        violations.append(f"diverged: {line}")
    counts["stored"] = len(stored)
    counts["unknown_stored"] = sum(1 for op in ops if op["outcome"] == "unknown"
                                   for pid in op["ids"] if pid in copies)
    for name in ("lost", "doubled", "phantom", "misplaced", "early", "order", "diverged",
                 "redelivered_keyed"):
        counts.setdefault(name, 0)
    return {"counts": dict(counts), "violations": violations}


def leader_terms(logs: list[str]) -> list[tuple[int, str]]:
    """``(epoch, leader URL)`` of every term the replicas' logs say they led, in order."""
    found = set()
    for path in logs:
        if os.path.exists(path):
            with open(path, errors="replace") as fh:
                for line in fh:
                    m = _LEADS.search(line)
                    if m:
                        found.add((int(m.group(2)), m.group(1)))
    return sorted(found)


def commitlog_bytes(store_dir: str, end: int) -> bytes:
    """The first ``end`` bytes of a stopped store's CommitLog (its segments in order)."""
    folder = os.path.join(store_dir, "commitlog")
    out = bytearray()
    for name in sorted(os.listdir(folder)):
        if not name.isdigit():
            continue
        start = int(name)
        if start >= end:
            break
        with open(os.path.join(folder, name), "rb") as fh:
            out += fh.read(end - start)
    return bytes(out[:end])


def compare_logs(logs: dict[str, bytes]) -> list[str]:
    """Lines naming each pair of logs that differ before the shorter one's end."""
    names = sorted(logs)
    problems = []
    for other in names[1:]:
        a, b = logs[names[0]], logs[other]
        n = min(len(a), len(b))
        if a[:n] != b[:n]:
            at = next(i for i in range(n) if a[i] != b[i])
            problems.append(f"CommitLogs of {names[0]} and {other} differ at byte {at} "
                            f"(of {n} held by both)")
    return problems


# ---------------------------------------------------------------------------------------
# Hosts: network namespaces, or loopback addresses


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30,
                          check=check)


class LoopbackHosts:
    """Voters on 127.0.0.1, .2, ...; a partition is SIGSTOP of the process (a stand-in)."""

    kind = "loopback (partitions stood in for by SIGSTOP)"

    def __init__(self, voters: int) -> None:
        self.voters = voters

    def address(self, i: int) -> str:
        return f"127.0.0.{i + 1}"

    def wrap(self, i: int, cmd: list[str]) -> list[str]:
        return cmd

    def close(self) -> None:
        pass


class NamespaceHosts:
    """Each voter in a network namespace of its own, joined by veth pairs on one bridge;
    the tool's namespace (the clients) holds the bridge's address.  Needs root."""

    kind = "network namespaces (veth + bridge; partitions take a link down, tc netem)"

    def __init__(self, voters: int) -> None:
        tag = os.getpid() % 100000
        self.voters = voters
        self.bridge = f"rmqbr{tag}"[:15]
        self.net = f"10.{200 + tag % 50}.{tag % 250}"
        self.names = [f"rmqf{tag}-{i}" for i in range(voters)]
        self.links = [f"rf{tag}h{i}"[:15] for i in range(voters)]
        try:
            _ip("link", "add", "name", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.net}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (name, link) in enumerate(zip(self.names, self.links)):
                inner = f"rf{tag}n{i}"[:15]
                _ip("netns", "add", name)
                _ip("link", "add", link, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", name)
                _ip("link", "set", link, "master", self.bridge)
                _ip("link", "set", link, "up")
                _ip("netns", "exec", name, "ip", "addr", "add", f"{self.address(i)}/24",
                    "dev", inner)
                _ip("netns", "exec", name, "ip", "link", "set", inner, "up")
                _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        except (subprocess.CalledProcessError, OSError):
            self.close()
            raise
        # (``tc netem`` needs the kernel's sch_netem: without it there is no ``slow`` fault)
        self.netem = _tc("qdisc", "replace", "dev", self.links[0], "root", "netem", "delay",
                         "1ms", check=False).returncode == 0
        self.fast(0)
        if not self.netem:
            self.kind = self.kind.replace(", tc netem", "; no tc netem in this kernel")

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and shutil.which("ip") is not None

    def address(self, i: int) -> str:
        return f"{self.net}.{i + 2}"

    def wrap(self, i: int, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[i], *cmd]

    def cut(self, i: int) -> None:
        _ip("link", "set", self.links[i], "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", self.links[i], "up")

    def slow(self, i: int, delay_ms: int, loss_pct: int) -> None:
        _tc("qdisc", "replace", "dev", self.links[i], "root", "netem", "delay",
            f"{delay_ms}ms", "loss", f"{loss_pct}%")

    def fast(self, i: int) -> None:
        _tc("qdisc", "del", "dev", self.links[i], "root", check=False)

    def close(self) -> None:
        for link in self.links:
            _ip("link", "del", link, check=False)
        for name in self.names:
            _ip("netns", "del", name, check=False)
        _ip("link", "del", self.bridge, check=False)


# ---------------------------------------------------------------------------------------
# The replica set


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """``replicas`` data replicas (voters 0..R-1) and a witness (voter R), each an
    ``rmq serve`` process; every process started is killed at the end."""

    def __init__(self, work: str, hosts, replicas: int, insync: int) -> None:
        self.work, self.hosts, self.replicas = work, hosts, replicas
        port, raft = free_port(), free_port()
        addrs = [hosts.address(i) for i in range(replicas + 1)]
        self.urls = [f"rmq://{a}:{port}" for a in addrs]
        self.url = "rmq://" + ",".join(f"{a}:{port}" for a in addrs[:replicas])
        self.rs = os.path.join(work, "replicas.json")
        with open(self.rs, "w") as fh:
            json.dump({"replicas": self.urls[:replicas], "witness": self.urls[replicas],
                       "raft": {u: f"{a}:{raft}" for u, a in zip(self.urls, addrs)},
                       "min_insync_replicas": insync}, fh)
        self.dirs = [os.path.join(work, f"replica-{i}") for i in range(replicas)]
        self.procs: dict[int, subprocess.Popen] = {}
        self.stopped: set[int] = set()
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))

    def start(self, i: int) -> None:
        where = (["--witness"] if i == self.replicas
                 else ["--store", self.dirs[i], "--create"])
        listen = self.urls[i].rpartition("/")[2]
        cmd = [sys.executable, "-m", "rmq_cli.cli", "serve", *where, "--listen", listen,
               "--replica-set", self.rs, "--insecure", "--log-level", "WARNING"]
        with open(os.path.join(self.work, f"serve-{i}.log"), "ab") as log:
            # (a session of its own: a Ctrl-C meant for the tool does not stop the servers)
            self.procs[i] = subprocess.Popen(self.hosts.wrap(i, cmd), env=self.env,
                                             stdout=subprocess.DEVNULL, stderr=log,
                                             start_new_session=True)
        self.stopped.discard(i)

    def alive(self, i: int) -> bool:
        return i in self.procs and self.procs[i].poll() is None

    def signal(self, i: int, sig: int) -> None:
        if self.alive(i):
            self.procs[i].send_signal(sig)
            if sig == signal.SIGSTOP:
                self.stopped.add(i)
            elif sig == signal.SIGCONT:
                self.stopped.discard(i)

    def kill(self, i: int) -> None:
        self.signal(i, signal.SIGCONT)
        self.signal(i, signal.SIGKILL)
        if i in self.procs:
            self.procs[i].wait(timeout=60)

    def replication(self, i: int) -> dict | None:
        status = server_status(self.dirs[i]) or {}
        if status.get("attached") and self.alive(i) and status.get("pid") == self.procs[i].pid:
            return status.get("replication")
        return None

    def leader(self) -> int | None:
        """The data replica that holds a lease now, by the status files (up to 1 s old)."""
        for i in range(self.replicas):
            if (self.replication(i) or {}).get("leading"):
                return i
        return None

    def close(self) -> None:
        for i, proc in self.procs.items():
            if proc.poll() is None:
                self.signal(i, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=60)


def wait_for(what: str, check, timeout_s: float, cluster: Cluster | None = None) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            states = "" if cluster is None else "; " + "; ".join(
                f"replica {i}: {cluster.replication(i)}" for i in range(cluster.replicas))
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}{states}")
        time.sleep(0.1)


def wait_for_leader(cluster: Cluster, timeout_s: float) -> int:
    """The data replica that leads, once one does."""
    found = wait_for("a leader", lambda: [cluster.leader()] if cluster.leader() is not None
                     else None, timeout_s, cluster)
    return found[0]


# ---------------------------------------------------------------------------------------
# The nemesis and the workload


def fault_schedule(seed: int, seconds: float, kinds: tuple[str, ...]) -> list[dict]:
    """The faults of a run, drawn from ``seed``: each a kind, the role it hits (``leader``,
    ``follower``, ``witness``), the calm before it and how long it lasts (s)."""
    rng = random.Random(seed)
    at, out = 0.0, []
    while True:
        calm = rng.uniform(2.0, 6.0)
        kind = rng.choice(kinds)
        lasts = rng.uniform(1.0, 6.0) if kind != "freeze" else rng.uniform(0.5, 4.0)
        target = ("leader" if kind == "kill-leader" else "follower" if kind == "kill-follower"
                  else rng.choice(("leader", "leader", "follower", "witness"))
                  if kind in ("partition", "slow") else rng.choice(("leader", "follower")))
        if at + calm + lasts > seconds:
            return out
        at += calm + lasts
        out.append({"kind": kind, "target": target, "calm_s": round(calm, 3),
                    "lasts_s": round(lasts, 3), "seed": rng.randrange(1 << 30)})


class Nemesis(threading.Thread):
    """Injects the faults of a schedule one at a time, healing each before the next."""

    def __init__(self, cluster: Cluster, schedule: list[dict], log) -> None:
        super().__init__(daemon=True)
        self.cluster, self.schedule, self.log = cluster, schedule, log
        self.stop = threading.Event()
        self.done: list[dict] = []
        self.error: BaseException | None = None

    def _pick(self, target: str, rng: random.Random) -> int:
        c = self.cluster
        if target == "witness":
            return c.replicas
        leader = c.leader()
        if target == "leader" and leader is not None:
            return leader
        others = [i for i in range(c.replicas) if i != leader]
        return rng.choice(others)

    def run(self) -> None:
        try:
            for fault in self.schedule:
                if self.stop.wait(fault["calm_s"]):
                    return
                self._inject(fault)
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc

    def _inject(self, fault: dict) -> None:
        c, hosts = self.cluster, self.cluster.hosts
        rng = random.Random(fault["seed"])
        i = self._pick(fault["target"], rng)
        kind = fault["kind"]
        if kind == "freeze" and i == c.replicas:
            i = 0
        record = {"kind": kind, "voter": i, "at": time.time(), "lasts_s": fault["lasts_s"],
                  "was_leader": i == c.leader()}
        self.log(f"fault {kind} on voter {i}{' (leader)' if record['was_leader'] else ''} "
                 f"for {fault['lasts_s']:.1f} s")
        if kind.startswith("kill"):
            c.kill(i)
            self.stop.wait(fault["lasts_s"])
            c.start(i)
        elif kind == "partition" and isinstance(hosts, NamespaceHosts):
            hosts.cut(i)
            try:
                self.stop.wait(fault["lasts_s"])
            finally:
                hosts.heal(i)
        elif kind == "slow":
            hosts.slow(i, rng.choice((20, 50, 200)), rng.choice((0, 5, 20)))
            try:
                self.stop.wait(fault["lasts_s"])
            finally:
                hosts.fast(i)
        else:  # freeze, and a partition's stand-in on loopback
            c.signal(i, signal.SIGSTOP)
            try:
                self.stop.wait(fault["lasts_s"])
            finally:
                c.signal(i, signal.SIGCONT)
        self.done.append(record)


class Producer(threading.Thread):
    """One client of the replica set sending the workload's operations in turn."""

    def __init__(self, n: int, url: str, seed: int, history, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.n, self.url, self.history, self.stop_event = n, url, history, stop
        self.rng = random.Random(seed * 1000 + n)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connect(self.url, timeout_s=5, failover_timeout_s=30) as client:
                producer = client.producer(f"chaos-{self.n}")
                seq = 0
                while not self.stop_event.is_set():
                    self.history(self._one(producer, seq))
                    seq += 1
                    self.stop_event.wait(self.rng.uniform(0.0, 0.03))
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc

    def _one(self, producer, seq: int) -> Op:
        rng = self.rng
        kind = rng.choices(list(OP_WEIGHTS), weights=list(OP_WEIGHTS.values()))[0]
        size = rng.randint(2, 8) if kind == "batch" else 1
        ids = [f"p{self.n}-{seq}-{k}" for k in range(size)]
        queue = rng.randrange(QUEUES)
        delay = rng.randint(*DELAY_MS) if kind in ("delayed", "timer-key") else None
        op = Op(self.n, seq, kind, ids, queue, delay, invoke_ms=int(time.time() * 1000))
        try:
            if kind == "batch":
                results = producer.send_batch([Message(TOPIC, p.encode()) for p in ids],
                                              queue_id=queue)
            elif kind == "keys":
                results = [producer.send(Message(TOPIC, ids[0].encode(), keys=ids[0]),
                                         queue_id=queue)]
            elif kind == "delayed":
                results = [producer.send(Message(TOPIC, ids[0].encode()), delay_ms=delay,
                                         queue_id=queue)]
            elif kind == "timer-key":
                results = [producer.send(Message(TOPIC, ids[0].encode()), delay_ms=delay,
                                         queue_id=queue, key=ids[0])]
            else:
                results = [producer.send(Message(TOPIC, ids[0].encode()), queue_id=queue)]
            op.outcome = "ok"
            op.acks = [[r.queue_id, r.queue_offset, r.deliver_at_ms] for r in results]
        except UNKNOWN as exc:
            op.outcome, op.error = "unknown", f"{type(exc).__name__}: {exc}"[:300]
        except StoreError as exc:
            # a keyed timer send is repeated by the client: an earlier try may be stored
            op.outcome = "unknown" if kind == "timer-key" else "failed"
            op.error = f"{type(exc).__name__}: {exc}"[:300]
        op.complete_ms = int(time.time() * 1000)
        return op


# ---------------------------------------------------------------------------------------
# A run


def _read_back(url: str) -> list[dict]:
    rows = []
    with connect(url, timeout_s=60, failover_timeout_s=60) as store:
        if TOPIC not in store.topics():
            return rows
        for q in store.queue_ids(TOPIC):
            lo, hi = store.min_offset(TOPIC, q), store.max_offset(TOPIC, q)
            if hi <= lo:
                continue
            batch = store.read_arrow(TOPIC, q, lo, hi, columns=[
                "body", "queue_offset", "store_timestamp"])
            # (microseconds since the epoch, UTC)
            micros = batch.column("store_timestamp").cast(pa.int64()).to_pylist()
            for body, offset, us in zip(batch.column("body").to_pylist(),
                                        batch.column("queue_offset").to_pylist(), micros):
                rows.append({"id": body.decode(errors="replace"), "queue": q,
                             "offset": offset, "store_ms": us // 1000})
    return rows


def run(*, minutes: float, seed: int, replicas: int, sync: bool, producers: int = 3,
        out: str | None = None, hosts: str = "auto", kinds: tuple[str, ...] | None = None,
        log=print) -> dict:
    """One run; returns the summary (``violations`` empty when the history is right)."""
    if replicas not in (2, 3):
        raise ValueError(f"replicas={replicas}; allowed: 2 or 3")
    use_netns = hosts == "netns" or (hosts == "auto" and NamespaceHosts.available())
    if hosts == "netns" and not NamespaceHosts.available():
        raise SystemExit("--hosts netns needs root and `ip`")
    net = NamespaceHosts(replicas + 1) if use_netns else LoopbackHosts(replicas + 1)
    kinds = tuple(k for k in (kinds or KINDS) if getattr(net, "netem", False) or k != "slow")
    work = tempfile.mkdtemp(prefix="rmq-fault-run-")
    out = out or os.path.join(work, "out")
    os.makedirs(out, exist_ok=True)
    schedule = fault_schedule(seed, minutes * 60, kinds)
    cluster = Cluster(work, net, replicas, 2 if sync else 1)
    ops: list[dict] = []
    lock = threading.Lock()
    history_file = open(os.path.join(out, "history.jsonl"), "w")  # noqa: SIM115

    def record(op: Op) -> None:
        d = asdict(op)
        with lock:
            ops.append(d)
            history_file.write(json.dumps(d) + "\n")

    started = time.monotonic()
    try:
        for i in range(replicas + 1):
            cluster.start(i)
        wait_for_leader(cluster, 120)
        if sync:
            wait_for("a follower", lambda: any((cluster.replication(i) or {}).get(
                "state") == "following" for i in range(replicas)), 120, cluster)
        with connect(cluster.url, timeout_s=10, failover_timeout_s=60) as client:
            first_epoch = client.replica_epochs()["epoch"]
        log(f"replica set up ({net.kind}); {len(schedule)} faults scheduled over "
            f"{minutes:g} min; work in {work}")
        stop = threading.Event()
        workers = [Producer(n, cluster.url, seed, record, stop) for n in range(producers)]
        nemesis = Nemesis(cluster, schedule, log)
        for w in workers:
            w.start()
        nemesis.start()
        # SIGINT or SIGTERM (the main thread only): end the faults now, heal and check
        _on_signals(nemesis.stop.set)
        nemesis.join(minutes * 60 + 120)
        nemesis.stop.set()
        nemesis.join(60)
        # heal everything
        if isinstance(net, NamespaceHosts):
            for i in range(replicas + 1):
                net.heal(i)
                net.fast(i)
        for i in range(replicas + 1):
            cluster.signal(i, signal.SIGCONT)
            if not cluster.alive(i):
                cluster.start(i)
        time.sleep(3)  # the workload goes on across the healing
        stop.set()
        for w in workers:
            w.join(120)
        history_file.close()
        errors = [f"producer {w.n}: {w.error!r}" for w in workers if w.error]
        if nemesis.error:
            errors.append(f"nemesis: {nemesis.error!r}")
        leader = wait_for_leader(cluster, 120)
        with connect(cluster.urls[leader], timeout_s=30) as store:
            info = store.replica_epochs()
        end, last_epoch = info["end"], info["epoch"]
        wait_for("every replica at the leader's end", lambda: all(
            (cluster.replication(i) or {}).get("end", -1) >= end
            for i in range(replicas) if i != leader), 180, cluster)
        due = max((a[2] or 0 for op in ops for a in op["acks"]), default=0)
        due = max([due] + [op["invoke_ms"] + op["delay_ms"] for op in ops if op["delay_ms"]])
        time.sleep(max(0.0, (due - time.time() * 1000) / 1000) + 5)
        stored = _read_back(cluster.urls[leader])
        with connect(cluster.urls[leader], timeout_s=30) as store:
            end = store.replica_epochs()["end"]
        wait_for("every replica at the leader's end", lambda: all(
            (cluster.replication(i) or {}).get("end", -1) >= end
            for i in range(replicas) if i != leader), 180, cluster)
        cluster.close()
        logs = {f"replica-{i}": commitlog_bytes(d, end) for i, d in enumerate(cluster.dirs)}
        cuts = sum(len([n for n in os.listdir(os.path.join(d, "config", "truncated"))
                        if n.endswith(".bin")])
                   for d in cluster.dirs if os.path.isdir(os.path.join(d, "config",
                                                                       "truncated")))
        terms = leader_terms([os.path.join(work, f"serve-{i}.log") for i in range(replicas)])
        changes = sum(1 for (_, a), (_, b) in itertools.pairwise(terms) if a != b)
        report = check(ops, stored, sync=sync, leader_changes=changes,
                       diverged=compare_logs(logs)
                       + [f"replica {k} holds {len(v)} bytes, the leader {end}"
                          for k, v in logs.items() if len(v) != end])
        report["violations"][:0] = errors
        with open(os.path.join(out, "stored.jsonl"), "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in stored)
        faults = Counter(f["kind"] + ("" if f["kind"].startswith("kill")
                                      else "-leader" if f["was_leader"] else "")
                         for f in nemesis.done)
        summary = {
            "seed": seed, "minutes": minutes, "replicas": replicas,
            "replication": "sync (min_insync_replicas 2)" if sync else "async",
            "hosts": net.kind, "seconds": round(time.monotonic() - started, 1),
            **report["counts"], "faults": dict(faults), "faults_total": len(nemesis.done),
            "leader_changes": changes, "terms": last_epoch - first_epoch,
            "tails_cut": cuts,
            "commitlog_bytes": end, "history": os.path.join(out, "history.jsonl"),
            "violations": report["violations"],
        }
        with open(os.path.join(out, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=1)
        with open(os.path.join(out, "faults.jsonl"), "w") as fh:
            fh.writelines(json.dumps(f) + "\n" for f in nemesis.done)
        return summary
    finally:
        if not history_file.closed:
            history_file.close()
        cluster.close()
        net.close()
        for i in range(replicas + 1):
            src = os.path.join(work, f"serve-{i}.log")
            if os.path.exists(src):
                shutil.copy(src, out)


def _on_signals(handler) -> bool:
    """``handler()`` on SIGINT and SIGTERM, where this is the main thread (a test may run
    :func:`run` on another); whether it was installed.  The handler runs on a thread of its
    own: run in the signal handler, a second signal arriving while the first one's
    ``Event.set`` held the event's lock deadlocked the run (seen: two Ctrl-C)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: threading.Thread(target=handler, daemon=True).start())
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replicas", type=int, choices=(2, 3), default=3)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sync", dest="sync", action="store_true", default=True,
                      help="min_insync_replicas 2 (the default)")
    mode.add_argument("--async", dest="sync", action="store_false",
                      help="min_insync_replicas 1")
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--hosts", choices=("auto", "netns", "loopback"), default="auto")
    parser.add_argument("--faults", default=",".join(KINDS),
                        help=f"comma-separated kinds among {', '.join(KINDS)}")
    parser.add_argument("--out", help="directory for history.jsonl, stored.jsonl, "
                        "faults.jsonl, summary.json and the servers' logs")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.faults.split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        parser.error(f"unknown fault kinds {bad}; allowed: {', '.join(KINDS)}")
    summary = run(minutes=args.minutes, seed=args.seed, replicas=args.replicas,
                  sync=args.sync, producers=args.producers, out=args.out, hosts=args.hosts,
                  kinds=kinds, log=lambda text: print(text, file=sys.stderr, flush=True))
    violations = summary.pop("violations")
    print(json.dumps(summary, indent=1))
    for line in violations[:50]:
        print("VIOLATION", line)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
