"""A fresh process's first firing step over 20,000 due schedules (numba's loops not loaded yet,
so ``MessageStore.deliver_due`` fires in bounded calls until they are).

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_schedules_cold.py [--schedules N]

Opens a new store on a fake clock, adds ``N`` schedules firing every second with one
``schedule_table``, moves the clock one second on and times ``deliver_due()``.  Not collected
by pytest.
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

import pyarrow as pa  # noqa: E402

from store import MessageStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=20_000)
    n = ap.parse_args().schedules
    work = tempfile.mkdtemp(prefix="rmq-bench-schedules-cold-")
    now = [1_790_000_000_000]
    try:
        with MessageStore.open(os.path.join(work, "s"), clock=lambda: now[0],
                               flush_service=False) as store:
            store.producer().schedule_table(pa.table({
                "key": [f"o-{i}" for i in range(n)], "body": [b"x" * 100] * n,
                "every_ms": pa.array([1000] * n, pa.int64())}), topic="reminders")
            now[0] += 1000
            t = time.perf_counter()
            fired = store.deliver_due()
            print(f"fresh process, first firing step of {fired:,} copies: "
                  f"{time.perf_counter() - t:.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
