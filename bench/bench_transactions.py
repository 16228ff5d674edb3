"""A transaction check round over many half messages, most of them already resolved.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_transactions.py [--halves N] [--resolved F]

Setup (not timed as the benchmark): ``N`` half messages (100-byte bodies, a key each) are
appended in batches of 10,000 with ``store.append``; a fraction ``F`` of them (default 0.9)
is then ended through ``end_transactions`` (half committed, half rolled back: commit records
plus op messages, 50,000 per call); the fake clock moves past the transaction timeout.

Measured, in one run on one store:

* ``baseline: per-record walk``  finding the open transactions without the vectorised index:
  decode every half record (``store.read_record``) and every op message, and match them in
  Python, one message at a time (RocketMQ's own approach);
* ``vectorised index, cold``  the same answer from a fresh store object (no index snapshot):
  the transaction index built from the three queues with NumPy, then the open half offsets;
* ``check round, in process``  one round on that index: walks every half offset, asks
  ``resolve(view)`` about every open transaction (it answers COMMIT), puts back a copy of
  each, commits them and writes the op messages; the views are Python objects, decoded one
  per transaction for the resolver;
* ``check round, columnar``  the same round on a copy of the store taken before it, as the
  Spark check loop runs it: ``prepare_transaction_checks()`` (walk, put-back copies, no
  views), ``checks.to_arrow()`` (the rows a Spark batch reads), ``end_transactions`` of
  (transaction_id, COMMIT) pairs: the bookkeeping without a Python object per transaction
  besides the answer pairs;
* ``warm round``  the next round (one check interval later), everything resolved, on the
  index kept in memory;
* ``snapshot open``  a new store object whose index loads from the snapshot written at close.

Prints each time, rates, and the ratio of the baseline to the vectorised index.  Not collected by pytest.
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

from store import MessageStore, StoreConfig
from store.formats.record_codec import RecordSpec
from store.formats.message import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from store.transaction.half import half_spec
from store.transaction.op import parse_op_body

BATCH = 10_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def build(path: str, n: int, resolved: float, clock: Clock) -> list[str]:
    config = StoreConfig(commitlog_file_size_bytes=256 * 1024 * 1024)
    store = MessageStore.open(path, config, clock=clock, flush_service=False)
    store.ensure_topic("payments")
    ids: list[str] = []
    body = b"p" * 100
    t = time.perf_counter()
    for start in range(0, n, BATCH):
        k = min(BATCH, n - start)
        batch_ids = store.id_generator.next_ids(k, clock())
        specs = [half_spec(RecordSpec(topic="payments", body=body,
                                      properties={"KEYS": f"o-{start + i}", "UNIQ_KEY": tx},
                                      born_timestamp_ms=clock()), "pay-service", (start + i) % 4)
                 for i, tx in enumerate(batch_ids)]
        store.append(specs)
        ids.extend(batch_ids)
    t_halves = time.perf_counter() - t
    t = time.perf_counter()
    ended = int(n * resolved)
    # resolve the first `ended` of every block of 10 in order, e.g. 9 of 10 for 0.9
    keep_open = {i for i in range(n) if (i % 10) >= round(resolved * 10)}
    done = [i for i in range(n) if i not in keep_open][:ended]
    for k in range(0, len(done), 50_000):
        chunk = done[k:k + 50_000]
        store.transactions.end_transactions(
            [(ids[i], "COMMIT" if i % 2 else "ROLLBACK") for i in chunk])
    t_end = time.perf_counter() - t
    store.close()
    print(f"setup: {n:,} halves appended in {t_halves:.1f} s; {len(done):,} ended "
          f"(commit + op) in {t_end:.1f} s")
    return ids


def baseline_walk(path: str, clock: Clock) -> float:
    """Decode every half and op record one by one (no index)."""
    store = MessageStore.open(path, clock=clock, flush_service=False)
    t = time.perf_counter()
    ended = set()
    for v in _pull_all(store, TRANS_OP_HALF_TOPIC):
        ended.update(parse_op_body(v.body))
    open_count = 0
    for qoff, v in enumerate(_pull_all(store, TRANS_HALF_TOPIC)):
        if qoff not in ended:
            open_count += 1
    elapsed = time.perf_counter() - t
    store.close()
    print(f"baseline: per-record walk      {elapsed:7.2f} s  ({open_count:,} open)")
    return elapsed


def columnar_round(path: str, clock: Clock, halves: int) -> None:
    """The round as the Spark check loop runs it (see the module docstring), timed by step."""
    store = MessageStore.open(path, clock=clock, flush_service=False)
    store.transactions.index.refresh()
    store.read_arrow(TRANS_HALF_TOPIC, 0, 0, 1)  # the first Arrow decode of a process: ~0.2 s
    t0 = time.perf_counter()
    plan = store.prepare_transaction_checks()
    t1 = time.perf_counter()
    rows = plan.checks.to_arrow()
    t2 = time.perf_counter()
    done = store.end_transactions(
        [(tx, "COMMIT") for tx in rows.column("transaction_id").to_pylist()], from_check=True)
    t3 = time.perf_counter()
    store.close()
    total = t3 - t0
    print(f"check round, columnar         {total:7.2f} s  (walked {halves:,} halves: "
          f"{halves / total:,.0f}/s; asked {len(rows):,} and committed {sum(done):,}: "
          f"{len(rows) / total:,.0f} checks/s; walk + copies {t1 - t0:.2f} s, "
          f"to_arrow {t2 - t1:.2f} s, end_transactions {t3 - t2:.2f} s)")


def _pull_all(store, topic):
    cq = store.consume_queue(topic, 0)
    end = cq.max_offset(store.confirmed_offset())
    for e in cq.entries(0, end):
        yield store.read_record(int(e["offset"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--halves", type=int, default=1_000_000)
    ap.add_argument("--resolved", type=float, default=0.9)
    ap.add_argument("--dir", default=None, help="where to build the store (default: a temp dir)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="rmq-bench-tx-", dir=args.dir)
    path = os.path.join(base, "store")
    clock = Clock()
    try:
        build(path, args.halves, args.resolved, clock)
        snapshot = os.path.join(path, "config", "transactionIndex.npz")
        if os.path.exists(snapshot):
            os.unlink(snapshot)
        clock.now += 7_000  # past transaction_timeout_ms
        copy_path = os.path.join(base, "copy")
        shutil.copytree(path, copy_path)
        base_s = baseline_walk(path, clock)

        store = MessageStore.open(path, clock=clock, flush_service=False)
        t = time.perf_counter()
        index = store.transactions.index
        index.refresh()
        open_offsets, _ = index.window(0, index.half_scanned)
        t_index = time.perf_counter() - t
        print(f"vectorised index, cold        {t_index:7.2f} s  ({len(open_offsets):,} open; "
              f"{args.halves / t_index:,.0f} halves/s; {base_s / t_index:.1f}x faster than "
              "the baseline)")
        t = time.perf_counter()
        result = store.check_transactions(lambda view: "COMMIT")
        round_s = time.perf_counter() - t
        print(f"check round, in process       {round_s:7.2f} s  (walked {args.halves:,} halves: "
              f"{args.halves / round_s:,.0f}/s; asked {result.checked:,} and committed "
              f"{result.committed:,}: {result.checked / round_s:,.0f} checks/s)")
        columnar_round(copy_path, clock, args.halves)
        print(f"index + round, cold start     {t_index + round_s:7.2f} s")
        clock.now += 31_000
        t = time.perf_counter()
        warm = store.check_transactions(lambda view: "COMMIT")
        warm_s = time.perf_counter() - t
        print(f"warm round (all resolved)     {warm_s:7.3f} s  (asked {warm.checked})")
        store.close()

        t = time.perf_counter()
        store = MessageStore.open(path, clock=clock, flush_service=False)
        store.transactions.index.refresh()
        snap_s = time.perf_counter() - t
        print(f"open + index from snapshot    {snap_s:7.3f} s  "
              f"({store.transactions.pending_stats()['pending']} open)")
        store.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
