"""Filter pushdown of ``spark.read.format("rmq")``: the same queries with it on and off, in one run.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_pushdown.py [--messages N] [--repeat R]
        [--keep DIR]

Steps, in one temporary directory:

1. ``send_batch`` N (1,000,000) 100-byte messages into one topic (4 queues), on a clock that
   spreads their store times over 30 hours; one message in ten has the tag ``rare``, the rest
   ``common``;
2. start a ``local[2]`` session;
3. time each query into the ``noop`` sink, pushdown off (Spark's default) then on
   (``spark.sql.python.filterPushdown.enabled``), one warm-up and R timed runs each:
   ``tags = 'rare'`` (target: on >= 5x faster) and one hour of the 30 by
   ``store_timestamp`` (target: >= 10x); report the best seconds of each and the ratios;
4. the same reads without Spark (the source's planning and ``read()`` in this process): what
   pushdown saves the source itself, apart from Spark's per-query and per-row costs.

Not collected by pytest.
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

from rmq_cli.session import local_spark  # noqa: E402
from rmq_source.pushdown import PUSHDOWN_CONF  # noqa: E402
from store import Message, MessageStore, StoreConfig  # noqa: E402

BODY_BYTES = 100
BATCH = 1000
HOURS = 30
START_MS = 1_700_000_000_000


def write_store(path: str, n: int) -> float:
    """Fill a store with ``n`` messages over ``HOURS`` hours of store time; return seconds."""
    now = [START_MS]
    step_ms = HOURS * 3_600_000 / n

    def clock() -> int:
        return int(now[0])

    pad = bytes(BODY_BYTES - 8)
    t0 = time.perf_counter()
    config = StoreConfig(commitlog_file_size_bytes=1 << 30, default_queue_count=4)
    with MessageStore.open(path, config, clock=clock) as store:
        producer = store.producer("bench")
        for first in range(0, n, BATCH):
            batch = [Message("bench", b"%08d" % i + pad, tags="rare" if i % 10 == 0 else "common",
                             keys=f"k{i}") for i in range(first, min(n, first + BATCH))]
            producer.send_batch(batch)
            now[0] += step_ms * len(batch)
    return time.perf_counter() - t0


def timed(spark, path: str, where: str, pushdown: bool) -> tuple[float, int]:
    spark.conf.set(PUSHDOWN_CONF, "true" if pushdown else "false")
    df = (spark.read.format("rmq").option("subscribe", "bench").option("deliverDue", "false")
          .load(path).where(where))
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    secs = time.perf_counter() - t0
    return secs, df.count()


def source_side(path: str, filters: list, pushdown: bool) -> tuple[float, int]:
    """The source's own work without Spark: plan, then read every partition in this process
    (pushdown off: every row, which Spark would then filter)."""
    from rmq_source.batch_reader import RmqBatchReader, RmqPushdownReader
    from rmq_source.options import parse_options

    opts = parse_options({"path": path, "subscribe": "bench", "deliverdue": "false"},
                         streaming=False)
    t0 = time.perf_counter()
    reader = (RmqPushdownReader if pushdown else RmqBatchReader)(opts)
    if pushdown:
        assert not list(reader.pushFilters(filters))
    rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
    return time.perf_counter() - t0, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="use (and keep) this directory instead of a temp one")
    args = parser.parse_args()

    workdir = args.keep or tempfile.mkdtemp(prefix="rmq-bench-pushdown-")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "store")
    try:
        if not os.path.exists(path):
            secs = write_store(path, args.messages)
            print(f"wrote {args.messages:,} messages of {BODY_BYTES} bytes in {secs:.1f} s")
        spark = local_spark("bench-pushdown", workdir, pythonpath=ROOT,
                            extra_conf={"spark.driver.memory": "4g"})
        import datetime as dt

        from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

        hour_ms = START_MS + 12 * 3_600_000
        hour = [dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
                for ms in (hour_ms, hour_ms + 3_600_000)]
        queries = [  # name, SQL, the same as Spark's filters, target
            ("tags = 'rare' (10%)", "tags = 'rare'", [EqualTo(("tags",), "rare")], 5.0),
            ("one hour of 30 by store_timestamp",
             (f"store_timestamp >= timestamp_millis({hour_ms}) AND "
              f"store_timestamp < timestamp_millis({hour_ms + 3_600_000})"),
             [GreaterThanOrEqual(("store_timestamp",), hour[0]),
              LessThan(("store_timestamp",), hour[1])], 10.0),
        ]
        for name, where, filters, target in queries:
            best = {False: float("inf"), True: float("inf")}
            rows = {pushdown: timed(spark, path, where, pushdown)[1]  # warm-up, row count
                    for pushdown in (False, True)}
            for _ in range(args.repeat):  # alternate, so that a change of load hits both
                for pushdown in (False, True):
                    best[pushdown] = min(best[pushdown], timed(spark, path, where, pushdown)[0])
            own = {pushdown: min(source_side(path, filters, pushdown)[0]
                                 for _ in range(args.repeat)) for pushdown in (False, True)}
            for pushdown in (False, True):
                print(f"{name:36s} pushdown {'on ' if pushdown else 'off'}: "
                      f"{best[pushdown]:7.3f} s best of {args.repeat} ({rows[pushdown]:,} rows);"
                      f" the source alone {own[pushdown]:6.3f} s")
            print(f"{name:36s} on is {best[False] / best[True]:.1f}x faster (target >= "
                  f"{target:.0f}x); the source alone {own[False] / own[True]:.1f}x")
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
