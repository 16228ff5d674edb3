"""A replica set on loopback: how fast an asynchronous follower copies its leader, and what
the follower costs the leader's ``send_table``.

Run::

    PYTHONPATH=. python bench/bench_replication.py [--messages N] [--table-rows R]

Three ``rmq serve`` processes in one temporary directory, each in a process of its own (as
in production): a lone served store (the baseline), then a leader and its follower
(``--replica-set``).  This process sends N messages (100-byte bodies, a tag) with
``connect(url).producer(g).send_table`` in tables of R rows to the baseline, then to the
leader, while a thread samples the leader's and the follower's confirmed CommitLog ends
(read-only opens of their directories) every 5 ms.  Reported:

* ``send_table`` msgs/s to the lone store and to the leader, and their ratio (the
  follower's cost to the leader's writers; asynchronous: a send never waits for it);
* the follower's copy rate (msgs/s from the first send to the moment it holds all N);
* the lag: bytes behind the leader, p50 / p99 / max over the samples, and how long after
  the last acknowledged send the follower held everything.

With ``--sync``, the synchronous case instead: a lone served store against a leader with
one follower and ``min_insync_replicas: 2`` (every send waits until the follower holds it)::

    PYTHONPATH=. python bench/bench_replication.py --sync [--messages N] [--table-rows R]
        [--batch-size B] [--singles S]

reports ``send_table`` (tables of R rows) and ``send_batch`` (batches of B messages)
msgs/s to each and their ratio, the latency of S single ``send`` calls (p50 / p99)
to each, and the msgs/s of 8 clients sending single messages at once; both cases run K
times, alternated, and the best throughput of each (all the latencies) is kept.  After each
case's single sends, as many Flight round trips to the same server, one after another (a
``DoGet`` answered with one small batch, as each round of the replication stream is):
the added p50 / p99 of a synchronous send (against the lone store's) are set beside the
round trip's p50 / p99 of the same run, and the target is checked as added p99 <= 1 ms +
round-trip p99 (the older figure, the p50 of a ``snapshot`` action, is printed too).
``--singles-only`` skips the throughput cases; ``--baseline-root DIR`` adds a pair served
from another checkout (``git archive`` of a branch), alternated with this one's::

    PYTHONPATH=. python bench/bench_replication.py --sync --singles-only --singles 2000 \
        --repeat 3 --baseline-root /tmp/rmq-main

With ``--rate``, the lag under a sustained load instead::

    PYTHONPATH=. python bench/bench_replication.py --rate 100000 --seconds 30

sends ``rate`` messages a second (100-byte bodies, a tag) for ``seconds`` s with
``send_table``, a table every 10 ms of what is due by then (a sender that fell behind
catches up with a larger one, of at most 100 ms of messages), to a leader with one
asynchronous follower, then to a leader with one synchronous follower
(``min_insync_replicas: 2``), each pair fresh. A thread samples every 5 ms, in read-only
opens of both directories, the confirmed CommitLog ends and the queue ends; reported for
each: the rate reached, and the follower's lag in bytes and in messages (the leader's end
minus the follower's) and in ms (for each sample, the time until the follower held the
leader's end of that moment), p50 / p99 / max, with the load average of the machine.

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np
import pyarrow as pa

from store import Message, StoreReader, connect, server_status

ENV = dict(os.environ, PYTHONPATH=ROOT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(path: str, port: int, *extra: str, root: str = ROOT) -> subprocess.Popen:
    """``rmq serve`` of the checkout at ``root`` (another one: ``--baseline-root``)."""
    proc = subprocess.Popen([sys.executable, "-m", "rmq_cli.cli", "serve", "--store", path,
                             "--create", "--listen", f"127.0.0.1:{port}", "--log-level",
                             "WARNING", *extra], env=dict(ENV, PYTHONPATH=root), cwd=root,
                            stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        status = server_status(path)
        if status and status.get("attached") and status.get("pid") == proc.pid \
                and status.get("running"):
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"rmq serve for {path} did not start")
        time.sleep(0.05)


def tables(n: int, rows: int):
    body = np.frombuffer(b"x" * 100, dtype=np.uint8)
    for start in range(0, n, rows):
        k = min(rows, n - start)
        offsets = np.arange(k + 1, dtype=np.int32) * 100
        bodies = pa.Array.from_buffers(pa.binary(), k, [None, pa.py_buffer(offsets),
                                                         pa.py_buffer(np.tile(body, k))])
        yield pa.table({"body": bodies, "tags": pa.array(["t"] * k)})


def send_all(url: str, n: int, rows: int) -> float:
    with connect(url, timeout_s=600) as remote:
        p = remote.producer("bench")
        start = time.perf_counter()
        for t in tables(n, rows):
            p.send_table(t, topic="bench")
        return time.perf_counter() - start


def send_batches(url: str, n: int, size: int) -> float:
    with connect(url, timeout_s=600) as remote:
        p = remote.producer("bench")
        batch = [Message("bench", b"x" * 100, tags="t") for _ in range(size)]
        start = time.perf_counter()
        for _ in range(0, n, size):
            p.send_batch(batch)
        return time.perf_counter() - start


def single_sends(url: str, count: int) -> np.ndarray:
    """Latency (ms) of ``count`` single sends, one after another (after 100 to warm up)."""
    with connect(url, timeout_s=600) as remote:
        p = remote.producer("bench")
        message = Message("single", b"x" * 100, tags="t")
        for _ in range(100):
            p.send(message)
        out = np.empty(count)
        for i in range(count):
            t = time.perf_counter()
            p.send(message)
            out[i] = (time.perf_counter() - t) * 1000
        return out


def concurrent_sends(url: str, threads: int, per_thread: int) -> float:
    """msgs/s of ``threads`` clients each sending ``per_thread`` single messages at once."""
    remotes = [connect(url, timeout_s=600) for _ in range(threads)]
    message = Message("concurrent", b"x" * 100, tags="t")
    for r in remotes:
        r.producer("bench").send(message)
    start = threading.Barrier(threads + 1)

    def run(remote) -> None:
        p = remote.producer("bench")
        start.wait()
        for _ in range(per_thread):
            p.send(message)

    workers = [threading.Thread(target=run, args=(r,)) for r in remotes]
    for w in workers:
        w.start()
    start.wait()
    t = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t
    for r in remotes:
        r.close()
    return threads * per_thread / elapsed


def round_trip_ms(url: str, count: int = 500) -> float:
    """p50 of one Flight call with little to do (a ``snapshot`` action: the queue bounds),
    in ms."""
    with connect(url, timeout_s=60) as remote:
        out = []
        for _ in range(count):
            t = time.perf_counter()
            remote.refresh()
            remote.topics()
            out.append((time.perf_counter() - t) * 1000)
        return float(np.percentile(out, 50))


def get_round_trips(url: str, count: int) -> np.ndarray:
    """Latency (ms) of ``count`` Flight ``DoGet`` calls one after another, each answered with
    one small batch (one message of queue 0 of topic ``single``: :func:`single_sends` sent
    it): a request and its answer, as each round of the replication stream is one."""
    with connect(url, timeout_s=60) as remote:
        remote.read_arrow("single", 0, 0, 1)
        out = np.empty(count)
        for i in range(count):
            t = time.perf_counter()
            remote.read_arrow("single", 0, 0, 1)
            out[i] = (time.perf_counter() - t) * 1000
        return out


def replica_pair(tmp: str, procs: list, name: str, root: str = ROOT) -> str:
    """A leader and one follower (``min_insync_replicas: 2``) of the checkout at ``root``;
    the leader's URL."""
    lead_port, follow_port = free_port(), free_port()
    rs = os.path.join(tmp, f"replicas-{name}.json")
    with open(rs, "w") as fh:
        json.dump({"replicas": [f"rmq://127.0.0.1:{lead_port}",
                                f"rmq://127.0.0.1:{follow_port}"],
                   "min_insync_replicas": 2, "replica_ack_timeout_ms": 30_000}, fh)
    procs.append(serve(os.path.join(tmp, f"leader-{name}"), lead_port, "--replica-set", rs,
                       root=root))
    procs.append(serve(os.path.join(tmp, f"follower-{name}"), follow_port, "--replica-set", rs,
                       root=root))
    leader = f"rmq://127.0.0.1:{lead_port}"
    single_sends(leader, 10)  # (its first send waits until the follower has connected)
    return leader


