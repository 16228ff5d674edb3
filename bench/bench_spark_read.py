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
   and R timed runs each, alternating: rmq, Parquet, the *ceiling* (a throw-away Python
   source yielding the same rows already decoded, read from the Parquet copy with pyarrow:
   the best a Python data source can do) and rmq with a narrower schema (``topic string,
   body binary``); report the best and median rows/s of each and the ratios rmq / parquet,
   rmq / ceiling (target >= 0.95) and narrow / full.

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


CEILING_SOURCE = "rmq_bench_ceiling"


def write_ceiling_input(parquet: str, out: str) -> None:
    """The Parquet rows as 4 Arrow IPC files in the rmq source's exact Arrow schema (untimed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from store import MESSAGE_SCHEMA

    os.makedirs(out, exist_ok=True)
    files = sorted(os.path.join(parquet, f) for f in os.listdir(parquet)
                   if f.endswith(".parquet"))
    for i in range(4):
        with pa.OSFile(os.path.join(out, f"part-{i}.arrow"), "wb") as sink, \
                pa.ipc.new_file(sink, MESSAGE_SCHEMA) as writer:
            for f in files[i::4]:
                for b in pq.ParquetFile(f).iter_batches(batch_size=65_536):
                    writer.write_table(pa.Table.from_batches([b]).cast(MESSAGE_SCHEMA))


def register_ceiling(spark) -> None:
    """A throw-away Python data source yielding the same rows already decoded (Arrow IPC files
    in the rmq schema, memory-mapped, 65,536 rows per batch): the best any Python source can
    do in this Spark."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from rmq_source.schema import MESSAGE_SPARK_DDL

    class Part(InputPartition):
        def __init__(self, file):
            self.file = file

    class Reader(DataSourceReader):
        def __init__(self, path):
            self.path = path

        def partitions(self):
            return [Part(os.path.join(self.path, f)) for f in sorted(os.listdir(self.path))]

        def read(self, partition):
            import pyarrow as pa

            reader = pa.ipc.open_file(pa.memory_map(partition.file))
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    class Ceiling(DataSource):
        @classmethod
        def name(cls):
            return CEILING_SOURCE

        def schema(self):
            return MESSAGE_SPARK_DDL

        def reader(self, schema):
            return Reader(self.options["path"])

    spark.dataSource.register(Ceiling)


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
        ceiling = os.path.join(workdir, "ceiling")
        if not os.path.exists(ceiling):
            write_ceiling_input(parquet, ceiling)
        register_ceiling(spark)
        frames = {
            "rmq": rmq, "parquet": pq,
            "ceiling": spark.read.format(CEILING_SOURCE).load(ceiling),
            "rmq narrow": spark.read.format("rmq").schema("topic string, body binary")
            .option("subscribe", "bench").load(path),
        }
        times: dict[str, list[float]] = {k: [] for k in frames}
        for df in frames.values():  # warm-up: Python workers, JIT, page cache
            timed_scan(df)
        for _ in range(args.repeat):
            for k, df in frames.items():
                times[k].append(timed_scan(df))
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    bodies = "constant" if args.constant_bodies else "distinct random"
    print(f"{n:,} rows, {BODY_BYTES}-byte {bodies} bodies, local[2], noop sink, "
          f"rmq partitions: {partitions}")
    best = {k: n / min(v) for k, v in times.items()}
    median = {k: n / statistics.median(v) for k, v in times.items()}
    for k in times:
        runs = ", ".join(f"{t:.2f}" for t in times[k])
        print(f"{k:11s} best {best[k] / 1e6:5.2f} M rows/s   median {median[k] / 1e6:5.2f} M "
              f"rows/s   (runs: {runs} s)")
    print(f"ratio rmq/parquet: best {best['rmq'] / best['parquet']:.2f}x   "
          f"median {median['rmq'] / median['parquet']:.2f}x")
    print(f"ratio rmq/ceiling (a Python source yielding decoded rows): best "
          f"{best['rmq'] / best['ceiling']:.2f}x   median "
          f"{median['rmq'] / median['ceiling']:.2f}x   (target >= 0.95x)")
    print(f"ratio rmq narrow (topic, body) / rmq full schema: best "
          f"{best['rmq narrow'] / best['rmq']:.2f}x   median "
          f"{median['rmq narrow'] / median['rmq']:.2f}x")


if __name__ == "__main__":
    main()
