"""The compiled record kernel against a plain copy of the same bytes.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_record_kernel.py [--rows 8192]
        [--body-bytes 100] [--repeat 50] [--baseline-code DIR]

In one run, over chunks of ``--rows`` records (``send_table``'s chunk size by default) of a
100-byte body, an 80-byte properties string and a 5-character topic:

* **plain copy** (the baseline): ``numpy.ndarray.copy`` of a buffer as large as the chunk's
  records, the least any assembly can cost;
* **assemble**: :func:`store.kernels.record_assembly.assemble_records` writing every record (header,
  body, topic, properties) with the body CRCs computed, and again with the CRCs given;
* with ``--baseline-code DIR`` (a checkout of an earlier commit, e.g. a ``git worktree``),
  the same kernel of that code, in a child process, for a before/after ratio.

Prints ns per record (best of ``--repeat``) and each ratio against the plain copy.  Not
collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(root: str, rows: int, body_bytes: int, repeat: int) -> dict:
    """ns per record of the kernel (CRCs computed / given) and of the plain copy, using the
    ``store`` package under ``root``."""
    sys.path.insert(0, root)
    import numpy as np

    from store.formats import record_codec as codec
    from store.base.crc import crc_function
    from store.formats.byte_columns import ByteColumn
    from store.kernels.record_assembly import assemble_records, memcpy_function

    rng = np.random.default_rng(7)

    def column(width: int) -> ByteColumn:
        data = rng.integers(0, 255, rows * width, dtype=np.uint8)
        return ByteColumn(data, np.arange(0, rows * width + 1, width, dtype=np.int64))

    headers = np.zeros((rows, codec.HEADER_SIZE), np.uint8)
    body, props = column(body_bytes), column(80)
    names = ByteColumn(np.frombuffer(b"bench", np.uint8).copy(), np.array([0, 5], np.int64))
    topic_ids = np.zeros(rows, np.int64)
    suffix = ByteColumn(np.zeros(1, np.uint8), np.zeros(rows + 1, np.int64))
    size = codec.FIXED_SIZE + body_bytes + 5 + 80
    starts = np.arange(rows, dtype=np.int64) * size
    out = np.empty(rows * size, np.uint8)
    crc_at = codec.FIELD_OFFSET["body_crc"]

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times) / rows * 1e9

    def assemble(crcs):
        return lambda: assemble_records(
            out, starts, headers, crc_at, body.data, body.starts, body.ends, names.data,
            names.offsets, topic_ids, props.data, props.starts, props.ends, suffix.data,
            suffix.starts, suffix.ends, crcs, crc_function(), memcpy_function())

    source = np.ones(rows * size, np.uint8)
    return {"copy": best(source.copy),
            "computed": best(assemble(np.full(rows, -1, np.int64))),
            "given": best(assemble(np.zeros(rows, np.int64)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--body-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--baseline-code", default=None, help="a checkout of an earlier commit")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rows, args.body_bytes, args.repeat)))
        return
    now = measure(ROOT, args.rows, args.body_bytes, args.repeat)
    before = None
    if args.baseline_code:
        out = subprocess.run([sys.executable, __file__, "--child", args.baseline_code,
                              "--rows", str(args.rows), "--body-bytes", str(args.body_bytes),
                              "--repeat", str(args.repeat)],
                             check=True, capture_output=True, text=True).stdout
        before = json.loads(out.strip().splitlines()[-1])
    print(f"{args.rows} records of {args.body_bytes}-byte bodies per chunk; best of "
          f"{args.repeat}; ns per record")
    print(f"{'case':34s} {'ns':>8s} {'vs copy':>8s}" + ("  before   before/now" if before else ""))
    for key, label in (("copy", "plain copy (baseline)"), ("computed", "assemble, CRCs computed"),
                       ("given", "assemble, CRCs given")):
        line = f"{label:34s} {now[key]:8.1f} {now[key] / now['copy']:7.2f}x"
        if before:
            line += f" {before[key]:8.1f} {before[key] / now[key]:9.2f}x"
        print(line)


if __name__ == "__main__":
    main()
