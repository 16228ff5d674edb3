"""Append throughput of the store against a raw sequential write of the same bytes.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_append.py [--messages N] [--batch-size B]

Measures, in one run and one directory:

* ``raw write``   the exact CommitLog bytes the batch run produced, written again with
  ``os.write`` in 1 MiB chunks to a fresh file in the same directory (the baseline);
* ``raw write per record``  the same bytes, one ``os.write`` per record (a second baseline:
  what a naive one-write-per-message log costs);
* ``send_batch``  ``Producer.send_batch`` of ``B`` 100-byte messages at a time (ASYNC_FLUSH);
* ``send_table``  ``Producer.send_table`` of the same messages as one Arrow table, and of
  ``--table-messages`` rows of the same shape (2M by default, against a raw write of that
  run's own CommitLog bytes);
* ``send``        ``Producer.send`` one 100-byte message at a time (ASYNC_FLUSH), and the
  same sends through the general path (a ``Message`` subclass: a ``RecordSpec`` per send), the
  baseline of the single-record path; both again for messages with a body only, each
  ``Message`` built inside the timed loop, plain and with ``delay_ms=60000`` (timer);

and prints messages/s, MB/s and each ratio against both raw writes (bytes per second of the
same record bytes).  Every message has a tag, a key and one user property, so the records
look like real traffic.  Each case runs ``--repeat`` times and reports its best run (the
machine's other writers make single runs noisy).  Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from store import Message, MessageStore, StoreConfig  # noqa: E402

BODY_BYTES = 100  # --body-bytes changes it
CHUNK = 1024 * 1024


class GeneralPathMessage(Message):
    """A ``Message`` subclass: ``Producer.send`` takes its general path for it (the path
    every send took before the single-record path)."""


def make_messages(n: int, topic: str = "bench", body_bytes: int = BODY_BYTES) -> list[Message]:
    body = bytes(i % 256 for i in range(body_bytes))
    return [Message(topic, body, tags="TagA", keys=f"k{i}", properties={"p": "v"})
            for i in range(n)]


def run_batch(path: str, messages: list[Message], batch_size: int) -> tuple[float, int]:
    """Seconds to ``send_batch`` every message, and the CommitLog bytes written."""
    with MessageStore.open(path, StoreConfig()) as store:
        producer = store.producer("bench")
        producer.send_batch(messages[:1])  # create the topic and the first segment
        t0 = time.perf_counter()
        for i in range(1, len(messages), batch_size):
            producer.send_batch(messages[i:i + batch_size])
        elapsed = time.perf_counter() - t0
        return elapsed, store.confirmed_offset()


def message_table(messages: list[Message]):
    """The messages as the Arrow table ``send_table`` takes (built before the clock starts)."""
    import pyarrow as pa

    return pa.table({
        "topic": [m.topic for m in messages], "body": [m.body for m in messages],
        "tags": [m.tags for m in messages], "keys": [m.keys for m in messages],
        "properties": pa.array([list(m.properties.items()) for m in messages],
                               pa.map_(pa.string(), pa.string()))})


def run_table(path: str, table) -> tuple[float, int]:
    """Seconds to ``send_table`` the whole table, and the CommitLog bytes written."""
    with MessageStore.open(path, StoreConfig()) as store:
        producer = store.producer("bench")
        producer.send_table(table.slice(0, 1))  # create the topic and the first segment
        t0 = time.perf_counter()
        producer.send_table(table.slice(1))
        elapsed = time.perf_counter() - t0
        return elapsed, store.confirmed_offset()


def large_table(n: int, body_bytes: int = BODY_BYTES):
    """``n`` rows shaped as :func:`make_messages` makes them, built as columns directly (no
    ``Message`` objects: the issue's 2M-row case)."""
    import numpy as np
    import pyarrow as pa

    body = bytes(i % 256 for i in range(body_bytes))
    bodies = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
        np.arange(0, (n + 1) * body_bytes, body_bytes, dtype=np.int32)), pa.py_buffer(body * n)])
    keys = pa.array([f"k{i}" for i in range(n)], pa.string())
    props = pa.MapArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)),
                                    pa.array(["p"] * n), pa.array(["v"] * n))
    return pa.table({"topic": pa.array(["bench"] * n), "body": bodies,
                     "tags": pa.array(["TagA"] * n), "keys": keys, "properties": props})


