"""A fresh process's first deliveries, with numba's cache empty (a fresh install) and filled.

Each case runs in a new process (``PYTHONPATH`` = the code measured, ``NUMBA_CACHE_DIR`` =
an empty directory, or one a run before it filled):

* ``first deliver_due``: the seconds of the first ``deliver_due()`` of a process that finds
  two due messages (a timer and a level-1 message), store opened and imports done;
* ``level 1``: 200 messages sent at delay level 1 (1 s) at the process's start, then
  ``deliver_due()`` every 50 ms for 3.5 s: how many reached their topic, and the lateness
  (seen minus due, ms) p50 / p99 / max; on time means within ``timer_precision_ms`` (1 s) of due.

``--baseline DIR`` measures another checkout of the code (``git worktree add /tmp/base
<commit>``) in the same run, in turns with this one: the ratios printed are this code's
figures against it.

    python bench/bench_cold_start.py --baseline /tmp/base --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FIRST = """
import json, sys, time
from store import Message, MessageStore, StoreConfig
now = [time.time_ns() // 1_000_000]
with MessageStore.open(sys.argv[1], StoreConfig(timer_precision_ms=100),
                       clock=lambda: now[0]) as store:
    producer = store.producer("g")
    producer.send(Message("t", b"a"), delay_ms=500)
    producer.send(Message("t", b"b"), delay_level=1)
    now[0] += 4_000
    t0 = time.perf_counter()
    n = store.deliver_due()  # the process's first: both due (the timer one via its wheel)
    while n < 2 and time.perf_counter() - t0 < 60:
        n += store.deliver_due()
    print(json.dumps({"seconds": time.perf_counter() - t0, "delivered": n,
                      "code": __import__("store").__file__}))
"""

_LEVEL1 = """
import json, sys, time
from store import Message, MessageStore, StoreConfig
with MessageStore.open(sys.argv[1], StoreConfig(timer_precision_ms=1000)) as store:
    producer = store.producer("g")
    due = {}
    for i in range(200):
        r = producer.send(Message("t", b"m%d" % i), delay_level=1)
        due[r.msg_id] = time.time() * 1000 + 1000
    seen = {}
    end = time.monotonic() + 3.5
    while time.monotonic() < end:
        store.deliver_due()
        now = time.time() * 1000
        for q in store.queue_ids("t"):
            for m in store.pull("t", q, 0, 1000):
                seen.setdefault(m.msg_id, now)
        time.sleep(0.05)
late = sorted(seen[k] - due[k] for k in seen)
print(json.dumps({"delivered": len(seen), "late": late}))
"""


#: Prepended to each child: the code measured is the one on ``PYTHONPATH`` even where an
#: editable install of another checkout is on the interpreter's meta path.
_ONLY_PYTHONPATH = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
"""


def _run(code: str, root: str, cache: str) -> dict:
    code = _ONLY_PYTHONPATH + code
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=root, NUMBA_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", code, os.path.join(tmp, "s")], env=env,
                             capture_output=True, text=True, timeout=300, check=True,
                             cwd=tmp)  # not this checkout's directory: it comes first
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "code" in result and not result["code"].startswith(root):
        raise SystemExit(f"measured {result['code']}, not the code under {root}")
    return result


def _pct(values, q):
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def measure(root: str) -> dict:
    out = {}
    for cache_state in ("empty", "filled"):
        with tempfile.TemporaryDirectory() as cache:
            if cache_state == "filled":
                _run(_FIRST, root, cache)  # fills the cache
                _run(_LEVEL1, root, cache)
            first = _run(_FIRST, root, cache)
            if cache_state == "empty":
                cache_fresh = tempfile.mkdtemp()
                level = _run(_LEVEL1, root, cache_fresh)
            else:
                level = _run(_LEVEL1, root, cache)
        late = level["late"]
        out[cache_state] = {
            "first_deliver_s": round(first["seconds"], 3),
            "level1_delivered": level["delivered"],
            "level1_late_ms": [round(_pct(late, 50)), round(_pct(late, 99)),
                               round(late[-1]) if late else None],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="another checkout of the code, measured in turns")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    for run in range(args.repeat):
        results = {}
        for name, root in (("baseline", args.baseline), ("this code", ROOT)):
            if root is None:
                continue
            results[name] = measure(root)
            print(json.dumps({"run": run + 1, "code": name, **results[name]}))
        if len(results) == 2:
            for cache_state in ("empty", "filled"):
                a, b = results["baseline"][cache_state], results["this code"][cache_state]
                print(f"run {run + 1}, cache {cache_state}: first deliver_due "
                      f"{a['first_deliver_s'] / max(b['first_deliver_s'], 1e-6):.0f}x faster; "
                      f"level 1 delivered {b['level1_delivered']} against "
                      f"{a['level1_delivered']} of 200")


if __name__ == "__main__":
    main()
