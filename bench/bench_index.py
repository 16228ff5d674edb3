"""What the message-key index costs sends, and how fast a key is found.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_index.py [--messages N] [--query-messages M]

Measures, in one run:

* ``send_table``, ``send_batch`` (``--batch-size`` messages a call) and ``send`` (one
  message a call) of ``--messages`` 100-byte messages, each with a tag, a key, a user
  property and its unique key, in a fresh store with ``message_index_enable`` on and off
  (the runs alternate, best of ``--repeat``), and prints each ratio on / off (the issue's
  bound: at most 1.10 for ``send_table`` and ``send_batch``).  The index is built behind
  the sends by the store's builder thread: the first figure is what the sender waits, the
  second ("+ index") adds the wait, after the last send, until the index holds every
  message (the builder's whole cost, with none of it left behind); the third ("CPU") is the
  process's CPU seconds over that time, every thread's (what the index costs a busy host);
* ``query_messages``: a store of ``--query-messages`` messages in one topic, written with
  ``send_table``, where each key is carried by 10 messages spread over the whole log; the
  time of ``store.query_messages(topic, key=K)`` for ``--queries`` random keys (fresh
  process state: the index files and records are mapped, not read ahead), median and worst.

Not collected by pytest.
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

import numpy as np
import pyarrow as pa

from store import Message, MessageStore, StoreConfig

BODY = bytes(range(100))


def messages(n: int) -> list[Message]:
    return [Message("bench", BODY, tags="TagA", keys=f"k{i}", properties={"p": "v"})
            for i in range(n)]


def table(n: int, distinct_keys: int | None = None) -> pa.Table:
    """``n`` rows of the same shape; key of row ``i``: ``k{i % distinct_keys}``."""
    keys = np.arange(n) % (distinct_keys or n)
    bodies = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
        np.arange(0, (n + 1) * len(BODY), len(BODY), dtype=np.int32)), pa.py_buffer(BODY * n)])
    props = pa.MapArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)),
                                    pa.array(["p"] * n), pa.array(["v"] * n))
    return pa.table({"topic": pa.array(["bench"] * n), "body": bodies,
                     "tags": pa.array(["TagA"] * n),
                     "keys": pa.array([f"k{k}" for k in keys.tolist()], pa.string()),
                     "properties": props})


def config(index: bool) -> StoreConfig:
    return StoreConfig(message_index_enable=index)


def _indexed(store, t0: float, cpu0: float) -> tuple[float, float, float]:
    """(seconds since ``t0``, the same once the index holds every message, CPU seconds of
    the process since ``cpu0`` then: every thread's, the builder's included)."""
    sent = time.perf_counter() - t0
    store.key_index.build(store.confirmed_offset())
    return sent, time.perf_counter() - t0, time.process_time() - cpu0


def run_table(path: str, index: bool, rows: pa.Table) -> tuple[float, float, float]:
    with MessageStore.open(path, config(index)) as store:
        producer = store.producer("bench")
        producer.send_table(rows.slice(0, 1))
        t0, cpu0 = time.perf_counter(), time.process_time()
        producer.send_table(rows.slice(1))
        return _indexed(store, t0, cpu0)


def run_batch(path: str, index: bool, msgs: list[Message], batch_size: int
              ) -> tuple[float, float, float]:
    with MessageStore.open(path, config(index)) as store:
        producer = store.producer("bench")
        producer.send_batch(msgs[:1])
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(1, len(msgs), batch_size):
            producer.send_batch(msgs[i:i + batch_size])
        return _indexed(store, t0, cpu0)


def run_single(path: str, index: bool, msgs: list[Message]) -> tuple[float, float, float]:
    with MessageStore.open(path, config(index)) as store:
        producer = store.producer("bench")
        producer.send(msgs[0])
        t0, cpu0 = time.perf_counter(), time.process_time()
        for m in msgs[1:]:
            producer.send(m)
        return _indexed(store, t0, cpu0)


def compare(base: str, name: str, repeat: int, fn, *args) -> None:
    """Best seconds of ``fn`` with the index on and off (alternating), and the ratios."""
    best = {(i, k): float("inf") for i in (True, False) for k in (0, 1, 2)}
    for r in range(repeat):
        for index in (False, True):
            path = os.path.join(base, f"{name}-{index}-{r}")
            got = fn(path, index, *args)
            for k in (0, 1, 2):
                best[index, k] = min(best[index, k], got[k])
            shutil.rmtree(path, ignore_errors=True)
    for k, label in ((0, ""), (1, " + index"), (2, " CPU")):
        off, on = best[False, k], best[True, k]
        print(f"{name + label:<19} index off {off:7.3f} s   on {on:7.3f} s   "
              f"ratio on/off {on / off:.3f}", flush=True)


def query_bench(base: str, n: int, queries: int) -> None:
    path = os.path.join(base, "query")
    distinct = max(1, n // 10)
    with MessageStore.open(path, StoreConfig()) as store:
        producer = store.producer("bench")
        chunk = 1_000_000
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            rows = table(min(chunk, n - start), distinct)
            producer.send_table(rows if start == 0 else _shifted(rows, start, distinct))
        print(f"store of {n:,} messages in one topic ({distinct:,} keys, 10 messages each) "
              f"written in {time.perf_counter() - t0:.1f} s", flush=True)
    with MessageStore.open(path, StoreConfig(), read_only=True) as reader:
        rng = np.random.default_rng(7)
        times, found = [], []
        for key in rng.integers(0, distinct, queries).tolist():
            t0 = time.perf_counter()
            got = reader.query_messages("bench", key=f"k{key}")
            times.append(time.perf_counter() - t0)
            found.append(len(got))
    print(f"query_messages(key) on {n:,} messages: median {statistics.median(times) * 1e3:.2f} "
          f"ms, worst {max(times) * 1e3:.2f} ms over {queries} keys (bound: < 50 ms); "
          f"messages found per key: {min(found)}..{max(found)}", flush=True)


def _shifted(rows: pa.Table, start: int, distinct: int) -> pa.Table:
    keys = (np.arange(start, start + rows.num_rows) % distinct).tolist()
    return rows.set_column(rows.schema.get_field_index("keys"), "keys",
                           pa.array([f"k{k}" for k in keys], pa.string()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--single", type=int, default=50_000, help="messages for send")
    ap.add_argument("--query-messages", type=int, default=10_000_000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bench-index-", dir=args.dir)
    try:
        msgs = messages(args.messages)
        compare(base, "send_table", args.repeat, run_table, table(args.messages))
        compare(base, "send_batch", args.repeat, run_batch, msgs, args.batch_size)
        compare(base, "send", args.repeat, run_single, msgs[:args.single])
        if args.query_messages:
            query_bench(base, args.query_messages, args.queries)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
