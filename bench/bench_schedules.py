"""Recurring schedules: the cost of a firing step and of an idle step, against sending the
same copies with ``send_batch``, in one run.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_schedules.py [--schedules N] [--repeat R]

Adds ``N`` (10,000) schedules firing every second (one store, a fake clock), then times:

* ``fire``: ``deliver_due()`` one second later, which fires one copy of each (``N`` copies);
* ``idle``: ``deliver_due()`` with nothing due (what every streaming trigger pays);
* ``add``: ``producer.schedule`` per schedule;
* the baseline: ``send_batch`` of ``N`` messages of the same size, 1,000 per batch.

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from store import Message, MessageStore, warm_up  # noqa: E402


def rss_anon_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")

T0 = 1_790_000_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--table", action="store_true",
                    help="add the schedules with schedule_table, 10,000 a table")
    args = ap.parse_args()
    n = args.schedules
    work = tempfile.mkdtemp(prefix="rmq-bench-schedules-")
    try:
        now = [T0]
        warm_up()  # the compiled loops loaded: a fresh process fires in small steps until then
        gc.collect()
        heap_before = rss_anon_mb()
        with MessageStore.open(os.path.join(work, "s"), clock=lambda: now[0],
                               flush_service=False) as store:
            p = store.producer("bench")
            msg = Message("reminders", b"x" * 100, tags="remind")
            t = time.perf_counter()
            if args.table:
                import pyarrow as pa

                for lo in range(0, n, 10_000):
                    hi = min(n, lo + 10_000)
                    p.schedule_table(pa.table({
                        "key": [f"order-{i}" for i in range(lo, hi)],
                        "body": [msg.body] * (hi - lo), "tags": [msg.tags] * (hi - lo),
                        "every_ms": pa.array([1000] * (hi - lo), pa.int64())}),
                        topic=msg.topic)
            else:
                for i in range(n):
                    p.schedule(msg, key=f"order-{i}", every_ms=1000)
            add_s = time.perf_counter() - t
            gc.collect()
            heap_mb = rss_anon_mb() - heap_before
            # what the book keeps in memory, read afresh (as another process would)
            import tracemalloc

            from store.schedule.schedule_book import ScheduleBook

            tracemalloc.start()
            fresh = ScheduleBook(store)
            fresh._nothing_due(0)
            gc.collect()
            book_bytes = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            del fresh
            fire, idle, batch = [], [], []
            for _ in range(args.repeat):
                now[0] += 1000
                t = time.perf_counter()
                fired = store.deliver_due()
                fire.append(time.perf_counter() - t)
                assert fired == n, fired
                t = time.perf_counter()
                assert store.deliver_due() == 0
                idle.append(time.perf_counter() - t)
                t = time.perf_counter()
                for first in range(0, n, 1000):
                    p.send_batch([msg] * min(1000, n - first))
                batch.append(time.perf_counter() - t)
        best_fire, best_idle, best_batch = min(fire), min(idle), min(batch)
        print(f"{n:,} schedules every second, best of {args.repeat}")
        how = "schedule_table, 10,000 a table" if args.table else "producer.schedule, one by one"
        print(f"add ({how}): {n / add_s:,.0f} schedules/s")
        print(f"heap (RssAnon) after the adds: +{heap_mb:,.1f} MB = "
              f"{heap_mb * 2**20 / n:,.0f} bytes per schedule (allocator included)")
        print(f"the book kept in memory (tracemalloc): {book_bytes / n:,.0f} bytes per schedule")
        print(f"fire step: {best_fire * 1000:.1f} ms = {n / best_fire:,.0f} copies/s")
        print(f"idle step (nothing due): {best_idle * 1000:.2f} ms")
        print(f"send_batch of the same {n:,} messages: {best_batch * 1000:.1f} ms = "
              f"{n / best_batch:,.0f} msgs/s")
        print(f"ratio fire / send_batch: {best_batch / best_fire:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
