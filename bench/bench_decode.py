"""Decode throughput: ``read_queue_batch`` (vectorised, Arrow) against per-record Python.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_decode.py [--messages N] [--shape S]

Writes ``N`` (2,000,000) messages with 100-byte bodies into a fresh store with 1 GiB CommitLog
segments (``send_batch`` in chunks of 10,000, so queues take turns by chunk), then measures:

* ``vectorised``  :func:`store.arrow_decode.read_queue_batch` over every queue in
  65,536-row chunks (what the Spark source yields), all ``N`` rows;
* ``numpy ref``   the same by the NumPy reference path (the compiled record checks and
  gather of :mod:`store.kernels.message_decode` switched off);
* ``vec+crc``     the same with ``verify_crc=True`` (every body's CRC recomputed);
* ``verify log``  ``store.verify_commitlog()`` (``rmq stats --verify``) over the whole log;
* ``pull``        the per-record baseline: ``store.pull`` (``decode_record`` and
  ``record_view`` per message) over the first ``--baseline`` rows of queue 0;
* ``pull+arrow``  the same plus ``pa.RecordBatch.from_pylist`` into the same schema (what a
  reader built on ``pull`` would have to do to hand Spark a batch).

Rows/s is reported for wall time and for the process's CPU time (the CPU figure is the
steadier one when other processes share the machine); each case keeps its best of
``--repeat`` runs, and the ratios compare rates measured in this run.  ``--shape`` picks the
records: ``plain`` (body only; the producer adds ``UNIQ_KEY``), ``rich`` (plus a tag, a key
and one user property), or ``both``.  Not collected by pytest.
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

import pyarrow as pa

from store import Message, MessageStore, StoreConfig, keep_freed_heap
from store.core import arrow_decode
from store.core.arrow_decode import MESSAGE_SCHEMA, read_queue_batch

TOPIC = "bench"
BODY_BYTES = 100
WRITE_CHUNK = 10_000
READ_CHUNK = 65_536


def write_store(path: str, n: int, shape: str) -> None:
    body = bytes(i % 256 for i in range(BODY_BYTES))
    with MessageStore.open(path, StoreConfig(), flush_service=False) as store:
        producer = store.producer("bench")
        for start in range(0, n, WRITE_CHUNK):
            ids = range(start, min(n, start + WRITE_CHUNK))
            if shape == "rich":
                batch = [Message(TOPIC, body, tags=f"tag{i % 8}", keys=f"order-{i}",
                                 properties={"region": "eu"}) for i in ids]
            else:
                batch = [Message(TOPIC, body) for _ in ids]
            producer.send_batch(batch)


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """Best wall and best CPU seconds of ``repeat`` runs of ``fn``, and its last result."""
    best_wall = best_cpu = float("inf")
    result = None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    return best_wall, best_cpu, result


def decode_all(store: MessageStore, verify_crc: bool = False) -> int:
    rows = 0
    for qid in store.queue_ids(TOPIC):
        end = store.max_offset(TOPIC, qid)
        for start in range(store.min_offset(TOPIC, qid), end, READ_CHUNK):
            rows += read_queue_batch(store, TOPIC, qid, start, min(end, start + READ_CHUNK),
                                     verify_crc=verify_crc).num_rows
    return rows


def decode_all_reference(store: MessageStore) -> int:
    """:func:`decode_all` by the NumPy reference path (the compiled record checks and gather
    switched off), the decode before they came."""
    real = arrow_decode.check_records, arrow_decode._gather
    arrow_decode.check_records = lambda *args: 0
    arrow_decode._gather = lambda *args: None
    try:
        return decode_all(store)
    finally:
        arrow_decode.check_records, arrow_decode._gather = real


def pull_rows(store: MessageStore, n: int) -> list:
    views = []
    while len(views) < n:
        views += store.pull(TOPIC, 0, len(views), max_messages=min(1024, n - len(views)))
    return views


def pull_to_arrow(store: MessageStore, n: int) -> pa.RecordBatch:
    rows = [{"topic": v.topic, "queue_id": v.queue_id, "queue_offset": v.queue_offset,
             "commitlog_offset": v.commitlog_offset, "msg_id": v.msg_id, "tags": v.tags,
             "keys": list(v.keys), "body": v.body, "properties": list(v.properties.items()),
             "born_timestamp": v.born_timestamp_ms * 1000,
             "store_timestamp": v.store_timestamp_ms * 1000,
             "deliver_timestamp": None if v.deliver_timestamp_ms is None
             else v.deliver_timestamp_ms * 1000,
             "transaction_id": v.transaction_id, "reconsume_times": v.reconsume_times}
            for v in pull_rows(store, n)]
    return pa.RecordBatch.from_pylist(rows, schema=MESSAGE_SCHEMA)


def bench_shape(shape: str, args) -> None:
    root = tempfile.mkdtemp(prefix=f"rmq-bench-decode-{shape}-", dir=args.dir)
    path = os.path.join(root, "store")
    try:
        t0 = time.perf_counter()
        write_store(path, args.messages, shape)
        print(f"\n[{shape}] wrote {args.messages:,} messages in {time.perf_counter() - t0:.1f} s")
        with MessageStore.open(path, read_only=True) as store:
            sample = min(args.baseline, store.max_offset(TOPIC, 0))
            # the two paths agree on what they decode (one chunk, checked before timing)
            expected = pull_to_arrow(store, min(sample, 2000))
            got = read_queue_batch(store, TOPIC, 0, 0, expected.num_rows)
            assert got.equals(expected), "vectorised decode differs from pull"
            vec_wall, vec_cpu, rows = timed(lambda: decode_all(store), args.repeat)
            assert rows == args.messages, (rows, args.messages)
            ref_wall, ref_cpu, _ = timed(lambda: decode_all_reference(store), args.repeat)
            crc_wall, crc_cpu, _ = timed(lambda: decode_all(store, True), args.repeat)
            ver_wall, ver_cpu, report = timed(store.verify_commitlog, args.repeat)
            assert report.ok and report.records == args.messages
            pull_wall, pull_cpu, _ = timed(lambda: pull_rows(store, sample), args.repeat)
            arrow_wall, arrow_cpu, _ = timed(lambda: pull_to_arrow(store, sample), args.repeat)
        results = [("vectorised", rows, vec_wall, vec_cpu),
                   ("numpy ref", rows, ref_wall, ref_cpu),
                   ("vec+crc", rows, crc_wall, crc_cpu),
                   ("verify log", report.records, ver_wall, ver_cpu),
                   ("pull", sample, pull_wall, pull_cpu),
                   ("pull+arrow", sample, arrow_wall, arrow_cpu)]
        base_wall, base_cpu = sample / pull_wall, sample / pull_cpu
        print(f"{'case':<12}{'rows':>11}{'rows/s wall':>14}{'rows/s cpu':>14}"
              f"{'x pull (wall)':>15}{'x pull (cpu)':>14}")
        for name, n, wall, cpu in results:
            print(f"{name:<12}{n:>11,}{n / wall:>14,.0f}{n / cpu:>14,.0f}"
                  f"{n / wall / base_wall:>15.1f}{n / cpu / base_cpu:>14.1f}")
        print(f"compiled decode vs the NumPy reference: {ref_cpu / vec_cpu:.2f}x the rows/s "
              f"(cpu; {ref_wall / vec_wall:.2f}x wall), "
              f"{vec_cpu / rows * 1e6:.3f} vs {ref_cpu / rows * 1e6:.3f} us/row")
        print(f"verify_crc=True reads at {vec_cpu / crc_cpu:.2f}x the rows/s of plain reads "
              f"(cpu; {vec_wall / crc_wall:.2f}x wall); verify_commitlog checks "
              f"{report.bytes_checked / ver_wall / 1e6:,.0f} MB/s of CommitLog (wall)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    keep_freed_heap()  # as the rmq source's Spark tasks do
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--baseline", type=int, default=100_000,
                        help="rows of queue 0 decoded by the per-record baselines")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shape", choices=("plain", "rich", "both"), default="both")
    parser.add_argument("--dir", default=None, help="where the temporary store goes")
    args = parser.parse_args()
    for shape in (("plain", "rich") if args.shape == "both" else (args.shape,)):
        bench_shape(shape, args)


if __name__ == "__main__":
    main()
