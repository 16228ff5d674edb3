"""What one task of the rmq sink costs, outside Spark: open the store, ``send_table`` of the
task's rows on one thread (as a Spark task encodes), close (the flush of what it wrote).

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_sink_task.py [--rows N] [--repeat R]
    PYTHONPATH=. /work/venv/bin/python bench/bench_sink_task.py --stage-cpu [--call N]

``--stage-cpu``: the CPU seconds (``time.process_time``) of ``send_table`` and of
``Sink.stage`` (the exactly-once task's write) of the same rows, in calls of ``--call`` rows
(a Spark task's 65,536 by default), each case in a fresh store after one warm-up call, in
turns, ``--repeat`` rounds; prints every round, the best and the median.

The parts of a Spark task's write that are rmq's own (docs/benchmarks.md, the sink against
the no-op sink): the open, the append, the close's wait for the disk.  Not collected by
pytest.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pyarrow as pa  # noqa: E402

from store import MessageStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stage-cpu", action="store_true",
                    help="CPU of send_table against Sink.stage of the same rows")
    ap.add_argument("--call", type=int, default=65536, help="rows per call (--stage-cpu)")
    args = ap.parse_args()
    if args.stage_cpu:
        return stage_cpu(args.rows, args.call, args.repeat)
    n = args.rows
    work = tempfile.mkdtemp(prefix="rmq-bench-sink-task-")
    try:
        path = os.path.join(work, "s")
        MessageStore.open(path).close()
        table = pa.table({"topic": pa.array(["orders"] * n),
                          "body": pa.array([b"x" * 100] * n, pa.binary()),
                          "tags": pa.array(["created"] * n),
                          "keys": pa.array([f"k{i}" for i in range(n)])})
        print(f"{n:,} rows of 100-byte bodies per task")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            store = MessageStore.open(path)
            t1 = time.perf_counter()
            store.encode_threads = 1
            store.producer("bench").send_table(table)
            t2 = time.perf_counter()
            store.close()
            t3 = time.perf_counter()
            print(f"open {t1 - t0:.3f} s   send_table {t2 - t1:.3f} s   close (flush) "
                  f"{t3 - t2:.3f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def stage_cpu(n: int, call: int, repeat: int) -> None:
    body = bytes(i % 256 for i in range(100))
    table = pa.table({"topic": ["bench"] * n, "body": [body] * n, "tags": ["TagA"] * n,
                      "keys": [f"k{i}" for i in range(n)]})
    parts = [table.slice(i, call) for i in range(0, n, call)]
    cpu: dict[str, list[float]] = {"send_table": [], "stage": []}
    work = tempfile.mkdtemp(prefix="rmq-bench-stage-cpu-")
    try:
        for r in range(repeat):
            for case, times in cpu.items():
                path = os.path.join(work, f"{case}-{r}")
                store = MessageStore.open(path)
                store.encode_threads = 1  # as a Spark task
                write = (store.sink("bench").stage if case == "stage"
                         else store.producer("bench").send_table)
                write(parts[0])  # warm-up (compiled kernels, files)
                gc.collect()
                t0 = time.process_time()
                for part in parts:
                    write(part)
                times.append(time.process_time() - t0)
                store.close()
                shutil.rmtree(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{n:,} rows of 100-byte bodies in calls of {call:,} rows, CPU seconds")
    for case, times in cpu.items():
        print(f"{case:10s} best {min(times):.3f}  median {statistics.median(times):.3f}  "
              f"rounds {' '.join(f'{t:.3f}' for t in times)}")
    send, stage = cpu["send_table"], cpu["stage"]
    print(f"stage / send_table: best {min(stage) / min(send):.2f}x  median "
          f"{statistics.median(stage) / statistics.median(send):.2f}x")


if __name__ == "__main__":
    main()
