"""``spark.read.format("rmq")`` against ``spark.read.parquet`` of the same rows, in one run.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_spark_read.py [--messages N] [--repeat R]
        [--constant-bodies] [--keep DIR]

Steps, in one temporary directory:

1. ``send_batch`` N (2,000,000) 100-byte messages into a store with 1 GiB CommitLog segments
   (each message has a tag, a key and a user property, like real traffic; bodies differ
   unless ``--constant-bodies``);
2. start a ``local[2]`` session (workers use this interpreter: ``PYSPARK_PYTHON``);
3. write the very rows the rmq source returns to Parquet with Spark (the baseline's input);
4. time a full scan of each into the ``noop`` sink (``.write.format("noop")``), one warm-up
   and R timed runs each, alternating, and report the best and median rows/s of both and
   the ratio rmq / parquet (target >= 0.8).

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rmq_cli.session import local_spark  # noqa: E402
from store import Message, MessageStore, StoreConfig  # noqa: E402

BODY_BYTES = 100
BATCH = 1000


def write_store(path: str, n: int, constant: bool) -> float:
    """Fill a store with ``n`` messages; return the seconds it took."""
    rand = os.urandom(n * 8) if not constant else b""
    pad = bytes(BODY_BYTES - 8)
    t0 = time.perf_counter()
    with MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=1 << 30)) as store:
        producer = store.producer("bench")
        for first in range(0, n, BATCH):
            batch = []
            for i in range(first, min(n, first + BATCH)):
                body = (rand[i * 8:i * 8 + 8] if not constant else b"01234567") + pad
                batch.append(Message("bench", body, tags="TagA", keys=f"k{i}",
                                     properties={"p": "v"}))
            producer.send_batch(batch)
    return time.perf_counter() - t0


def spark_session(workdir: str):
    return local_spark("bench-spark-read", workdir, pythonpath=ROOT,
                       extra_conf={"spark.driver.memory": "4g"})


def timed_scan(df) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--constant-bodies", action="store_true")
    parser.add_argument("--keep", help="use (and keep) this directory instead of a temp one")
    args = parser.parse_args()

    workdir = args.keep or tempfile.mkdtemp(prefix="rmq-bench-read-")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "store")
    parquet = os.path.join(workdir, "parquet")
    try:
        if not os.path.exists(path):
            secs = write_store(path, args.messages, args.constant_bodies)
            print(f"wrote {args.messages:,} messages of {BODY_BYTES} bytes in {secs:.1f} s")
        spark = spark_session(workdir)
        rmq = spark.read.format("rmq").option("subscribe", "bench").load(path)
        if not os.path.exists(parquet):
            rmq.write.parquet(parquet)
        pq = spark.read.parquet(parquet)
        n = pq.count()
        assert n == args.messages, (n, args.messages)
        partitions = rmq.rdd.getNumPartitions()
        times: dict[str, list[float]] = {"rmq": [], "parquet": []}
        timed_scan(rmq)  # warm-up: Python workers, JIT, page cache
        timed_scan(pq)
        for _ in range(args.repeat):
            times["rmq"].append(timed_scan(rmq))
            times["parquet"].append(timed_scan(pq))
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    bodies = "constant" if args.constant_bodies else "distinct random"
    print(f"{n:,} rows, {BODY_BYTES}-byte {bodies} bodies, local[2], noop sink, "
          f"rmq partitions: {partitions}")
    best = {k: n / min(v) for k, v in times.items()}
    median = {k: n / statistics.median(v) for k, v in times.items()}
    for k in ("rmq", "parquet"):
        runs = ", ".join(f"{t:.2f}" for t in times[k])
        print(f"{k:8s} best {best[k] / 1e6:5.2f} M rows/s   median {median[k] / 1e6:5.2f} M rows/s"
              f"   (runs: {runs} s)")
    print(f"ratio rmq/parquet: best {best['rmq'] / best['parquet']:.2f}x   "
          f"median {median['rmq'] / median['parquet']:.2f}x   (target >= 0.8x)")


if __name__ == "__main__":
    main()
