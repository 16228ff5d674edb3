"""Store groups: appends by concurrent processes to 1, 2 and 4 stores; the Spark sink and the
Spark read over 1 store against a 2-store group.

Run::

    PYTHONPATH=. python bench/bench_group.py [--messages N] [--rows R] [--no-spark]

Measures, in one run and one directory:

* ``appends``: P writer processes (P = 1, 2, 4), each sending ``--messages / P`` messages of
  100 bytes with ``send_batch`` (256 per batch) or ``send_table`` (8,192 rows per call),
  either all into **one store** (they queue behind its append lock) or each into **its own
  store of a group** (``GroupProducer.send_batch(..., store=...)``); aggregate msgs/s, and
  the ratio against one process on one store measured in the same run (the baseline);
* ``sink``: ``df.write.format("rmq")`` (exactly once) of ``--rows`` rows into one store and
  into a 2-store group (4 Spark partitions, ``local[2]``);
* ``read``: ``spark.read.format("rmq")`` of the same rows from the one store and from the
  group (noop sink), best of ``--repeat``.

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from store import Message, MessageStore, StoreConfig, StoreGroup  # noqa: E402

BODY = bytes(i % 256 for i in range(100))
CONFIG = StoreConfig(commitlog_file_size_bytes=256 << 20)


def _writer(path: str, member: str | None, n: int, api: str, start, done) -> None:
    import pyarrow as pa

    if member is None:
        store = MessageStore.open(path, CONFIG)
        send_batch = store.producer("bench").send_batch
        send_table = store.producer("bench").send_table
    else:
        group = StoreGroup.open(path)
        producer = group.producer("bench")
        store = group

        def send_batch(batch):
            return producer.send_batch(batch, store=member)

        def send_table(table):
            return group.store(member).producer("bench").send_table(table)

    batch = [Message("bench", BODY, tags="TagA") for _ in range(256)]
    table = pa.table({"topic": ["bench"] * 8192, "body": [BODY] * 8192, "tags": ["TagA"] * 8192})
    send_batch(batch[:1])  # warm: topic, segment, compiled kernels
    send_table(table.slice(0, 1))
    start.wait()
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        if api == "batch":
            send_batch(batch)
            sent += len(batch)
        else:
            send_table(table)
            sent += table.num_rows
    done.put((t0, time.perf_counter(), sent))
    store.close()


def append_case(tmp: str, processes: int, stores: int, total: int, api: str) -> float:
    """Aggregate msgs/s of ``processes`` writers over ``stores`` stores (1: a plain store)."""
    path = os.path.join(tmp, f"append-{api}-{processes}-{stores}")
    if stores == 1:
        MessageStore.open(path, CONFIG).close()
        members = [None] * processes
    else:
        StoreGroup.create(path, stores, CONFIG).close()
        members = [f"store-{i % stores}" for i in range(processes)]
    ctx = mp.get_context("spawn")
    start, done = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, m, total // processes, api, start, done))
             for m in members]
    for p in procs:
        p.start()
    time.sleep(3.0)  # every writer warmed up
    start.set()
    results = [done.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    began = min(r[0] for r in results)
    ended = max(r[1] for r in results)
    shutil.rmtree(path, ignore_errors=True)
    return sum(r[2] for r in results) / (ended - began)


def spark_cases(tmp: str, rows: int, repeat: int) -> list[tuple[str, float]]:
    from rmq_cli.session import local_spark

    spark = local_spark("bench-group", tmp, pythonpath=ROOT,
                        extra_conf={"spark.driver.memory": "4g"})
    df = spark.range(rows, numPartitions=4).selectExpr(
        "'bench' AS topic", "concat(cast(id AS string), repeat('x', 92)) AS body").cache()
    df.count()
    out = []
    one, group = os.path.join(tmp, "sink-one"), os.path.join(tmp, "sink-group")
    for name, path in (("1 store", one), ("2-store group", group)):
        best = None
        for r in range(repeat):
            shutil.rmtree(path, ignore_errors=True)
            if name != "1 store":
                StoreGroup.create(path, 2).close()
            else:
                MessageStore.open(path).close()
            t0 = time.perf_counter()
            df.write.format("rmq").mode("append").save(path)
            took = time.perf_counter() - t0
            best = took if best is None else min(best, took)
        out.append((f"sink, {name}", rows / best))
    for name, path in (("1 store", one), ("2-store group", group)):
        best = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            (spark.read.format("rmq").option("subscribe", "bench").load(path)
             .write.format("noop").mode("overwrite").save())
            took = time.perf_counter() - t0
            best = took if best is None else min(best, took)
        out.append((f"read, {name}", rows / best))
    spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--api", choices=("batch", "table"), nargs="+",
                        default=["batch", "table"])
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="rmq-bench-group-")
    try:
        for api in args.api:
            base = append_case(tmp, 1, 1, args.messages, api)
            print(f"\nappends ({api}, {args.messages:,} messages of 100 bytes, "
                  f"{os.cpu_count()} cores)")
            print(f"  {'writers':>7} {'stores':>6} {'msgs/s':>12} {'x 1 writer, 1 store':>20}")
            print(f"  {1:>7} {1:>6} {base:>12,.0f} {1.0:>20.2f}")
            for processes in (2, 4):
                for stores in (1, processes):
                    rate = append_case(tmp, processes, stores, args.messages, api)
                    print(f"  {processes:>7} {stores:>6} {rate:>12,.0f} {rate / base:>20.2f}")
        if not args.no_spark:
            cases = spark_cases(tmp, args.rows, args.repeat)
            print(f"\nSpark, {args.rows:,} rows, local[2], best of {args.repeat}")
            base = dict(cases)
            for name, rate in cases:
                kind = name.split(",")[0]
                ratio = rate / base[f"{kind}, 1 store"]
                print(f"  {name:<24} {rate:>12,.0f} rows/s {ratio:>6.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
