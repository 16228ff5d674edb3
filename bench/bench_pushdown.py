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
   pushdown saves the source itself, apart from Spark's per-query and per-row costs;
5. by key (the store keeps the key index, ``message_index_enable``; every message has its
   own key ``k<i>``, and ten of them spread over the topic also carry ``hot``): a batch read
   with the option ``keys`` of ten keys (one message each), and of ``hot`` (ten messages),
   found through the index, against the same rows by a full read that Spark filters
   (``arrays_overlap(keys, ...)``, which no source is offered); and
   ``store.query_messages`` of one key alone (target: < 50 ms).

``--cases`` picks the cases to run (``tags,hour,keys``; default all).

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
#: the key ten messages carry besides their own (:func:`hot_messages`)
HOT_KEY = "hot"
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
    config = StoreConfig(commitlog_file_size_bytes=1 << 30, default_queue_count=4,
                         message_index_enable=True)
    hot = set(hot_messages(n))
    with MessageStore.open(path, config, clock=clock) as store:
        producer = store.producer("bench")
        for first in range(0, n, BATCH):
            batch = [Message("bench", b"%08d" % i + pad, tags="rare" if i % 10 == 0 else "common",
                             keys=f"k{i} {HOT_KEY}" if i in hot else f"k{i}")
                     for i in range(first, min(n, first + BATCH))]
            producer.send_batch(batch)
            now[0] += step_ms * len(batch)
    return time.perf_counter() - t0


def hot_messages(n: int) -> list[int]:
    """The ten messages that also carry the key ``hot``, spread over the topic."""
    return [k * (n // 10) + 7 for k in range(10)]


def some_keys(n: int) -> list[str]:
    """Ten keys of one message each, spread over the topic."""
    return [f"k{k * (n // 10) + 3}" for k in range(10)]


def timed(spark, path: str, where: str | None, pushdown: bool, **options) -> tuple[float, int]:
    spark.conf.set(PUSHDOWN_CONF, "true" if pushdown else "false")
    df = spark.read.format("rmq").option("subscribe", "bench").option("deliverDue", "false")
    for name, value in options.items():
        df = df.option(name, value)
    df = df.load(path)
    if where is not None:
        df = df.where(where)
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    secs = time.perf_counter() - t0
    return secs, df.count()


def source_side(path: str, filters: list, pushdown: bool, **options) -> tuple[float, int]:
    """The source's own work without Spark: plan, then read every partition in this process
    (pushdown off and no ``options``: every row, which Spark would then filter)."""
    from rmq_source.batch_reader import RmqBatchReader, RmqPushdownReader
    from rmq_source.options import parse_options

    opts = parse_options({"path": path, "subscribe": "bench", "deliverdue": "false",
                          **options}, streaming=False)
    t0 = time.perf_counter()
    reader = (RmqPushdownReader if pushdown else RmqBatchReader)(opts)
    if pushdown:
        assert not list(reader.pushFilters(filters))
    rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
    return time.perf_counter() - t0, rows


def by_key(spark, path: str, n: int, repeat: int) -> None:
    """Case 5: the option ``keys`` through the index against a full read filtered by Spark."""
    from store import StoreReader

    for name, keys in (("10 keys of one message each", some_keys(n)),
                       (f"one key of 10 messages ({HOT_KEY})", [HOT_KEY])):
        where = f"arrays_overlap(keys, array({', '.join(repr(k) for k in keys)}))"
        ways = {"index": ({"keys": ",".join(keys)}, None), "scan": ({}, where)}
        best = dict.fromkeys(ways, float("inf"))
        rows = {way: timed(spark, path, w, False, **o)[1] for way, (o, w) in ways.items()}
        assert rows["index"] == rows["scan"] == 10, rows
        for _ in range(repeat):  # alternate, so that a change of load hits both
            for way, (options, w) in ways.items():
                best[way] = min(best[way], timed(spark, path, w, False, **options)[0])
        own = {"index": min(source_side(path, [], False, keys=",".join(keys))[0]
                            for _ in range(repeat)),
               "scan": min(source_side(path, [], False)[0] for _ in range(repeat))}
        for way in ways:
            print(f"{name:36s} {way:5s}: {best[way]:7.3f} s best of {repeat} "
                  f"({rows[way]:,} rows); the source alone {own[way]:6.3f} s")
        print(f"{name:36s} the index takes {best['index'] / best['scan']:.3f}x the scan's "
              f"time (target < 0.1x); the source alone {own['index'] / own['scan']:.4f}x")
    with StoreReader.open(path) as store:
        store.query_messages("bench", key=HOT_KEY, max=64)  # warm
        secs = []
        for _ in range(max(repeat, 5)):
            t0 = time.perf_counter()
            found = store.query_messages("bench", key=HOT_KEY, max=64)
            secs.append(time.perf_counter() - t0)
        assert len(found) == 10, len(found)
        print(f"store.query_messages of one key (10 messages) of {n:,}: "
              f"{min(secs) * 1000:.2f} ms best of {len(secs)} (target < 50 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", default="tags,hour,keys",
                        help="comma-separated: tags, hour, keys (default: all)")
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
        queries = [  # case, name, SQL, the same as Spark's filters, target
            ("tags", "tags = 'rare' (10%)", "tags = 'rare'", [EqualTo(("tags",), "rare")], 5.0),
            ("hour", "one hour of 30 by store_timestamp",
             (f"store_timestamp >= timestamp_millis({hour_ms}) AND "
              f"store_timestamp < timestamp_millis({hour_ms + 3_600_000})"),
             [GreaterThanOrEqual(("store_timestamp",), hour[0]),
              LessThan(("store_timestamp",), hour[1])], 10.0),
        ]
        cases = set(args.cases.split(","))
        for case, name, where, filters, target in queries:
            if case not in cases:
                continue
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
        if "keys" in cases:
            by_key(spark, path, args.messages, args.repeat)
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
