"""What the first-use consistency check of a message-key index file costs.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_index_check.py [--slots S] [--entries N]

Builds one full index file of ``--slots`` slots and ``--entries`` entries (RocketMQ's
defaults, 5,000,000 and 20,000,000: 420 MB) with random key hashes, through the store's own
put, then times :meth:`~store.files.index_file.IndexFile.check_chains` (the check a process
runs the first time it uses the file) on a fresh mapping: best and worst of ``--repeat``,
wall and CPU seconds, the file in the page cache (the check reads every slot and entry;
the first turn includes loading, or on a fresh install compiling, the compiled loop).
The baseline printed beside it is
:meth:`~store.files.index_file.IndexFile.verify` (``rmq repair``'s check, which reads the
same bytes), so the ratio says what the chain check adds to a read of the file; and what
a writer's seal costs: :func:`~store.files.index_seal.file_seal` (the CRC32 of each block of
every byte a lookup reads, on a fresh mapping too: what a writer computes to seal a file or
take it by a seal; a reader checks only the blocks its lookups read).

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np

from store.files.index_file import IndexFile
from store.files.index_seal import file_seal


def build(path: str, slots: int, entries: int) -> None:
    f = IndexFile(path, slots, entries, create=True)
    rng = np.random.default_rng(1)
    stamp = 1_700_000_000_000
    step = 1 << 20
    phy = 0
    while not f.is_full():
        hashes = rng.integers(0, 1 << 31, step, dtype=np.int64)
        phys = phy + np.arange(step, dtype=np.int64) * 100
        phy = int(phys[-1]) + 100
        f.put(hashes, phys, np.full(step, stamp, dtype=np.int64))
    f.flush()
    f.close()


def timed(path: str, slots: int, entries: int, method: str
          ) -> tuple[tuple[float, float], object]:
    f = IndexFile(path, slots, entries, read_only=True)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        result = (f.check_chains() if method == "check" else f.verify(1 << 62)
                  if method == "verify" else file_seal(f) and None)
        return (time.perf_counter() - t0, time.process_time() - c0), result
    finally:
        f.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=5_000_000)
    parser.add_argument("--entries", type=int, default=20_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "20260101000000000")
        t0 = time.perf_counter()
        build(path, args.slots, args.entries)
        print(f"built {args.entries:,} entries over {args.slots:,} slots in "
              f"{time.perf_counter() - t0:.1f} s")
        figures: dict[str, list[tuple[float, float]]] = {"check": [], "verify": [], "seal": []}
        for _ in range(args.repeat):
            for method, turns in figures.items():
                seconds, result = timed(path, args.slots, args.entries, method)
                assert result is None, result
                turns.append(seconds)
        for method, seconds in figures.items():
            wall, cpu = zip(*seconds)
            print(f"{method:7s} wall best {min(wall):.3f} s, worst {max(wall):.3f} s; "
                  f"CPU best {min(cpu):.3f} s, worst {max(cpu):.3f} s")
        print("check / verify (best CPU): "
              f"{min(c for _, c in figures['check']) / min(c for _, c in figures['verify']):.2f}; "
              "seal / check (best CPU): "
              f"{min(c for _, c in figures['seal']) / min(c for _, c in figures['check']):.3f}")


if __name__ == "__main__":
    main()
