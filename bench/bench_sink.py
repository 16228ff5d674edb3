"""The exactly-once sink against Spark's Parquet writer, and the Python sink against send_table.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_sink.py [--rows N] [--repeat R] [--no-spark] [--no-stream] [--commit-only]

Measures, in one run and one directory (2 Spark partitions, ``local[2]``):

* ``df.write.parquet``            the rows (``topic``, 100-byte ``body``, ``tags``, ``keys``)
  written as Parquet: the baseline;
* ``no-op Python sink``           a Python data source writer (``DataSourceArrowWriter``)
  that only counts the Arrow batches Spark hands it: the ceiling of any Python sink;
* ``Python sink writing the batches to a file``: the same writer, but each task writes the
  batches it gets to a file (an Arrow IPC stream) and fsyncs it (and once without the
  fsync): the ceiling of a Python sink that keeps every row once, durably;
* ``df.write.format("rmq")``      the same rows through the exactly-once sink (tasks stage,
  the driver commits);
* ``... guarantee=at_least_once`` the same rows appended directly by the tasks;
* ``writeStream.parquet`` and ``writeStream.format("rmq")``: the rows as a stream of 10 JSON
  files, one file per micro-batch (``Trigger.AvailableNow``), into Parquet and into the sink
  at the default exactly-once setting (rows/s over the whole query, JSON parsing included);

* ``... sinkCommit=copy``        the exactly-once sink with the copying commit;

and, without Spark, ``Sink.stage`` + ``Sink.commit`` (by index and by copy) against
``send_table`` of the same table, and the driver's part alone: ``Sink.commit`` of
``--commit-rows`` staged rows (best of ``--repeat``; into a fresh store, where the commit
creates the topics, and into a store whose topics exist), beside one ``fsync`` of a 4 KiB
file.
A store whose sink has no ``commit`` parameter (an older tree run as the baseline, see
below) skips the copy cases.

Baseline: copy this file into another tree (``cp bench/bench_sink.py /old/tree/bench/``) and
run it there: it measures that tree's code (its root is the file's folder's parent).
The DataFrame is cached and counted first, so every writer reads the same in-memory rows.
The Spark cases run in ``--repeat`` rounds, every case once per round (in turns), and
each reports its best and its median; the Python cases the best of ``--repeat``.  Not
collected by pytest.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pyarrow as pa  # noqa: E402

_NoopSink = _FileSink = None

from store import MessageStore  # noqa: E402


def _has_commit_modes() -> bool:
    return "commit" in inspect.signature(MessageStore.sink).parameters


def _sink(store, commit: str | None):
    return store.sink("bench") if commit is None else store.sink("bench", commit=commit)


def _table(n: int) -> pa.Table:
    body = bytes(i % 256 for i in range(100))
    return pa.table({"topic": ["bench"] * n, "body": [body] * n, "tags": ["TagA"] * n,
                     "keys": [f"k{i}" for i in range(n)]})


def python_cases(tmp: str, n: int, repeat: int) -> list[tuple[str, float]]:
    table = _table(n)
    modes = [("sink stage+commit", None)]
    if _has_commit_modes():
        modes = [("sink stage+commit (index)", "index"), ("sink stage+commit (copy)", "copy")]
    out = []
    for name, commit in [("send_table", None), *modes]:
        best = None
        for r in range(repeat):
            path = os.path.join(tmp, f"py-{len(out)}-{r}")
            with MessageStore.open(path) as store:
                t0 = time.perf_counter()
                if name == "send_table":
                    store.producer().send_table(table)
                else:
                    sink = _sink(store, commit)
                    sink.commit(0, sink.stage(table))
                elapsed = time.perf_counter() - t0
            shutil.rmtree(path)
            best = elapsed if best is None else min(best, elapsed)
        out.append((name, best))
    return out


def commit_cases(tmp: str, n: int, repeat: int) -> list[tuple[str, float]]:
    """The driver's part: ``Sink.commit`` of ``n`` rows staged before (best of ``repeat``),
    into a fresh store (the commit creates the topics) and into one whose topics a small
    batch created (a later batch's commit), and one fsync of a small file written just
    before (what "+ one fsync" stands for)."""
    table = _table(n)
    out = []
    for commit in (["index", "copy"] if _has_commit_modes() else [None]):
        for warm in (False, True):
            best = None
            for r in range(repeat):
                path = os.path.join(tmp, f"commit-{commit}-{warm}-{r}")
                with MessageStore.open(path) as store:
                    sink = _sink(store, commit)
                    if warm:
                        sink.commit(1 << 20, sink.stage(_table(100)))
                    staged = sink.stage(table)
                    t0 = time.perf_counter()
                    done = sink.commit(0, staged)
                    elapsed = time.perf_counter() - t0
                    assert done.rows == n
                shutil.rmtree(path)
                best = elapsed if best is None else min(best, elapsed)
            where = "topics exist" if warm else "fresh store"
            out.append((f"Sink.commit ({commit or 'default'}), {where}", best))
    fsyncs = []
    for _ in range(repeat):
        name = os.path.join(tmp, "fsync-probe")
        with open(name, "wb") as fh:
            fh.write(os.urandom(4096))
            fh.flush()
            t0 = time.perf_counter()
            os.fsync(fh.fileno())
            fsyncs.append(time.perf_counter() - t0)
    out.append(("one fsync of a 4 KiB file", min(fsyncs)))
    return out


def _noop_classes():
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Counted(WriterCommitMessage):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Writer(DataSourceArrowWriter):
        def write(self, iterator):
            return Counted(sum(b.num_rows for b in iterator))

        def commit(self, messages) -> None:
            pass

    class NoopSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rmq-bench-noop"

        def writer(self, schema, overwrite):
            return Writer()

    class FileWriter(DataSourceArrowWriter):
        """Writes the batches it gets to a file as an Arrow IPC stream, then fsyncs it: the
        ceiling of a Python sink that keeps every row once, durably."""

        def __init__(self, path: str, sync: bool) -> None:
            self.path = path
            self.sync = sync

        def write(self, iterator):
            import uuid
            import pyarrow as pa
            rows = 0
            os.makedirs(self.path, exist_ok=True)
            name = os.path.join(self.path, uuid.uuid4().hex)
            with open(name, "wb") as fh:
                writer = None
                for batch in iterator:
                    if writer is None:
                        writer = pa.ipc.new_stream(fh, batch.schema)
                    writer.write_batch(batch)
                    rows += batch.num_rows
                if writer is not None:
                    writer.close()
                fh.flush()
                if self.sync:
                    os.fsync(fh.fileno())
            return Counted(rows)

        def commit(self, messages) -> None:
            pass

    class FileSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rmq-bench-file"

        def writer(self, schema, overwrite):
            return FileWriter(self.options["path"], self.options.get("sync", "true") == "true")

    return NoopSink, FileSink


def spark_cases(tmp: str, n: int, repeat: int, streaming: bool = True
                ) -> list[tuple[str, float, float]]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = ROOT
    from pyspark.sql import SparkSession

    global _NoopSink, _FileSink
    _NoopSink, _FileSink = _noop_classes()

    spark = (SparkSession.builder.master("local[2]").appName("bench-sink")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.sql(f"""SELECT 'bench' AS topic,
                              unhex(repeat('0102030405060708090A', 10)) AS body,
                              'TagA' AS tags, concat('k', id) AS keys
                       FROM range({n})""").repartition(2).cache()
    df.count()
    spark.dataSource.register(_NoopSink)
    spark.dataSource.register(_FileSink)
    # warm both writers once (Python workers, the store's first open)
    df.limit(1000).write.mode("overwrite").parquet(os.path.join(tmp, "warm.parquet"))
    df.limit(1000).write.format("rmq").mode("append").save(os.path.join(tmp, "warm-store"))
    df.limit(1000).write.format("rmq-bench-noop").mode("append").save()
    cases = {
        "df.write.parquet": lambda p: df.write.mode("overwrite").parquet(p),
        "no-op Python sink (ceiling)": lambda p: df.write.format("rmq-bench-noop").mode(
            "append").save(),
        "Python sink writing the batches to a file, fsync": lambda p: df.write.format(
            "rmq-bench-file").mode("append").save(p),
        "Python sink writing the batches to a file, no fsync": lambda p: df.write.format(
            "rmq-bench-file").option("sync", "false").mode("append").save(p),
        'df.write.format("rmq")': lambda p: df.write.format("rmq").mode("append").save(p),
        'df.write.format("rmq") at_least_once': lambda p: df.write.format("rmq").option(
            "guarantee", "at_least_once").mode("append").save(p),
    }
    if _has_commit_modes():
        cases['df.write.format("rmq") sinkCommit=copy'] = lambda p: df.write.format(
            "rmq").option("sinkCommit", "copy").mode("append").save(p)
    # in turns (every case once per round), so that a slow spell of the machine does not
    # fall on one case only; each case's best and median
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(repeat):
        for k, (name, run) in enumerate(cases.items()):
            path = os.path.join(tmp, f"spark-{k}-{r}")
            t0 = time.perf_counter()
            run(path)
            times[name].append(time.perf_counter() - t0)
            shutil.rmtree(path, ignore_errors=True)
    out = [(name, min(t), statistics.median(t)) for name, t in times.items()]
    if not streaming:
        spark.stop()
        return out
    # streaming: 10 JSON files, one per micro-batch, exactly once
    src, store, ckpt = (os.path.join(tmp, x) for x in ("stream-in", "stream-store", "ckpt"))
    os.makedirs(src)
    per = n // 10
    for f in range(10):
        with open(os.path.join(src, f"{f:02d}.json"), "w") as fh:
            fh.write("\n".join(json.dumps({"topic": "bench", "body": "x" * 100, "tags": "TagA",
                                           "keys": f"k{f}-{i}"}) for i in range(per)))
    def stream():
        return (spark.readStream.schema("topic string, body string, tags string, keys string")
                .option("maxFilesPerTrigger", 1).json(src))

    t0 = time.perf_counter()
    q = (stream().writeStream.format("parquet").option("checkpointLocation", ckpt + "-pq")
         .trigger(availableNow=True).start(os.path.join(tmp, "stream.parquet")))
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    out.append(("writeStream.parquet (10 batches)", elapsed, elapsed))
    t0 = time.perf_counter()
    q = (stream().writeStream.format("rmq").option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start(store))
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    out.append(('writeStream.format("rmq") (10 batches)', elapsed, elapsed))
    with MessageStore.open(store) as s:
        assert sum(s.max_offset("bench", q) for q in s.queue_ids("bench")) == per * 10
    spark.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--python-rows", type=int, default=200_000)
    ap.add_argument("--commit-rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--no-stream", action="store_true", help="skip the streaming cases")
    ap.add_argument("--commit-only", action="store_true",
                    help="only the driver's commit (no Python stage+commit, no Spark)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-sink-")
    try:
        if not args.commit_only:
            py = python_cases(tmp, args.python_rows, args.repeat)
            base = py[0][1]
            print(f"\nPython, {args.python_rows:,} rows of 100-byte bodies (best of "
                  f"{args.repeat})")
            print(f"{'case':<40} {'s':>8} {'rows/s':>12} {'vs send_table':>14}")
            for name, s in py:
                print(f"{name:<40} {s:8.3f} {args.python_rows / s:12,.0f} {base / s:13.2f}x")
        print(f"\nThe driver's commit of {args.commit_rows:,} staged rows (best of "
              f"{args.repeat})")
        for name, s in commit_cases(tmp, args.commit_rows, args.repeat):
            print(f"{name:<44} {s:8.3f} s")
        if not args.no_spark and not args.commit_only:
            sp = spark_cases(tmp, args.rows, args.repeat, not args.no_stream)
            print(f"\nSpark local[2], {args.rows:,} rows ({args.repeat} rounds in turns; "
                  "ratios of the best and of the median; streaming once)")
            print(f"{'case':<52} {'best s':>7} {'median':>7} {'rows/s':>11} "
                  f"{'vs parquet':>11} {'vs no-op':>15}")
            for name, best, median in sp:
                print(f"{name:<52} {best:7.3f} {median:7.3f} {args.rows / best:11,.0f} "
                      f"{sp[0][1] / best:10.2f}x {sp[1][1] / best:6.2f}x / "
                      f"{sp[1][2] / median:.2f}x")
            by = {name: (best, median) for name, best, median in sp}
            exactly, least = by['df.write.format("rmq")'], by['df.write.format("rmq") '
                                                               'at_least_once']
            durable = by["Python sink writing the batches to a file, fsync"]
            print("targets (best / median): exactly once vs at least once "
                  f"{least[0] / exactly[0]:.2f}x / {least[1] / exactly[1]:.2f}x (>= 0.9); "
                  f"at least once vs the durable file sink {durable[0] / least[0]:.2f}x / "
                  f"{durable[1] / least[1]:.2f}x (>= 0.6)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
