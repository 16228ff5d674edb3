"""What one task of the rmq sink costs, outside Spark: open the store, ``send_table`` of the
task's rows on one thread (as a Spark task encodes), close (the flush of what it wrote).

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_sink_task.py [--rows N] [--repeat R]

The parts of a Spark task's write that are rmq's own (docs/benchmarks.md, the sink against
the no-op sink): the open, the append, the close's wait for the disk.  Not collected by
pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
