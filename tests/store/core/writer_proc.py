"""A writer (or reader) process for the crash and multi-process tests (not a test module).

Writer: ``python writer_proc.py write --store DIR --writer W --count N --topics a,b
[--sync] [--ack FILE] [--batch-every K] [--hang-mid-write] [--wait-for FILE]`` sends
messages whose body is a pure function of (writer, seq) (see :func:`body_of`), alternating
single sends and batches.  After each send returns it appends ``msg_id topic queue_id
queue_offset commitlog_offset writer seq`` lines to the ack file; a line is written only
once the message was stored.

``--hang-mid-write``: the first batch writes half its bytes, prints ``MIDWRITE`` and sleeps,
so the test can SIGKILL it inside an append (the ``write_in_progress`` repair path).

Reader: ``python writer_proc.py read --store DIR --topics a,b --expect N --out FILE`` polls
every queue of the topics until it has read N messages, checking that each pull continues
exactly at the offset asked (no gap), that every body matches its (writer, seq), and writes
``topic queue_id queue_offset writer seq`` lines to FILE.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

from store import Message, MessageStore, StoreConfig  # noqa: E402

SMALL = dict(commitlog_file_size_bytes=64 * 1024, consume_queue_file_entries=1000,
             timer_precision_ms=100, timer_wheel_slots=4096, timer_roll_window_slots=1024,
             timer_log_file_size_bytes=64 * 1024)


def body_of(writer: int, seq: int) -> bytes:
    """The body of message ``seq`` of ``writer``: 20 to 1500 bytes, checkable."""
    prefix = f"w{writer}:s{seq}:".encode()
    digest = hashlib.sha256(prefix).hexdigest().encode()
    length = 20 + (seq * 37) % 1480
    return (prefix + digest * (length // len(digest) + 1))[:length]


def message(topic: str, writer: int, seq: int) -> Message:
    return Message(topic, body_of(writer, seq), tags=f"w{writer}", keys=f"s{seq}",
                   properties={"w": str(writer), "s": str(seq)})


def check_view(view) -> tuple[int, int]:
    """(writer, seq) of a message, after checking its body is exactly what was sent."""
    writer, seq = int(view.properties["w"]), int(view.properties["s"])
    if view.body != body_of(writer, seq):
        raise AssertionError(f"torn or wrong body at {view.topic}/{view.queue_id}/"
                             f"{view.queue_offset}: writer {writer} seq {seq}")
    return writer, seq


def config(sync: bool) -> StoreConfig:
    return StoreConfig(flush_disk_type="SYNC_FLUSH" if sync else "ASYNC_FLUSH", **SMALL)


def write(args) -> None:
    topics = args.topics.split(",")
    ack = os.open(args.ack, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if args.ack else None
    if args.hang_mid_write:
        from store.files import commit_log

        original = commit_log.CommitLog.write

        def half_then_hang(self, offset, data):
            if len(data) > 64:
                original(self, offset, data[:len(data) // 2])
                print("MIDWRITE", flush=True)
                time.sleep(600)
            original(self, offset, data)

        commit_log.CommitLog.write = half_then_hang
    with MessageStore.open(args.store, config(args.sync)) as store:
        producer = store.producer(f"writer-{args.writer}")
        print("READY", flush=True)
        while args.wait_for and not os.path.exists(args.wait_for):
            time.sleep(0.001)  # start together with the other writers
        seq = 0
        while seq < args.count:
            topic = topics[seq % len(topics)]
            if (args.batch_every and (seq // 7) % args.batch_every == 0
                    or args.hang_mid_write and not args.single):
                n = min(1 + seq % 23, args.count - seq)
                msgs = [message(topic, args.writer, seq + i) for i in range(n)]
                results = producer.send_batch(msgs)
            else:
                msgs = [message(topic, args.writer, seq)]
                results = [producer.send(msgs[0])]
            if ack is not None:
                lines = "".join(
                    f"{r.msg_id} {r.topic} {r.queue_id} {r.queue_offset} {r.commitlog_offset} "
                    f"{args.writer} {seq + i}\n" for i, r in enumerate(results))
                os.write(ack, lines.encode())
            seq += len(msgs)
    print("DONE", flush=True)


def read(args) -> None:
    topics = args.topics.split(",")
    out = open(args.out, "w")
    deadline = time.monotonic() + args.timeout
    next_offset: dict[tuple[str, int], int] = {}
    got = 0
    store = None
    while got < args.expect:
        if time.monotonic() > deadline:
            raise SystemExit(f"reader timed out with {got} of {args.expect} messages")
        if store is None:
            try:
                store = MessageStore.open(args.store, read_only=True)
            except Exception:
                time.sleep(0.01)
                continue
        for topic in topics:
            if topic not in store.topics():
                continue
            for q in store.queue_ids(topic):
                offset = next_offset.get((topic, q), 0)
                views = store.pull(topic, q, offset, 64)
                for i, v in enumerate(views):
                    if v.queue_offset != offset + i:
                        raise AssertionError(f"gap: asked {offset + i}, got {v.queue_offset}")
                    writer, seq = check_view(v)
                    out.write(f"{topic} {q} {v.queue_offset} {writer} {seq}\n")
                next_offset[(topic, q)] = offset + len(views)
                got += len(views)
        time.sleep(0.002)
    out.close()
    store.close()
    print("DONE", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["write", "read"])
    ap.add_argument("--store", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--writer", type=int, default=0)
    ap.add_argument("--count", type=int, default=10**9)
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--ack")
    ap.add_argument("--batch-every", type=int, default=0)
    ap.add_argument("--hang-mid-write", action="store_true")
    ap.add_argument("--wait-for", help="start sending once this file exists")
    ap.add_argument("--single", action="store_true",
                    help="with --hang-mid-write: hang inside a single send, not a batch")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    write(args) if args.mode == "write" else read(args)


if __name__ == "__main__":
    main()