def run_single(path: str, messages: list[Message], general: bool = False) -> tuple[float, int]:
    """Seconds to ``send`` every message one at a time, and the CommitLog bytes written.

    ``general``: through the general path of every send (a subclass of ``Message`` takes it:
    a ``RecordSpec`` through ``StoreCore.append``), the same-run baseline of the
    single-record path.
    """
    if general:
        messages = [GeneralPathMessage(m.topic, m.body, m.tags, m.keys, m.properties, m.flag)
                    for m in messages]
    with MessageStore.open(path, StoreConfig()) as store:
        producer = store.producer("bench")
        producer.send(messages[0])
        t0 = time.perf_counter()
        for m in messages[1:]:
            producer.send(m)
        elapsed = time.perf_counter() - t0
        return elapsed, store.confirmed_offset()


def run_single_plain(path: str, n: int, body_bytes: int, general: bool = False,
                     delay_ms: int | None = None):
    """:func:`run_single` of ``n`` messages with a body only (no tag, key or property),
    each ``Message`` built inside the timed loop, as an application does; with
    ``delay_ms``, timer messages due that long after their send."""
    body = bytes(i % 256 for i in range(body_bytes))
    with MessageStore.open(path, StoreConfig()) as store:
        producer = store.producer("bench")
        make = GeneralPathMessage if general else Message
        producer.send(make("bench", body), delay_ms=delay_ms)
        t0 = time.perf_counter()
        for _ in range(n - 1):
            producer.send(make("bench", body), delay_ms=delay_ms)
        elapsed = time.perf_counter() - t0
        return elapsed, store.confirmed_offset()


def commitlog_bytes(path: str, length: int) -> bytes:
    """The first ``length`` bytes of the CommitLog (one segment at these sizes)."""
    seg = os.path.join(path, "commitlog", "0" * 20)
    with open(seg, "rb") as fh:
        return fh.read(length)


def record_views(data: bytes) -> list[memoryview]:
    """The records of ``data`` (which starts at a record), following TOTALSIZE."""
    view = memoryview(data)
    out, pos = [], 0
    while pos + 4 <= len(data):
        size = struct.unpack_from(">i", data, pos)[0]
        if size <= 0:
            break
        out.append(view[pos:pos + size])
        pos += size
    return out


def run_raw(directory: str, chunks: list, repeat: int) -> float:
    """Best seconds of ``repeat`` runs writing ``chunks`` with one ``os.write`` each."""
    best = float("inf")
    for r in range(repeat):
        target = os.path.join(directory, f"raw-{r}")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            t0 = time.perf_counter()
            for chunk in chunks:
                os.write(fd, chunk)
            best = min(best, time.perf_counter() - t0)
        finally:
            os.close(fd)
            os.unlink(target)
    return best


