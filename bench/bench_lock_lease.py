"""Single sends with and without the append lock's lease, in one process and in several.

The lease (``StoreConfig.append_lock_lease_ms``, :mod:`store.core.lock_lease`) lets a process
that sends single messages keep the store's ``flock`` between its sends.  The baseline is the
same code with ``append_lock_lease_ms=0`` (the lock taken and given back on every send), run
in the same invocation, in turns with the lease::

    PYTHONPATH=. python bench/bench_lock_lease.py [--messages 20000] [--processes 1,2,3]
                                                  [--repeat 3]

For each number of processes ``P`` it starts ``P`` writer processes on one store, lets them
open it, then has them send ``--messages`` messages each (100-byte bodies) at the same time,
and prints the total msgs/s, each process's worst gap between two of its sends (how long it
waited for the lock at worst) and the 99th percentile of those gaps.  Best total of
``--repeat`` runs per case.  Not collected by pytest.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from store import Message, MessageStore, StoreConfig  # noqa: E402

BODY = bytes(range(100))


def writer(path: str, lease_ms: int, n: int, results, go) -> None:
    with MessageStore.open(path, StoreConfig(append_lock_lease_ms=lease_ms)) as store:
        producer = store.producer("bench")
        messages = [Message("bench", BODY, tags="TagA") for _ in range(n)]
        go.wait()
        stamps = [time.perf_counter()]
        for m in messages:
            producer.send(m)
            stamps.append(time.perf_counter())
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    results.put((stamps[0], stamps[-1], gaps[-1], gaps[int(len(gaps) * 0.99)]))


def run(processes: int, lease_ms: int, n: int) -> tuple[float, float, float]:
    """``(total msgs/s, worst gap s, worst p99 gap s)`` of ``processes`` writers at once."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        MessageStore.open(d).close()
        results, go = ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=writer, args=(d, lease_ms, n, results, go))
                 for _ in range(processes)]
        for p in procs:
            p.start()
        time.sleep(2.0 + processes)  # every writer has opened the store and built its messages
        go.set()
        out = [results.get(timeout=300) for _ in procs]
        for p in procs:
            p.join()
    start, end = min(r[0] for r in out), max(r[1] for r in out)
    return processes * n / (end - start), max(r[2] for r in out), max(r[3] for r in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000, help="sends per process")
    ap.add_argument("--processes", default="1,2,3", help="comma-separated process counts")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.messages} single sends per process, 100-byte bodies; best of {args.repeat}; "
          f"{os.cpu_count()} CPUs")
    print(f"{'processes':>9} {'lease':>6} {'msgs/s':>10} {'worst gap':>10} {'p99 gap':>9} "
          f"{'vs no lease':>11}")
    for processes in [int(p) for p in args.processes.split(",")]:
        best: dict[int, tuple[float, float, float]] = {}
        for _ in range(args.repeat):
            for lease_ms in (0, 1):  # in turns
                r = run(processes, lease_ms, args.messages)
                if lease_ms not in best or r[0] > best[lease_ms][0]:
                    best[lease_ms] = r
        for lease_ms in (0, 1):
            rate, worst, p99 = best[lease_ms]
            print(f"{processes:>9} {lease_ms:>4}ms {rate:>10,.0f} {worst * 1e3:>8.1f}ms "
                  f"{p99 * 1e6:>7.0f}us {rate / best[0][0]:>10.2f}x")


if __name__ == "__main__":
    main()
