"""A fresh process's first firing step over 20,000 due schedules (numba's loops not loaded yet,
so MessageStore.deliver_due fires in bounded calls).

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_schedules_cold.py

Not collected by pytest.
"""
import tempfile, time
import pyarrow as pa
from store import MessageStore
now=[1_790_000_000_000]
s = MessageStore.open(tempfile.mkdtemp(), clock=lambda: now[0], flush_service=False)
p = s.producer()
n = 20000
p.schedule_table(pa.table({"key": [f"o-{i}" for i in range(n)], "body": [b"x"*100]*n, "every_ms": pa.array([1000]*n, pa.int64())}), topic="rem")
now[0] += 1000
t=time.perf_counter(); k=s.deliver_due(); print(f"fresh process, first firing step of {k}: {time.perf_counter()-t:.2f} s")