def best_of(repeat: int, base: str, name: str, fn, *args) -> tuple[float, int]:
    """Best (seconds, bytes) of ``repeat`` runs of ``fn(path, *args)``, each in a fresh store."""
    best = (float("inf"), 0)
    for r in range(repeat):
        path = os.path.join(base, f"{name}-{r}")
        best = min(best, fn(path, *args))
        if r < repeat - 1:
            shutil.rmtree(path, ignore_errors=True)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000, help="messages for send_batch")
    ap.add_argument("--single", type=int, default=20_000, help="messages for send")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--body-bytes", type=int, default=BODY_BYTES)
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (best reported)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp directory)")
    ap.add_argument("--table-messages", type=int, default=2_000_000,
                    help="rows for the large send_table case (0: skip it)")
    args = ap.parse_args()

    base = tempfile.mkdtemp(prefix="rmq-bench-", dir=args.dir)
    try:
        messages = make_messages(args.messages, body_bytes=args.body_bytes)
        batch_s, batch_bytes = best_of(args.repeat, base, "batch", run_batch, messages,
                                       args.batch_size)
        data = commitlog_bytes(os.path.join(base, f"batch-{args.repeat - 1}"), batch_bytes)
        view = memoryview(data)
        raw_s = run_raw(base, [view[i:i + CHUNK] for i in range(0, len(data), CHUNK)],
                        args.repeat)
        records = record_views(data)
        assert len(records) == args.messages, (len(records), args.messages)
        raw_record_s = run_raw(base, records, args.repeat)
        single_s, single_bytes = best_of(args.repeat, base, "single", run_single,
                                         messages[:args.single])
        general_s, _ = best_of(args.repeat, base, "general", run_single,
                               messages[:args.single], True)
        plain_s, plain_bytes = best_of(args.repeat, base, "plain", run_single_plain,
                                       args.single, args.body_bytes)
        plain_general_s, _ = best_of(args.repeat, base, "plain-general", run_single_plain,
                                     args.single, args.body_bytes, True)
        timer_s, timer_bytes = best_of(args.repeat, base, "timer", run_single_plain,
                                       args.single, args.body_bytes, False, 60_000)
        timer_general_s, _ = best_of(args.repeat, base, "timer-general", run_single_plain,
                                     args.single, args.body_bytes, True, 60_000)
        table_s, table_bytes = best_of(args.repeat, base, "table", run_table,
                                       message_table(messages))
        assert table_bytes == batch_bytes, (table_bytes, batch_bytes)  # the same records
        large = None
        if args.table_messages:  # the case: 2M rows, against a raw write of its bytes
            big = large_table(args.table_messages, args.body_bytes)
            big_s, big_bytes = best_of(args.repeat, base, "big", run_table, big)
            del big
            big_data = commitlog_bytes(os.path.join(base, f"big-{args.repeat - 1}"), big_bytes)
            big_view = memoryview(big_data)
            big_raw_s = run_raw(base, [big_view[i:i + CHUNK]
                                       for i in range(0, len(big_data), CHUNK)], args.repeat)
            del big_view, big_data
            large = (args.table_messages - 1, big_s, big_raw_s, big_bytes)
        per_msg = batch_bytes / args.messages
        raw_rate = batch_bytes / raw_s
        raw_record_rate = batch_bytes / raw_record_s
        n_batch, n_single = args.messages - 1, args.single - 1
        rows = [
            ("raw write, 1 MiB chunks", args.messages / raw_s, raw_rate),
            ("raw write, 1 per record", args.messages / raw_record_s, raw_record_rate),
            (f"send_batch ({args.batch_size}/batch)", n_batch / batch_s,
             n_batch * per_msg / batch_s),
            ("send_table (columnar)", n_batch / table_s, n_batch * per_msg / table_s),
            ("send (one at a time)", n_single / single_s,
             n_single * (single_bytes / args.single) / single_s),
            ("  same, general path", n_single / general_s,
             n_single * (single_bytes / args.single) / general_s),
            ("send, body only", n_single / plain_s,
             n_single * (plain_bytes / args.single) / plain_s),
            ("  same, general path", n_single / plain_general_s,
             n_single * (plain_bytes / args.single) / plain_general_s),
            ("send(delay_ms=60000)", n_single / timer_s,
             n_single * (timer_bytes / args.single) / timer_s),
            ("  same, general path", n_single / timer_general_s,
             n_single * (timer_bytes / args.single) / timer_general_s),
        ]
        print(f"{args.messages} messages of {args.body_bytes}-byte bodies, {per_msg:.0f} bytes per "
              f"record; best of {args.repeat}; python {sys.version.split()[0]}")
        print(f"{'case':<28}{'msgs/s':>13}{'MB/s':>9}{'vs raw chunks':>15}{'vs raw/record':>15}")
        for name, msgs, bps in rows:
            print(f"{name:<28}{msgs:>13,.0f}{bps / 1e6:>9.1f}{bps / raw_rate:>15.3f}"
                  f"{bps / raw_record_rate:>15.3f}")
        if large is not None:
            n_big, big_s, big_raw_s, big_bytes = large
            print(f"send_table of {n_big + 1:,} rows: {n_big / big_s:,.0f} msgs/s; raw write of "
                  f"its {big_bytes / 1e6:,.0f} MB in 1 MiB chunks: {(n_big + 1) / big_raw_s:,.0f} "
                  f"records/s; ratio {(n_big / (n_big + 1)) * big_raw_s / big_s:.3f}x")
        print(f"single-record path vs general path: {general_s / single_s:.2f}x (tag, key, "
              f"property), {plain_general_s / plain_s:.2f}x (body only), "
              f"{timer_general_s / timer_s:.2f}x (timer, body only)")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
