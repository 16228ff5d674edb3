"""Lateness seen by Spark: rmq's delayed messages against Spark's own floor, in one run.

Run::

    PYTHONPATH=. python bench/bench_spark_latency.py [--messages 600] [--seconds 20]
        [--trigger-ms 250] [--precision-ms 100]

Two streaming queries in turn on one ``local[2]`` session, each into the same
``foreachBatch`` (it collects the batch's two columns and notes the wall time it saw them):

* **floor**: a trivial Python streaming source whose rows become available at known times
  (row *i* at ``start + i * seconds / messages``; ``latestOffset`` hands out the rows whose
  time has come). Lateness: seen minus available, what any Python source pays for Spark's
  micro-batch scheduling;
* **rmq**: the same number of timer messages sent up front, due at the same times, read by
  ``spark.readStream.format("rmq")`` with ``deliverDue=true`` (the query itself delivers,
  as in the demo) on a store with ``timer_precision_ms`` = ``--precision-ms``. Lateness:
  seen minus due.

Reports p50 / p99 / max of each and the target: rmq's p99 at most the floor's p99 plus the
precision.  Spark 4's real-time mode does not take Python sources, so the micro-batch floor
is the floor.  Not collected by pytest.
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


def register_floor_source(spark) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Timed(DataSourceStreamReader):
        def __init__(self, options):
            self.start_ms = int(options["start_ms"])
            self.step_ms = float(options["step_ms"])
            self.count = int(options["count"])

        def initialOffset(self):
            return {"n": 0}

        def latestOffset(self):
            now = time.time() * 1000
            n = min(self.count, max(0, int((now - self.start_ms) // self.step_ms) + 1))
            return {"n": n}

        def partitions(self, start, end):
            return [InputPartition((start["n"], end["n"]))]

        def read(self, partition):
            lo, hi = partition.value
            for i in range(lo, hi):
                yield (i, int(self.start_ms + i * self.step_ms))

        def commit(self, end):
            pass

    class TimedSource(DataSource):
        @classmethod
        def name(cls):
            return "rmq_bench_timed"

        def schema(self):
            return "i long, due_ms long"

        def streamReader(self, schema):
            return Timed(self.options)

    spark.dataSource.register(TimedSource)


def run_query(df, work: str, name: str, count: int, trigger_ms: int, timeout_s: float):
    """Into a foreachBatch that notes when it saw each row; returns ``seen - due`` in ms."""
    late: list[float] = []

    def each(batch, _batch_id):
        rows = batch.collect()
        now = time.time() * 1000
        late.extend(now - r["due_ms"] for r in rows)

    q = (df.writeStream.foreachBatch(each)
         .option("checkpointLocation", os.path.join(work, f"ckpt-{name}"))
         .trigger(processingTime=f"{trigger_ms} milliseconds").start())
    try:
        end = time.time() + timeout_s
        while len(late) < count and time.time() < end:
            time.sleep(0.1)
    finally:
        q.stop()
    return late


def show(label: str, values: list[float]) -> float:
    p99 = statistics.quantiles(values, n=100)[98]
    print(f"  {label:8s} p50 {statistics.median(values):8.0f}  p99 {p99:8.0f}  "
          f"max {max(values):8.0f} ms  (n={len(values)}, min {min(values):.0f})")
    return p99


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=600)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--trigger-ms", type=int, default=250)
    ap.add_argument("--precision-ms", type=int, default=100)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-latency-")
    spark = local_spark("bench-spark-latency", work, pythonpath=ROOT)
    register_floor_source(spark)
    step = args.seconds * 1000 / args.messages
    try:
        # warm both paths (workers, imports, compiled loops) before anything is timed
        store_path = os.path.join(work, "store")
        config = StoreConfig(timer_precision_ms=args.precision_ms)
        with MessageStore.open(store_path, config) as store:
            store.producer("bench").send(Message("due", b"warm"))
        spark.read.format("rmq").option("subscribe", "due").load(store_path).collect()

        start = int(time.time() * 1000) + 5000
        floor_df = (spark.readStream.format("rmq_bench_timed").option("start_ms", start)
                    .option("step_ms", step).option("count", args.messages).load())
        floor = run_query(floor_df, work, "floor", args.messages, args.trigger_ms,
                          args.seconds + 30)

        start = int(time.time() * 1000) + 8000
        with MessageStore.open(store_path, config) as store:
            p = store.producer("bench")
            for i in range(args.messages):
                due = int(start + i * step)
                p.send(Message("due", str(due).encode()), deliver_at_ms=due)
        rmq_df = (spark.readStream.format("rmq").option("subscribe", "due")
                  .option("startingOffsets", "latest").load(store_path)
                  .selectExpr("0L AS i", "CAST(CAST(body AS STRING) AS LONG) AS due_ms"))
        rmq = run_query(rmq_df, work, "rmq", args.messages, args.trigger_ms, args.seconds + 30)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"lateness seen in foreachBatch, trigger every {args.trigger_ms} ms, "
          f"{args.messages} rows over {args.seconds:.0f} s:")
    floor_p99 = show("floor", floor)
    rmq_p99 = show("rmq", rmq)
    early = sum(1 for v in rmq if v < 0)
    target = floor_p99 + args.precision_ms
    print(f"  target: rmq p99 <= floor p99 + timer_precision_ms = {target:.0f} ms: "
          f"{'met' if rmq_p99 <= target else 'missed'} ({rmq_p99:.0f} ms); "
          f"{early} seen early")


if __name__ == "__main__":
    main()
