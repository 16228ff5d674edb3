"""Append throughput of the store against a raw sequential write of the same bytes.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_append.py [--messages N] [--batch-size B]

Measures, in one run and one directory:

* ``raw write``   the exact CommitLog bytes the batch run produced, written again with
  ``os.write`` in 1 MiB chunks to a fresh file in the same directory (the baseline);
* ``send_batch``  ``Producer.send_batch`` of ``B`` 100-byte messages at a time (ASYNC_FLUSH);
* ``send``        ``Producer.send`` one 100-byte message at a time (ASYNC_FLUSH);

and prints messages/s, MB/s and each ratio against the raw write (bytes per second of the
same record bytes).  Every message has a tag, a key and one user property, so the records
look like real traffic.  Not collected by pytest.
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

from store import Message, MessageStore, StoreConfig  # noqa: E402

BODY_BYTES = 100
CHUNK = 1024 * 1024


def make_messages(n: int, topic: str = "bench") -> list[Message]:
    body = bytes(range(BODY_BYTES))
    return [Message(topic, body, tags="TagA", keys=f"k{i}", properties={"p": "v"})
            for i in range(n)]


def run_batch(path: str, messages: list[Message], batch_size: int) -> tuple[float, int]:
    """Seconds to ``send_batch`` every message, and the CommitLog bytes written."""
    with MessageStore.open(path, StoreConfig()) as store:
        producer = store.producer("bench")
        producer.send_batch(messages[:1])  # create the topic and the first segment
        t0 = time.perf_counter()
        for i in range(1, len(messages), batch_size):
            producer.send_batch(messages[i:i + batch_size])
        elapsed = time.perf_counter() - t0
        return elapsed, store.confirmed_offset()


def run_single(path: str, messages: list[Message]) -> tuple[float, int]:
    """Seconds to ``send`` every message one at a time, and the CommitLog bytes written."""
    with MessageStore.open(path, StoreConfig()) as store:
        producer = store.producer("bench")
        producer.send(messages[0])
        t0 = time.perf_counter()
        for m in messages[1:]:
            producer.send(m)
        elapsed = time.perf_counter() - t0
        return elapsed, store.confirmed_offset()


def commitlog_bytes(path: str, length: int) -> bytes:
    """The first ``length`` bytes of the CommitLog (one segment at these sizes)."""
    seg = os.path.join(path, "commitlog", "0" * 20)
    with open(seg, "rb") as fh:
        return fh.read(length)


def run_raw(directory: str, data: bytes, repeat: int = 3) -> float:
    """Best seconds of ``repeat`` sequential ``os.write`` runs of ``data`` in 1 MiB chunks."""
    best = float("inf")
    view = memoryview(data)
    for r in range(repeat):
        target = os.path.join(directory, f"raw-{r}")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            t0 = time.perf_counter()
            for i in range(0, len(view), CHUNK):
                os.write(fd, view[i:i + CHUNK])
            best = min(best, time.perf_counter() - t0)
        finally:
            os.close(fd)
            os.unlink(target)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000, help="messages for send_batch")
    ap.add_argument("--single", type=int, default=20_000, help="messages for send")
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp directory)")
    args = ap.parse_args()

    base = tempfile.mkdtemp(prefix="rmq-bench-", dir=args.dir)
    try:
        messages = make_messages(args.messages)
        batch_s, batch_bytes = run_batch(os.path.join(base, "batch"), messages,
                                         args.batch_size)
        raw_s = run_raw(base, commitlog_bytes(os.path.join(base, "batch"), batch_bytes))
        single_s, single_bytes = run_single(os.path.join(base, "single"),
                                            messages[:args.single])
        raw_rate = batch_bytes / raw_s
        n_batch = args.messages - 1
        n_single = args.single - 1
        per_msg = batch_bytes / args.messages
        rows = [
            ("raw write (baseline)", batch_bytes / per_msg / raw_s, raw_rate),
            (f"send_batch ({args.batch_size}/batch)", n_batch / batch_s,
             n_batch * per_msg / batch_s),
            ("send (one at a time)", n_single / single_s,
             n_single * (single_bytes / args.single) / single_s),
        ]
        print(f"{args.messages} messages of {BODY_BYTES}-byte bodies, {per_msg:.0f} bytes per "
              f"record; python {sys.version.split()[0]}")
        print(f"{'case':<28}{'msgs/s':>14}{'MB/s':>10}{'vs raw':>10}")
        for name, msgs, bps in rows:
            print(f"{name:<28}{msgs:>14,.0f}{bps / 1e6:>10.1f}{bps / raw_rate:>10.3f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