def percentiles(a: np.ndarray) -> tuple[float, float]:
    return tuple(float(x) for x in np.percentile(a, [50, 99]))


def sync_case(args, tmp: str, procs: list) -> None:
    n, rows = args.messages, args.table_rows
    base_port = free_port()
    procs.append(serve(os.path.join(tmp, "alone"), base_port))
    alone = f"rmq://127.0.0.1:{base_port}"
    cases = {"alone": alone, "sync": replica_pair(tmp, procs, "sync")}
    if args.baseline_root:  # the same pair served from another checkout (before/after)
        cases["baseline sync"] = replica_pair(tmp, procs, "base",
                                             os.path.abspath(args.baseline_root))
    load = os.getloadavg()
    print(f"load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on "
          f"{os.cpu_count()} cores", flush=True)
    figures = {name: {} for name in cases}
    for _ in range(args.repeat):  # alternated, the best of each kept: the machine's noise
        for name, url in cases.items():
            got = {"single": single_sends(url, args.singles),
                   "trip": get_round_trips(url, args.singles)}
            if not args.singles_only:
                got.update(table=send_all(url, n, rows),
                           batch=send_batches(url, n, args.batch_size),
                           concurrent=concurrent_sends(url, 8, max(1, args.singles // 8)))
            best = figures[name]
            for kind in ("table", "batch"):  # seconds: the least
                if kind in got:
                    best[kind] = min(best.get(kind, got[kind]), got[kind])
            if "concurrent" in got:
                best["concurrent"] = max(best.get("concurrent", 0.0), got["concurrent"])
            for kind in ("single", "trip"):
                best[kind] = np.concatenate([best.get(kind, np.empty(0)), got[kind]])
    rtt = round_trip_ms(alone)
    synced = [name for name in cases if name != "alone"]
    print(f"messages {n:,} (100-byte bodies); send_table in tables of {rows:,}, send_batch "
          f"in batches of {args.batch_size:,}; one follower, min_insync_replicas 2, loopback")
    for kind in ("table", "batch") if not args.singles_only else ():
        a = figures["alone"][kind]
        for name in synced:
            s = figures[name][kind]
            print(f"send_{kind:<5} lone store {n / a:12,.0f} msgs/s   {name} leader "
                  f"{n / s:12,.0f} msgs/s   ratio {a / s:.2f}x")
    pa50, pa99 = percentiles(figures["alone"]["single"])
    print(f"single send ({args.singles} in a row, x{args.repeat}) and, after each, as many "
          f"DoGet round trips (one message read) to the same server, p50 / p99 in ms:")
    print(f"  alone: send {pa50:.2f} / {pa99:.2f}; round trip "
          "{:.2f} / {:.2f}".format(*percentiles(figures["alone"]["trip"])))
    for name in synced:
        ps50, ps99 = percentiles(figures[name]["single"])
        r50, r99 = percentiles(figures[name]["trip"])
        added50, added99 = ps50 - pa50, ps99 - pa99
        print(f"  {name}: send {ps50:.2f} / {ps99:.2f}; round trip {r50:.2f} / {r99:.2f}; "
              f"added {added50:.2f} / {added99:.2f}; target added p99 <= 1 ms + round-trip "
              f"p99 = {1 + r99:.2f} ms: {'met' if added99 <= 1 + r99 else 'NOT met'} "
              f"(added p50 - round-trip p50 {added50 - r50:.2f} ms)")
    print(f"  (the older figure: one Flight round trip, p50 of a snapshot action on the lone "
          f"store, {rtt:.2f} ms)")
    for name in synced if not args.singles_only else ():
        a, s = figures["alone"]["concurrent"], figures[name]["concurrent"]
        print(f"8 clients sending single messages at once: lone {a:,.0f} msgs/s, {name} "
              f"{s:,.0f} msgs/s, ratio {s / a:.2f}x (waiting writers share one follower report)")
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


def confirmed(reader: StoreReader) -> int:
    return reader.confirmed_offset()


def queued(reader: StoreReader, topic: str) -> int:
    """Messages the queues of ``topic`` hold (0 before it exists)."""
    reader.topic_table.reload()
    if topic not in reader.topics():
        return 0
    return sum(reader.max_offset(topic, q) for q in reader.queue_ids(topic))


def paced_send(url: str, rate: int, seconds: float) -> tuple[int, float]:
    """Send ``rate`` msgs/s for ``seconds`` s (a table every 10 ms of what is due by then,
    at most 100 ms of messages); the messages sent and the seconds it took."""
    body = np.frombuffer(b"x" * 100, dtype=np.uint8)
    with connect(url, timeout_s=600) as remote:
        p = remote.producer("bench")
        p.send(Message("paced", b"warm", tags="t"))
        sent, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            k = min(int(rate * elapsed) - sent, max(1, rate // 10))
            if k > 0:
                offsets = np.arange(k + 1, dtype=np.int32) * 100
                bodies = pa.Array.from_buffers(pa.binary(), k, [
                    None, pa.py_buffer(offsets), pa.py_buffer(np.tile(body, k))])
                p.send_table(pa.table({"body": bodies, "tags": pa.array(["t"] * k)}),
                             topic="paced")
                sent += k
            time.sleep(max(0.0, 0.01 - (time.perf_counter() - start - elapsed)))
        return sent, time.perf_counter() - start


def paced_case(args, tmp: str, procs: list, insync: int) -> dict:
    """One leader and one follower (``min_insync_replicas`` ``insync``) under
    :func:`paced_send`: the lag figures (see the module docstring)."""
    lead_port, follow_port = free_port(), free_port()
    rs = os.path.join(tmp, f"replicas-{insync}.json")
    with open(rs, "w") as fh:
        json.dump({"replicas": [f"rmq://127.0.0.1:{lead_port}",
                                f"rmq://127.0.0.1:{follow_port}"],
                   "min_insync_replicas": insync, "replica_ack_timeout_ms": 30_000}, fh)
    a, b = os.path.join(tmp, f"leader-{insync}"), os.path.join(tmp, f"follower-{insync}")
    procs.append(serve(a, lead_port, "--replica-set", rs))
    procs.append(serve(b, follow_port, "--replica-set", rs))
    deadline = time.monotonic() + 60
    while ((server_status(b) or {}).get("replication") or {}).get("state") != "following":
        if time.monotonic() > deadline:
            raise SystemExit("the follower did not start following")
        time.sleep(0.05)
    readers = StoreReader.open(a), StoreReader.open(b)
    samples: list[tuple[float, int, int, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            t = time.perf_counter()
            lead, follow = readers
            samples.append((t, confirmed(lead), confirmed(follow), queued(lead, "paced"),
                            queued(follow, "paced")))
            time.sleep(max(0.0, 0.005 - (time.perf_counter() - t)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sent, took = paced_send(f"rmq://127.0.0.1:{lead_port}", args.rate, args.seconds)
    end = confirmed(readers[0])
    while confirmed(readers[1]) < end:
        time.sleep(0.001)
    time.sleep(0.05)
    done.set()
    sampler.join()
    for r in readers:
        r.close()
    t, lead, follow, lead_q, follow_q = (np.array(c) for c in zip(*samples))
    # ms lag: for each sample, when did the follower first hold the leader's end of then
    # (from the sample on: the follower's end is read after the leader's)
    held = np.maximum(np.searchsorted(np.maximum.accumulate(follow), lead, side="left"),
                      np.arange(len(t)))
    ok = held < len(t)
    lag_ms = (t[held[ok]] - t[ok]) * 1000
    return {"sent": sent, "rate": sent / took, "samples": len(t),
            "bytes": lead - follow, "messages": lead_q - follow_q, "ms": lag_ms,
            "mb": end / 1e6}


def paced(args, tmp: str, procs: list) -> None:
    load = os.getloadavg()
    print(f"paced: {args.rate:,} msgs/s asked for {args.seconds:g} s (100-byte bodies, a "
          f"table every 10 ms); load average before {load[0]:.1f} {load[1]:.1f} "
          f"{load[2]:.1f} on {os.cpu_count()} cores")
    for insync, name in ((1, "asynchronous"), (2, "synchronous (min_insync_replicas 2)")):
        got = paced_case(args, tmp, procs, insync)
        print(f"{name}: {got['sent']:,} messages, {got['rate']:,.0f} msgs/s reached, "
              f"CommitLog {got['mb']:.0f} MB, {got['samples']} samples every 5 ms")
        for what, unit in (("bytes", "bytes"), ("messages", "messages"), ("ms", "ms")):
            v = got[what]
            print(f"  lag {unit:<9} p50 {np.percentile(v, 50):>12,.1f}  p99 "
                  f"{np.percentile(v, 99):>12,.1f}  max {v.max():>12,.1f}")
    load = os.getloadavg()
    print(f"load average after {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--table-rows", type=int, default=100_000)
    ap.add_argument("--sync", action="store_true",
                    help="the synchronous case (min_insync_replicas 2) against a lone store")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--singles", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=2,
                    help="--sync: rounds of both cases, alternated; the best of each kept")
    ap.add_argument("--singles-only", action="store_true",
                    help="--sync: only the single sends and the round trips")
    ap.add_argument("--baseline-root", default=None, metavar="DIR",
                    help="--sync: also a pair served from the checkout in DIR (before/after)")
    ap.add_argument("--rate", type=int, default=0,
                    help="the lag under a sustained rate (msgs/s): asynchronous and synchronous")
    ap.add_argument("--seconds", type=float, default=30.0, help="--rate: for how long")
    args = ap.parse_args()
    n, rows = args.messages, args.table_rows
    tmp = tempfile.mkdtemp(prefix="rmq-bench-replication-")
    procs = []
    try:
        if args.rate:
            paced(args, tmp, procs)
            return
        if args.sync:
            sync_case(args, tmp, procs)
            return
        base_port, lead_port, follow_port = free_port(), free_port(), free_port()
        procs.append(serve(os.path.join(tmp, "alone"), base_port))
        alone_s = send_all(f"rmq://127.0.0.1:{base_port}", n, rows)

        rs = os.path.join(tmp, "replicas.json")
        with open(rs, "w") as fh:
            json.dump({"replicas": [f"rmq://127.0.0.1:{lead_port}",
                                    f"rmq://127.0.0.1:{follow_port}"]}, fh)
        a, b = os.path.join(tmp, "leader"), os.path.join(tmp, "follower")
        procs.append(serve(a, lead_port, "--replica-set", rs))
        procs.append(serve(b, follow_port, "--replica-set", rs))
        leader_reader, follower_reader = StoreReader.open(a), StoreReader.open(b)
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append(confirmed(leader_reader) - confirmed(follower_reader))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        leader_s = send_all(f"rmq://127.0.0.1:{lead_port}", n, rows)
        acked = time.perf_counter()
        end = confirmed(leader_reader)
        while confirmed(follower_reader) < end:
            time.sleep(0.001)
        held = time.perf_counter()
        done.set()
        sampler.join()
        lag = np.array(samples or [0], dtype=np.int64)
        print(f"messages {n:,} (100-byte bodies) in tables of {rows:,}; CommitLog "
              f"{end / 1e6:.0f} MB")
        print(f"send_table to a lone served store : {n / alone_s:12,.0f} msgs/s")
        print(f"send_table to a leader (1 follower): {n / leader_s:12,.0f} msgs/s  "
              f"ratio {alone_s / leader_s:.2f}x")
        print(f"follower holds all N after        : {held - t0:.2f} s from the first send "
              f"({n / (held - t0):,.0f} msgs/s copied), {1000 * (held - acked):.0f} ms after "
              "the last acknowledged send")
        print(f"lag behind the leader (bytes)     : p50 {np.percentile(lag, 50):,.0f}  "
              f"p99 {np.percentile(lag, 99):,.0f}  max {lag.max():,}  "
              f"({len(lag)} samples every 5 ms)")
        leader_reader.close()
        follower_reader.close()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
