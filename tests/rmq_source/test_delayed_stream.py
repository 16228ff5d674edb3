"""Delayed messages surface in a streaming query once due, exactly once, never before.

The query's driver-side runner delivers due messages itself (``deliverDue`` defaults to true)
through its own writable store, while this process keeps sending into the same store: real
time, real processes, short delays.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from store import Message, MessageStore

pytestmark = pytest.mark.spark

N_TIMER = 10_000


class Seen:
    """foreachBatch sink: (msg_id, store ms, deliver ms, wall ms when the batch ran)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int | None, int]] = []
        self._lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        got = df.selectExpr("msg_id", "unix_millis(store_timestamp)",
                            "unix_millis(deliver_timestamp)").collect()
        wall = time.time_ns() // 1_000_000
        with self._lock:
            self.rows.extend((r[0], r[1], r[2], wall) for r in got)

    def count(self) -> int:
        with self._lock:
            return len(self.rows)


def test_streaming_query_sees_delayed_messages_once_and_never_early(spark, store_path,
                                                                    small_config, tmp_path):
    store = MessageStore.open(store_path, small_config)  # the real clock, as Spark's runner
    p = store.producer("delayed-stream")
    p.send(Message("orders", b"warm-up"))
    seen = Seen()
    query = (spark.readStream.format("rmq").option("subscribe", "orders")
             .option("startingOffsets", "earliest").load(store_path)
             .writeStream.foreachBatch(seen)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 120
        while not seen.count() and time.monotonic() < deadline:  # Spark's first batch is slow
            assert query.exception() is None, query.exception()
            time.sleep(0.1)
        rng = random.Random(11)
        due: dict[str, int] = {}
        cancelled = set()
        for i in range(N_TIMER):
            r = p.send(Message("orders", b"t%d" % i), delay_ms=rng.randint(500, 5_000))
            due[r.msg_id] = r.deliver_at_ms
            if i % 500 == 0:  # cancel one in 500, right away, so it is still pending
                r = p.send(Message("orders", b"c%d" % i), delay_ms=5_000)
                due[r.msg_id] = r.deliver_at_ms
                assert p.cancel("orders", r.msg_id)
                cancelled.add(r.msg_id)
        for i in range(50):
            r = p.send(Message("orders", b"l%d" % i), delay_level=1)
            due[r.msg_id] = r.deliver_at_ms
        expected = len(due) - len(cancelled) + 1
        deadline = time.monotonic() + 90
        while seen.count() < expected and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        time.sleep(1.0)  # anything extra (a duplicate) would show up by now
    finally:
        query.stop()
        store.close()

    ids = [r[0] for r in seen.rows]
    assert len(ids) == len(set(ids)) == expected, "every message exactly once"
    assert not set(ids) & cancelled
    late = []
    for msg_id, stored, deliver, wall in seen.rows:
        if msg_id not in due:
            continue  # the warm-up message
        assert deliver is not None and deliver >= due[msg_id] - 1_000  # levels: approximate
        assert stored >= deliver, "visible before its due time"
        assert wall >= deliver, "seen by the query before its due time"
        late.append(wall - deliver)
    late.sort()
    # prompt, but generous: CI shares two cores (bench/bench_timer.py measures lateness)
    assert late[len(late) // 2] < 20_000, f"median lateness {late[len(late) // 2]} ms"
