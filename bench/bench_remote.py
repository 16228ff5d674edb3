"""A store served over Arrow Flight (``rmq serve --listen``, loopback) against the same work on
a local path, in one run.

Run::

    PYTHONPATH=. python bench/bench_remote.py [--messages N] [--repeat R] [--spark]

Two stores of the same shape in one temporary directory: ``local`` is opened in this process;
``served`` is served by ``rmq serve --listen 127.0.0.1:0`` in a process of its own (as in
production, so that the server's Python does not share this one's GIL). Each case runs R
times, alternating local and served, and reports the best of each and the ratio served /
local:

* ``send_table``  N rows (100-byte bodies, a tag, a key, one property) in tables of 100,000
  rows: ``store.producer(g).send_table`` against ``connect(url).producer(g).send_table``
  (target: at least 0.5x);
* ``read_arrow``  every message of the topic read back as Arrow batches: ``StoreReader``
  against ``connect(url).read_batches`` (one Flight stream per queue);
* with ``--spark`` (a ``local[2]`` session): ``spark.read.format("rmq")`` of the whole topic
  into the ``noop`` sink, path against URL (target: at least 0.8x), and the exactly-once sink
  ``df.write.format("rmq")`` of N rows, path against URL (target: at least 0.8x).

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pyarrow as pa  # noqa: E402

from store import MessageStore, StoreReader, connect, server_status  # noqa: E402

TABLE_ROWS = 100_000
TOPIC = "bench"


def make_table(n: int, start: int = 0) -> pa.Table:
    body = bytes(i % 256 for i in range(100))
    return pa.table({
        "body": pa.array([body] * n, pa.binary()),
        "tags": pa.array(["TagA"] * n),
        "keys": pa.array([f"k{i}" for i in range(start, start + n)]),
        "properties": pa.array([[("p", "v")]] * n, pa.map_(pa.string(), pa.string())),
    })


def serve(path: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "rmq_cli.cli", "serve", "--store", path,
                             "--create", "--listen", "127.0.0.1:0", "--log-level", "WARNING"],
                            env=env)
    deadline = time.monotonic() + 120
    while True:
        status = server_status(path)
        if status and status.get("attached") and status.get("pid") == proc.pid \
                and status.get("listen") and status.get("running"):
            return proc, status["listen"]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"rmq serve did not start: {status}")
        time.sleep(0.05)


def send_local(path: str, tables: list[pa.Table]) -> float:
    with MessageStore.open(path) as store:
        producer = store.producer("bench")
        t0 = time.perf_counter()
        for t in tables:
            producer.send_table(t, topic=TOPIC)
        return time.perf_counter() - t0


def send_remote(url: str, tables: list[pa.Table]) -> float:
    with connect(url) as remote:
        producer = remote.producer("bench")
        t0 = time.perf_counter()
        for t in tables:
            producer.send_table(t, topic=TOPIC)
        return time.perf_counter() - t0


def read_local(path: str) -> tuple[float, int]:
    reader = StoreReader.open(path)
    try:
        t0 = time.perf_counter()
        rows = 0
        for q in reader.queue_ids(TOPIC):
            lo, hi = reader.min_offset(TOPIC, q), reader.max_offset(TOPIC, q)
            for start in range(lo, hi, 65_536):
                rows += reader.read_arrow(TOPIC, q, start, min(hi, start + 65_536)).num_rows
        return time.perf_counter() - t0, rows
    finally:
        reader.close()


def read_remote(url: str) -> tuple[float, int]:
    with connect(url) as remote:
        t0 = time.perf_counter()
        rows = 0
        for q in remote.queue_ids(TOPIC):
            for batch in remote.read_batches(TOPIC, q, remote.min_offset(TOPIC, q),
                                             remote.max_offset(TOPIC, q)):
                rows += batch.num_rows
        return time.perf_counter() - t0, rows


def report(name: str, local_s: list[float], served_s: list[float], rows: int,
           target: float | None) -> None:
    best_l, best_s = min(local_s), min(served_s)
    ratio = best_l / best_s
    goal = f"  (target >= {target}x: {'met' if ratio >= target else 'MISSED'})" if target else ""
    print(f"{name:<22} local {rows / best_l:>12,.0f} rows/s   served {rows / best_s:>12,.0f} "
          f"rows/s   served/local {ratio:.2f}x{goal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark", action="store_true")
    args = parser.parse_args()
    n = args.messages
    work = tempfile.mkdtemp(prefix="rmq-bench-remote-")
    proc = None
    try:
        local, served = os.path.join(work, "local"), os.path.join(work, "served")
        MessageStore.open(local).close()
        proc, url = serve(served)
        tables = [make_table(min(TABLE_ROWS, n - lo), lo) for lo in range(0, n, TABLE_ROWS)]
        print(f"{n:,} rows of 100-byte bodies (tag, key, one property); best of "
              f"{args.repeat}; server: rmq serve --listen on loopback, a process of its own")
        sent_l, sent_s = [], []
        for _ in range(args.repeat):
            sent_l.append(send_local(local, tables))
            sent_s.append(send_remote(url, tables))
        report("send_table", sent_l, sent_s, n, 0.5)
        read_l, read_s = [], []
        for _ in range(args.repeat):
            s, rows_l = read_local(local)
            read_l.append(s)
            s, rows_s = read_remote(url)
            read_s.append(s)
        assert rows_l == rows_s, (rows_l, rows_s)
        report("read_arrow (Python)", read_l, read_s, rows_l, None)
        if args.spark:
            spark_cases(work, local, url, n, args.repeat)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def spark_cases(work: str, local: str, url: str, n: int, repeat: int) -> None:
    from rmq_cli.session import local_spark

    spark = local_spark("bench-remote", work, pythonpath=ROOT,
                        extra_conf={"spark.driver.memory": "4g"})
    try:
        with connect(url) as remote:
            rows = sum(remote.max_offset(TOPIC, q) for q in remote.queue_ids(TOPIC))

        def scan(path: str) -> float:
            t0 = time.perf_counter()
            (spark.read.format("rmq").option("subscribe", TOPIC).load(path)
             .write.format("noop").mode("overwrite").save())
            return time.perf_counter() - t0

        scan(local), scan(url)  # warm-up (workers, compiled loops)
        read_l, read_s = [], []
        for _ in range(repeat):
            read_l.append(scan(local))
            read_s.append(scan(url))
        report("spark.read", read_l, read_s, rows, 0.8)

        df = (spark.range(n).selectExpr("'sunk' AS topic",
                                        "CAST(concat('row-', id) AS BINARY) AS body")
              .repartition(2).cache())
        df.count()

        def sink(path: str, k: int) -> float:
            t0 = time.perf_counter()
            (df.write.format("rmq").option("sinkId", f"bench-{k}").mode("append").save(path))
            return time.perf_counter() - t0

        sink(local, -1), sink(url, -1)  # warm-up
        sink_l, sink_s = [], []
        for k in range(repeat):
            sink_l.append(sink(local, k))
            sink_s.append(sink(url, k))
        report("df.write (exactly once)", sink_l, sink_s, n, 0.8)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
