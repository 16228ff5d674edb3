"""A replica set's copy of the consumer groups' progress: what one copy costs a follower and
its leader, with this checkout's code against another's (``git archive`` of a commit).

Run::

    PYTHONPATH=. python bench/bench_consumer_progress.py [--queues 10000 100000]
        [--baseline-root /tmp/rmq-main] [--repeat 3]

For each number of queues N, a leader's files hold N queues (over 10 groups and 100 topics,
a tenth of them with two acks above their offset) and a follower starts empty.  The leader
answers as its ``consumer_progress`` action does (the answer through the wire's JSON both
ways, in this process: the Flight call itself left out), and the follower's
``ProgressCopy.copy`` asks, checks, merges and writes.  Timed, each the best of ``--repeat``
runs, each in a fresh process per checkout:

* ``first``: the first copy (the follower holds nothing);
* ``same``: a copy when nothing changed;
* ``1%``: a copy after the leader saved its files with 1 % of the queues moved on.

Each figure is split into the leader's part (the answer) and the follower's (the rest), and
the rows that crossed are counted.  With ``--baseline-root``, the same in that checkout and
the ratio of each total.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace


def _progress(n: int, moved: int = 0):
    from store.files.consumer_progress import ConsumerProgress
    offsets = {(f"group{i % 10}", f"topic{(i // 10) % 100}", i // 1000): 1000 + i
               for i in range(n)}
    keys = list(offsets)
    for i in range(0, n, 100)[:moved]:
        offsets[keys[i]] += 50
    acks = {k: frozenset({offsets[k] + 2, offsets[k] + 5}) for k in keys[::10]}
    return ConsumerProgress(offsets, acks)


class _Leader:
    def __init__(self, root: str) -> None:
        from store.remote.wire import dumps, loads
        self.root, self.dumps, self.loads = root, dumps, loads
        self.address = SimpleNamespace(url="rmq://127.0.0.1:1")
        try:
            from store.files.progress_table import ProgressLog
            self.log = ProgressLog(root)
        except ImportError:  # the previous version: the whole progress each time
            self.log = None
        self.spent = 0.0
        self.rows = 0

    def consumer_progress(self, **asked):
        from store.files.consumer_progress import progress_fields, read_progress
        start = time.perf_counter()
        if self.log is None:
            answer = progress_fields(read_progress(self.root), 3)
            self.rows = sum(len(q) for q in answer["offsets"].values())
        else:
            answer = self.log.answer(3, self.loads(self.dumps(asked), "the body"))
            self.rows = len(answer["queue"])
        data = self.dumps(answer)
        self.spent += time.perf_counter() - start
        return self.loads(data, "the answer")

    def close(self) -> None:
        pass


def worker(n: int) -> dict:
    from store.files.consumer_progress import write_progress
    from store.replication.consumer_progress import ProgressCopy
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        leader_root, root = os.path.join(tmp, "leader"), os.path.join(tmp, "follower")
        for r in (leader_root, root):
            os.makedirs(os.path.join(r, "config"))
        write_progress(leader_root, _progress(n))
        leader = _Leader(leader_root)
        copy = ProgressCopy(SimpleNamespace(root=root, now_ms=lambda: 1), leader, 1000)
        for case in ("first", "same", "1%"):
            if case == "1%":
                write_progress(leader_root, _progress(n, moved=n // 100))
            leader.spent = 0.0
            start = time.perf_counter()
            copy.copy()
            total = time.perf_counter() - start
            assert copy.error is None, copy.error
            out[case] = {"total_s": total, "leader_s": leader.spent,
                         "follower_s": total - leader.spent, "rows": leader.rows}
    return out


def _run(root: str, n: int) -> dict:
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", str(n)],
                          env=env, cwd=root, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--baseline-root", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker)))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = [("this", here)] + ([("baseline", args.baseline_root)]
                                    if args.baseline_root else [])
    for n in args.queues:
        best: dict = {}
        for _ in range(args.repeat):  # alternated, the best of each kept
            for label, root in checkouts:
                for case, figures in _run(root, n).items():
                    kept = best.setdefault((label, case), figures)
                    if figures["total_s"] < kept["total_s"]:
                        best[(label, case)] = figures
        for case in ("first", "same", "1%"):
            line = [f"{n:>7} queues  {case:>5}"]
            for label, _ in checkouts:
                f = best[(label, case)]
                line.append(f"{label}: {f['total_s'] * 1000:9.1f} ms (leader "
                            f"{f['leader_s'] * 1000:8.1f}, follower "
                            f"{f['follower_s'] * 1000:8.1f}; {f['rows']:>6} rows)")
            if len(checkouts) == 2:
                ratio = best[("baseline", case)]["total_s"] / best[("this", case)]["total_s"]
                line.append(f"baseline/this {ratio:6.1f}x")
            print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
