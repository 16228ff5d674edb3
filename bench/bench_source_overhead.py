"""The ``rmq`` streaming source's own work per micro-batch, on a large store, against Spark's
batch time with a trivial source, in one run.

Run::

    PYTHONPATH=. python bench/bench_source_overhead.py [--pending 1000000] [--topics 100]
        [--queues 10] [--batches 30] [--spark]

A store with ``topics x queues`` queues (1,000 by default) and ``--pending`` timer messages due
an hour later (never delivered during the run).  Then, ``--batches`` times, as Spark's driver
calls them for one micro-batch of a ``subscribePattern`` query over every topic
(``deliverDue=true``, the default):

    10 new messages sent to random queues;
    latestOffset(start)  ->  partitions(start, end)  ->  commit(end)

each call timed (the reader is the real ``DataSourceStreamReader``; no Spark needed for
these).  Reports p50 / p99 / max of the three together (target: at most 20 ms per
micro-batch) and of each call.

With ``--spark``: the batch time Spark itself spends per micro-batch with a trivial Python
streaming source (one row per batch, ``foreachBatch`` doing nothing), from the queries'
progress reports (``triggerExecution``), as the floor every Python source pays; and the same
for the ``rmq`` source on this store, for comparison.

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pyarrow as pa  # noqa: E402

from store import Message, MessageStore, StoreConfig  # noqa: E402


def build(path: str, topics: int, queues: int, pending: int) -> None:
    t0 = time.perf_counter()
    config = StoreConfig(default_queue_count=queues)
    with MessageStore.open(path, config) as store:
        p = store.producer("bench")
        for t in range(topics):
            for q in range(queues):
                p.send(Message(f"topic{t:03d}", b"x" * 100), queue_id=q)
        chunk = 100_000
        body = pa.array([b"y" * 100] * chunk, pa.binary())
        for first in range(0, pending, chunk):
            n = min(chunk, pending - first)
            p.send_table(pa.table({"topic": pa.array([f"topic{(first // chunk) % topics:03d}"]
                                                     * n),
                                   "body": body.slice(0, n),
                                   "delay_ms": pa.array([3_600_000] * n, pa.int64())}))
    print(f"store: {topics * queues} queues, {pending:,} pending timer messages "
          f"({time.perf_counter() - t0:.1f} s to build)", flush=True)


def driver_calls(path: str, topics: int, queues: int, batches: int) -> dict[str, list[float]]:
    from pyspark.sql.datasource import ReadAllAvailable
    from pyspark.sql.pandas.types import from_arrow_schema

    from store import MESSAGE_SCHEMA

    from rmq_source.source import RmqDataSource

    source = RmqDataSource({"path": path, "subscribePattern": "topic.*",
                            "startingOffsets": "latest"})
    reader = source.streamReader(from_arrow_schema(MESSAGE_SCHEMA))
    times: dict[str, list[float]] = {"latestOffset": [], "partitions": [], "commit": [],
                                     "total": []}
    start = reader.initialOffset()
    rng = random.Random(7)
    with MessageStore.open(path) as store:
        p = store.producer("bench")
        for _ in range(batches + 3):
            for _ in range(10):
                p.send(Message(f"topic{rng.randrange(topics):03d}", b"z" * 100),
                       queue_id=rng.randrange(queues))
            t0 = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            t1 = time.perf_counter()
            parts = reader.partitions(start, end)
            t2 = time.perf_counter()
            reader.commit(end)
            t3 = time.perf_counter()
            assert parts, "no partition planned for the new messages"
            for name, dt in (("latestOffset", t1 - t0), ("partitions", t2 - t1),
                             ("commit", t3 - t2), ("total", t3 - t0)):
                times[name].append(dt * 1000)
            start = end
    reader.stop()
    return {k: v[3:] for k, v in times.items()}  # the first three warm the process


def spark_batches(path: str, batches: int) -> dict[str, list[float]]:
    """``triggerExecution`` ms per micro-batch: a trivial Python source, then rmq."""
    from pyspark.sql.datasource import (DataSource, DataSourceStreamReader, InputPartition,
                                        ReadAllAvailable)

    from rmq_cli.session import local_spark

    class Tick(DataSourceStreamReader):
        """One row per micro-batch; ``wide``: an offset of as many queues as the rmq store
        has (100 topics x 10 queues), as rmq's offset, one of them moving."""

        def __init__(self, wide):
            self.n = 0
            self.wide = wide

        def _offset(self):
            if not self.wide:
                return {"n": self.n}
            out = {f"topic{t:03d}": {str(q): 1000 for q in range(10)} for t in range(100)}
            out["topic000"]["0"] = self.n
            return out

        def initialOffset(self):
            return self._offset()

        def latestOffset(self):
            self.n += 1
            return self._offset()

        def partitions(self, start, end):
            return [InputPartition(self.n)]

        def read(self, partition):
            yield (partition.value,)

        def commit(self, end):
            pass

    class LimitedTick(Tick):
        """The same with admission control (a default read limit), as the rmq source has
        (``maxOffsetsPerTrigger``): Spark then calls ``latestOffset(start, limit)``."""

        def getDefaultReadLimit(self):
            return ReadAllAvailable()

        def latestOffset(self, start, limit):
            return super().latestOffset()

    class TickSource(DataSource):
        @classmethod
        def name(cls):
            return "rmq_bench_tick"

        def schema(self):
            return "n long"

        def streamReader(self, schema):
            if self.options.get("limit") == "true":
                return LimitedTick(self.options.get("wide") == "true")
            return Tick(self.options.get("wide") == "true")

    work = tempfile.mkdtemp(prefix="bench-overhead-spark-")
    spark = local_spark("bench-source-overhead", work, pythonpath=ROOT)
    spark.dataSource.register(TickSource)
    out = {}
    try:
        tick = spark.readStream.format("rmq_bench_tick")
        for name, df in (("trivial source", tick.load()),
                         ("trivial source, 1,000-queue offset", tick.option("wide", "true").load()),
                         ("trivial source, read limit", tick.option("limit", "true").load()),
                         ("rmq", spark.readStream.format("rmq")
                          .option("subscribePattern", "topic.*")
                          .option("startingOffsets", "latest").load(path))):
            q = (df.writeStream.foreachBatch(lambda batch, i: None)
                 .option("checkpointLocation", os.path.join(work, name.replace(" ", "_")))
                 .trigger(processingTime="100 milliseconds").start())
            writer = MessageStore.open(path) if name == "rmq" else None  # a producer's store
            try:
                end = time.time() + 120
                while len(q.recentProgress) < batches + 3 and time.time() < end:
                    if writer is not None:
                        writer.producer("bench").send(Message("topic000", b"s" * 100))
                    time.sleep(0.1)
                progress = q.recentProgress[3:]
                out[name] = [p["durationMs"]["triggerExecution"] for p in progress]
                for part in ("latestOffset", "queryPlanning", "addBatch", "walCommit",
                             "commitOffsets"):
                    values = [p["durationMs"].get(part, 0) for p in progress]
                    out[f"{name}: {part}"] = values
            finally:
                q.stop()
                if writer is not None:
                    writer.close()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return out


def show(label: str, values: list[float]) -> None:
    qs = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
    print(f"  {label:48s} p50 {statistics.median(values):8.2f}  p99 {qs[98]:8.2f}  "
          f"max {max(values):8.2f}  (n={len(values)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--queues", type=int, default=10)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--spark", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-overhead-")
    try:
        path = os.path.join(work, "store")
        build(path, args.topics, args.queues, args.pending)
        times = driver_calls(path, args.topics, args.queues, args.batches)
        print("driver-side work of the rmq source per micro-batch, ms:")
        for name in ("latestOffset", "partitions", "commit", "total"):
            show(name, times[name])
        p99 = statistics.quantiles(times["total"], n=100)[98]
        print(f"  target: latestOffset + partitions + commit <= 20 ms: "
              f"{'met' if p99 <= 20 else 'missed'} at p99 ({p99:.1f} ms)")
        if args.spark:
            print("Spark's triggerExecution per micro-batch, ms:")
            for name, values in spark_batches(path, args.batches).items():
                show(name, values)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
