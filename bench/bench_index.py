"""What the message-key index costs sends, and how fast a key is found.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_index.py [--messages N] [--query-messages M]
        [--queries Q] [--scans S]

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
  then ("builds") the CPU seconds of the index's builds themselves (each thread's own, in
  ``KeyIndex.build``), the median of the runs with the index on;
* queries on ``--query-messages`` messages (default 10M) in one topic, written with
  ``send_table`` without the index, each key carried by 10 messages spread over the whole
  log: the index's build from the CommitLog (a writable open with the index on, less one with
  it off; against the write of the store); on a fresh reader, ``store.query_messages(topic,
  key=K)`` for ``--queries`` random keys, ``store.view_message`` of one message of each by its
  unique key (through the index) and by its offset message id (the first call apart: it maps
  the files and takes them by their seal or runs their first-use check, and says which;
  then median and worst); and the baseline in the
  same run, the same answers found by a scan of the CommitLog (the compiled key walk over
  every record, ``--scans`` keys).  ``--messages 0`` runs the queries alone;
* with ``--first-query STORE --baseline DIR`` (a store kept by ``--keep``, its ``query``
  directory; ``DIR`` a checkout of other code, e.g. ``git archive``), only a fresh reader's
  first query, in a new process each turn, this code and ``DIR``'s alternating
  (``--baseline-seal FILE``: the baseline's seal, when its format differs; ``--cold``: the
  index files out of the page cache before each turn, as after a long scan).

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np
import pyarrow as pa

from store import Message, MessageStore, StoreConfig
from store.files.index_file import java_hash_text
from store.formats.message_id import offset_message_id

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


def _indexed(store, t0: float, cpu0: float) -> tuple[float, float, float, float]:
    """(seconds since ``t0``, the same once the index holds every message, CPU seconds of
    the process since ``cpu0`` then: every thread's, the builder's included, and of them the
    CPU seconds spent in the index's builds, see :func:`_timed_builds`)."""
    sent = time.perf_counter() - t0
    store.key_index.build(store.confirmed_offset())
    return (sent, time.perf_counter() - t0, time.process_time() - cpu0,
            getattr(store.key_index, "build_cpu", [0.0])[0])


def _timed_builds(store) -> None:
    """Count the CPU seconds of the calling thread in each ``store.key_index.build`` (the
    builder thread's and the last one after the sends) into ``key_index.build_cpu``."""
    index, build, spent = store.key_index, store.key_index.build, [0.0]

    def timed(*args, **kwargs):
        c0 = time.thread_time()
        try:
            return build(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - c0
    index.build, index.build_cpu = timed, spent


def run_table(path: str, index: bool, rows: pa.Table) -> tuple[float, float, float]:
    with MessageStore.open(path, config(index)) as store:
        _timed_builds(store)
        producer = store.producer("bench")
        producer.send_table(rows.slice(0, 1))
        store.key_index.build_cpu[0] = 0.0
        t0, cpu0 = time.perf_counter(), time.process_time()
        producer.send_table(rows.slice(1))
        return _indexed(store, t0, cpu0)


def run_batch(path: str, index: bool, msgs: list[Message], batch_size: int
              ) -> tuple[float, float, float]:
    with MessageStore.open(path, config(index)) as store:
        _timed_builds(store)
        producer = store.producer("bench")
        producer.send_batch(msgs[:1])
        store.key_index.build_cpu[0] = 0.0
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(1, len(msgs), batch_size):
            producer.send_batch(msgs[i:i + batch_size])
        return _indexed(store, t0, cpu0)


def run_single(path: str, index: bool, msgs: list[Message]) -> tuple[float, float, float]:
    with MessageStore.open(path, config(index)) as store:
        _timed_builds(store)
        producer = store.producer("bench")
        producer.send(msgs[0])
        store.key_index.build_cpu[0] = 0.0
        t0, cpu0 = time.perf_counter(), time.process_time()
        for m in msgs[1:]:
            producer.send(m)
        return _indexed(store, t0, cpu0)


def compare(base: str, name: str, repeat: int, fn, *args) -> None:
    """Best seconds of ``fn`` with the index on and off (alternating), and the ratios."""
    best = {(i, k): float("inf") for i in (True, False) for k in (0, 1, 2)}
    builds = []
    for r in range(repeat):
        for index in (False, True):
            path = os.path.join(base, f"{name}-{index}-{r}")
            got = fn(path, index, *args)
            for k in (0, 1, 2):
                best[index, k] = min(best[index, k], got[k])
            if index:
                builds.append(got[3])
            shutil.rmtree(path, ignore_errors=True)
    for k, label in ((0, ""), (1, " + index"), (2, " CPU")):
        off, on = best[False, k], best[True, k]
        print(f"{name + label:<19} index off {off:7.3f} s   on {on:7.3f} s   "
              f"ratio on/off {on / off:.3f}", flush=True)
    n = len(args[0]) if hasattr(args[0], "__len__") else args[0].num_rows
    build = statistics.median(builds)
    print(f"{name + ' builds':<19} CPU of the index's builds, median of {len(builds)}: "
          f"{build:.3f} s, {build / n * 1e6:.2f} us a message", flush=True)


def query_bench(base: str, n: int, queries: int, scans: int) -> None:
    """The store of ``n`` messages: written without the index, the index then built from the
    CommitLog by a writable open, then queries by key and by id on a fresh reader, against
    the same answers found by a scan of the CommitLog (the compiled key walk a query uses
    for what the index misses, over the whole log), all in this run."""
    path = os.path.join(base, "query")
    distinct = max(1, n // 10)
    off, on = StoreConfig(), StoreConfig(message_index_enable=True)
    with MessageStore.open(path, off) as store:
        producer = store.producer("bench")
        chunk = 1_000_000
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            rows = table(min(chunk, n - start), distinct)
            producer.send_table(rows if start == 0 else _shifted(rows, start, distinct))
        written = time.perf_counter() - t0
        log_bytes = store.confirmed_offset()
    print(f"store of {n:,} messages in one topic ({distinct:,} keys, 10 messages each; "
          f"{log_bytes / 2**30:.2f} GiB of CommitLog) written without the index in "
          f"{written:.1f} s", flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    with MessageStore.open(path, off, flush_service=False):
        pass
    plain = time.perf_counter() - t0, time.process_time() - cpu0
    t0, cpu0 = time.perf_counter(), time.process_time()
    with MessageStore.open(path, on, flush_service=False) as store:
        built = time.perf_counter() - t0, time.process_time() - cpu0
        entries = sum(f.index_count - 1 for f in store.key_index._refresh())
    build, build_cpu = built[0] - plain[0], built[1] - plain[1]
    print(f"index build (a writable open with the index on, less one with it off: "
          f"{built[0]:.1f} - {plain[0]:.1f} s): {build:.1f} s, {build_cpu:.1f} s CPU, "
          f"{build / n * 1e6:.2f} us a message ({entries:,} entries); "
          f"{build / written:.2f}x the write of the store", flush=True)
    rng = np.random.default_rng(7)
    keys = [f"k{k}" for k in rng.integers(0, distinct, queries).tolist()]
    with MessageStore.open(path, on, read_only=True) as reader:
        times, found = [], []
        for key in keys:
            t0 = time.perf_counter()
            got = reader.query_messages("bench", key=key)
            times.append(time.perf_counter() - t0)
            found.append(got)
        _report("query_messages(key)", n, times, f"messages per key: "
                f"{min(map(len, found))}..{max(map(len, found))} (bound: < 50 ms)")
        files = reader.key_index._refresh()
        print("the first query's first use of the index files: " + ", ".join(
            f"{f.index_count - 1:,} entries {getattr(f, 'first_use', None) or 'checked'}"
            for f in files) + " (sealed: the CRC of a writer's seal matched, no chain check)",
            flush=True)
        views = [v for got in found for v in got[:1]]
        by_id = _timed(lambda v: reader.view_message(v.msg_id), views)
        _report("view_message(unique key)", n, by_id[0], "")
        assert all(a.commitlog_offset == b.commitlog_offset for a, b in zip(views, by_id[1]))
        offset_ids = [offset_message_id(v.commitlog_offset) for v in views]
        by_offset = _timed(reader.view_message, offset_ids)
        _report("view_message(offset id)", n, by_offset[0], "")
        scan_times = []
        for key, got in list(zip(keys, found))[:scans]:
            t0 = time.perf_counter()
            offsets = _scan(reader, "bench", key)
            scan_times.append(time.perf_counter() - t0)
            assert offsets == [v.commitlog_offset for v in got], key
        scan = statistics.median(scan_times)
        print(f"scan of the CommitLog for one key (the same answers, {scans} keys): median "
              f"{scan * 1e3:.0f} ms; query by key / scan {statistics.median(times) / scan:.6f}"
              f", view_message(unique key) / scan {statistics.median(by_id[0]) / scan:.6f}",
              flush=True)


#: a fresh process's first query: ``python -c FIRST CODE STORE TOPIC KEY`` prints its wall
#: and CPU seconds and how many messages it found (the import and the open not counted)
FIRST = """
import sys, time
sys.path.insert(0, sys.argv[1])
from store import StoreConfig, StoreReader
with StoreReader.open(sys.argv[2], StoreConfig(message_index_enable=True)) as reader:
    t0, c0 = time.perf_counter(), time.process_time()
    found = reader.query_messages(sys.argv[3], key=sys.argv[4])
    print(time.perf_counter() - t0, time.process_time() - c0, len(found))
"""


def first_queries(path: str, baseline: str, turns: int, baseline_seal: str | None = None,
                  cold: bool = False) -> None:
    """The first ``query_messages`` of a fresh reader of the store at ``path``, this code
    and the code in ``baseline`` alternating, ``turns`` each (one key of the store
    :func:`query_bench` writes, or of ``bench_pushdown.py``'s).  ``baseline_seal``: the
    baseline's own ``config/index.seal`` (its format another), put in place for its turns
    and this code's for the others; ``cold``: the store's index files dropped from the page
    cache before each turn (``posix_fadvise``, those files only)."""
    seal = os.path.join(path, "config", "index.seal")
    seals = {}
    if baseline_seal:
        with open(seal, "rb") as fh:
            seals["this code"] = fh.read()
        with open(baseline_seal, "rb") as fh:
            seals["baseline"] = fh.read()
    figures: dict[str, list[tuple[float, float]]] = {"baseline": [], "this code": []}
    for _ in range(turns):
        for label, code in (("baseline", baseline), ("this code", ROOT)):
            if seals:
                with open(seal + ".tmp", "wb") as fh:
                    fh.write(seals[label])
                os.replace(seal + ".tmp", seal)
            if cold:
                _drop_cached(os.path.join(path, "index"))
            out = subprocess.run([sys.executable, "-c", FIRST, code, path, "bench", "k12345"],
                                 capture_output=True, text=True, check=True).stdout.split()
            figures[label].append((float(out[0]), float(out[1])))
            print(f"{label:9s} first query {float(out[0]) * 1e3:8.1f} ms wall, "
                  f"{float(out[1]) * 1e3:7.1f} ms CPU ({out[2]} messages)", flush=True)
    if seals:  # (this code's seal back in place)
        with open(seal + ".tmp", "wb") as fh:
            fh.write(seals["this code"])
        os.replace(seal + ".tmp", seal)
    for label, got in figures.items():
        wall, cpu = zip(*got)
        print(f"{label:9s} median {statistics.median(wall) * 1e3:.1f} ms wall, "
              f"{statistics.median(cpu) * 1e3:.1f} ms CPU over {turns}", flush=True)


def _drop_cached(directory: str) -> None:
    """Drop the files of ``directory`` from the page cache (theirs only)."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(fn, args: list) -> tuple[list[float], list]:
    times, results = [], []
    for a in args:
        t0 = time.perf_counter()
        results.append(fn(a))
        times.append(time.perf_counter() - t0)
    return times, results


def _report(what: str, n: int, times: list[float], extra: str) -> None:
    """The first call apart (it maps the files and runs their first-use check), then the
    median and worst of the others."""
    rest = times[1:] or times
    print(f"{what} on {n:,} messages: first {times[0] * 1e3:.1f} ms, then median "
          f"{statistics.median(rest) * 1e3:.2f} ms, worst {max(rest) * 1e3:.2f} ms over "
          f"{len(rest)}; {extra}", flush=True)


def _scan(reader, topic: str, key: str) -> list[int]:
    """CommitLog offsets of the records of ``topic`` carrying ``key``, found without the
    index: the compiled walk over every record's keys, its hashes matched, the records read
    and checked (what a store without an index would have to do, at its cheapest)."""
    key_hash = java_hash_text(f"{topic}#{key}")
    hits: list[np.ndarray] = []

    def keep(hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
        hits.append(phys[hashes == key_hash])
    rows = np.empty((3, 1 << 16), dtype=np.int64)
    reader.key_index._walk(reader.commit_log.min_offset(), reader.visible_offset(), keep, rows)
    offsets = np.unique(np.concatenate(hits)).tolist() if hits else []
    return [r.commitlog_offset for r in (reader.view_message(offset_message_id(o))
                                         for o in offsets)
            if r is not None and r.topic == topic and key in r.keys]


def _shifted(rows: pa.Table, start: int, distinct: int) -> pa.Table:
    keys = (np.arange(start, start + rows.num_rows) % distinct).tolist()
    return rows.set_column(rows.schema.get_field_index("keys"), "keys",
                           pa.array([f"k{k}" for k in keys], pa.string()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000,
                    help="messages of the send comparisons (0: none)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--single", type=int, default=50_000, help="messages for send")
    ap.add_argument("--query-messages", type=int, default=10_000_000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--scans", type=int, default=3, help="keys found by a scan too")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the stores (their directory)")
    ap.add_argument("--first-query", metavar="STORE",
                    help="only time a fresh reader's first query of STORE (a kept query "
                         "store), this code and --baseline's alternating")
    ap.add_argument("--baseline", metavar="DIR", help="the code compared (a checkout)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--baseline-seal", metavar="FILE",
                    help="with --first-query: the baseline's config/index.seal (another "
                         "format), in place for its turns")
    ap.add_argument("--cold", action="store_true",
                    help="with --first-query: the index files out of the page cache each turn")
    args = ap.parse_args()
    if args.first_query:
        first_queries(args.first_query, args.baseline or ROOT, args.turns, args.baseline_seal,
                      args.cold)
        return
    base = tempfile.mkdtemp(prefix="bench-index-", dir=args.dir)
    try:
        if args.messages:
            msgs = messages(args.messages)
            compare(base, "send_table", args.repeat, run_table, table(args.messages))
            compare(base, "send_batch", args.repeat, run_batch, msgs, args.batch_size)
            compare(base, "send", args.repeat, run_single, msgs[:args.single])
        if args.query_messages:
            query_bench(base, args.query_messages, args.queries, args.scans)
    finally:
        if args.keep:
            print(f"stores kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
