"""What the timer's open-time check costs a store holding many pending timer messages.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_timer_open.py [--pending 200000]
        [--baseline DIR] [--repeat 3] [--close crash|clean]

Builds a store (``timer_precision_ms`` 1000) holding ``--pending`` timer messages due in an
hour, spread over 600 slots and placed in the wheel (``deliver_due``), then closes it
(``clean``, or ``crash``: the process ends without closing, as a kill would).  Each turn
runs a fresh process that opens the store and calls ``deliver_due`` once, and reports the
seconds of the open, of the timer service's start inside it (its first use of the timer:
the checkpoint and the timer files are checked there; wall and CPU seconds, the CPU figure
being the one a loaded machine leaves readable) and of that first ``deliver_due``.  ``--baseline DIR`` runs the same turns with the code
in ``DIR`` (``git archive <commit> | tar -x -C DIR``), alternating, on a copy of the same
store, and prints this code's figures against it.

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_BUILD = """
import os, sys, time
import numpy as np, pyarrow as pa
from store import MessageStore, StoreConfig
path, pending, close = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = MessageStore.open(path, StoreConfig(timer_precision_ms=1000))
now = int(time.time() * 1000)
p = store.producer("g")
for lo in range(0, pending, 10_000):
    n = min(10_000, pending - lo)
    due = now + 3_600_000 + (np.arange(lo, lo + n) % 600) * 1000
    p.send_table(pa.table({"topic": ["t"] * n, "body": [b"x" * 32] * n,
                           "deliver_at": pa.array(due, pa.int64())}))
store.deliver_due()
assert store.timer.pending_count() == pending, store.timer.pending_count()
if close == "clean":
    store.close()
else:
    store.flush()
    os._exit(0)
"""

_TURN = """
import json, sys, time
t0 = time.perf_counter()
from store import MessageStore, StoreConfig
from store.timer import timer_service
t1 = time.perf_counter()
timer = {}
init = timer_service.TimerService.__init__
def timed_init(self, *a):
    w, c = time.perf_counter(), time.process_time()
    init(self, *a)
    timer["wall"], timer["cpu"] = time.perf_counter() - w, time.process_time() - c
timer_service.TimerService.__init__ = timed_init
store = MessageStore.open(sys.argv[1], StoreConfig(timer_precision_ms=1000),
                          flush_service=False)
t2 = time.perf_counter()
store.deliver_due()
t3 = time.perf_counter()
pending = store.timer.pending_count()
store.close()
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "first_deliver_due": t3 - t2,
                  "timer_wall": timer["wall"], "timer_cpu": timer["cpu"],
                  "pending": pending}))
"""


def _run(code: str, root: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=root)
    # (run in ``root``: ``python -c`` puts the working directory first on the path)
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True,
                         capture_output=True, text=True, cwd=root)
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pending", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="another checkout of the code")
    ap.add_argument("--close", choices=("clean", "crash"), default="clean")
    args = ap.parse_args()
    codes = {"this": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
    with tempfile.TemporaryDirectory() as tmp:
        built = os.path.join(tmp, "built")
        _run(_BUILD, ROOT, built, str(args.pending), args.close)
        figures: dict[str, list[dict]] = {name: [] for name in codes}
        for _ in range(args.repeat):
            for name, root in codes.items():
                path = os.path.join(tmp, name)
                shutil.rmtree(path, ignore_errors=True)
                shutil.copytree(built, path)
                figures[name].append(json.loads(_run(_TURN, root, path)))
        keys = ("open", "timer_wall", "timer_cpu", "first_deliver_due")
        for name, turns in figures.items():
            best = {k: min(t[k] for t in turns) for k in keys}
            print(f"{name:9s} pending {turns[0]['pending']:,} (best of {len(turns)}): "
                  + ", ".join(f"{k} {best[k]:.3f} s" for k in keys))
        if args.baseline:
            for k in keys:
                this = min(t[k] for t in figures["this"])
                base = min(t[k] for t in figures["baseline"])
                print(f"{k}: {this / base:.2f}x the baseline")


if __name__ == "__main__":
    main()
