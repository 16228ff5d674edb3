"""Replace by key: replaces and cancels per second in batches, and the memory per pending key,
against ``send_table`` of the same rows without keys, in one run.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_delay_keys.py [--keys N] [--batch B]

With ``N`` (1,000,000) keys, batches of ``B`` (100,000) rows of 100-byte bodies:

* ``baseline``: ``send_table`` of the rows with a ``delay_ms`` (timer messages, no key);
* ``first``: ``replace_table`` of every key once (each key new to the table);
* ``replace``: ``replace_table`` of every key again (each row replaces a pending message);
* ``cancel``: ``cancel_keys`` of every key;
* ``deliver``: ``deliver_due()`` once every message is due: the keyed ones that were
  replaced and cancelled are dropped, none surfaces.

``replace_table`` applies its rows to the key table before it returns, so its rate includes
that.  Memory: the process's anonymous resident memory (``RssAnon``, the heap) before the
first keyed batch and after the last, and the ``timerkeys`` file's size (file-backed pages
the kernel can drop, like the CommitLog's).  Not collected by pytest.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from store import MessageStore, StoreConfig  # noqa: E402

T0 = 1_790_000_000_000


def rss_mb(field: str = "RssAnon") -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rows(keys: pa.Array | None, n: int, delay: int, topic: str) -> pa.Table:
    cols = {"topic": pa.array([topic] * n), "body": pa.array([b"x" * 100] * n, pa.binary()),
            "delay_ms": pa.array(np.full(n, delay, np.int64))}
    if keys is not None:
        cols["key"] = keys
    return pa.table(cols)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=100_000)
    args = ap.parse_args()
    n, b = args.keys, args.batch
    work = tempfile.mkdtemp(prefix="rmq-bench-keys-")
    now = [T0]
    cfg = StoreConfig(commitlog_file_size_bytes=1 << 30)
    try:
        with MessageStore.open(os.path.join(work, "s"), cfg, clock=lambda: now[0],
                               flush_service=False) as store:
            p = store.producer("bench")
            names = [pa.array([f"order-{i:09d}" for i in range(lo, min(n, lo + b))])
                     for lo in range(0, n, b)]
            # warm: the compiled loops and the table's first file
            p.replace_table(rows(pa.array(["warm"]), 1, 3_600_000, "reminders"))
            p.cancel_keys(["warm"])
            t = time.perf_counter()
            for k in names:
                p.send_table(rows(None, len(k), 3_600_000, "plain"))
            base = n / (time.perf_counter() - t)
            gc.collect()
            before, file_before = rss_mb(), rss_mb("RssFile")
            figures = {}
            for phase, delay in (("first", 3_600_000), ("replace", 3_500_000)):
                t = time.perf_counter()
                for k in names:
                    p.replace_table(rows(k, len(k), delay, "reminders"))
                figures[phase] = n / (time.perf_counter() - t)
            t = time.perf_counter()
            cancelled = 0
            for k in names:
                cancelled += int(p.cancel_keys(k).sum())
            figures["cancel"] = n / (time.perf_counter() - t)
            gc.collect()
            after, file_after = rss_mb(), rss_mb("RssFile")
            table_mb = os.path.getsize(os.path.join(store.root, "timerkeys")) / 2**20
            now[0] += 3_700_000
            t = time.perf_counter()
            delivered = store.deliver_due()
            deliver_s = time.perf_counter() - t
        print(f"keys {n:,}, batches of {b:,}, 100-byte bodies")
        print(f"baseline send_table (delayed, no key): {base:,.0f} rows/s")
        for phase, rate in figures.items():
            print(f"{phase:>8}: {rate:,.0f} /s  ({rate / base:.2f}x the baseline)")
        print(f"cancelled {cancelled:,}; deliver_due: {delivered:,} delivered "
              f"(the {n:,} plain ones; {2 * n:,} keyed dropped) in {deliver_s:.2f} s")
        print(f"heap (RssAnon): {before:,.0f} MB before the keyed batches, {after:,.0f} MB "
              f"after: +{after - before:,.0f} MB for {n:,} keys; timerkeys file "
              f"{table_mb:,.0f} MB ({table_mb * 2**20 / n:.0f} bytes per key); file-backed "
              f"resident pages (RssFile) {file_before:,.0f} -> {file_after:,.0f} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
