"""Delayed "close if unpaid" messages surfacing in a streaming query once they are due.

Run it any number of times on one store: the query starts where the topic ended when the
run started, and its checkpoint is removed when it stops.
"""

import sys
import tempfile
import time

from store import Message, MessageStore


def main(spark=None, store_path=None, delays_ms=(500, 1000, 1500, 2000)):
    from _session import local_spark, offsets_now

    spark = spark or local_spark()
    store_path = store_path or tempfile.mkdtemp(prefix="rmq-example-")
    with MessageStore.open(store_path) as store:
        start = offsets_now(store, ["order_timeouts"])  # this run's time-outs come after
        producer = store.producer("order-service")
        sent_at = time.time()
        for i, delay in enumerate(delays_ms):
            producer.send(Message("order_timeouts", f"close o-{i} if unpaid".encode(),
                                  tags="timeout", keys=f"o-{i}"), delay_ms=delay)

    seen = []

    def collect(df, batch_id):
        now_ms = time.time_ns() // 1_000_000
        for r in df.select("keys", "deliver_timestamp", "store_timestamp").collect():
            seen.append((r["keys"][0], int(r["deliver_timestamp"].timestamp() * 1000), now_ms))

    with tempfile.TemporaryDirectory(prefix="rmq-chk-") as checkpoint:
        query = (spark.readStream.format("rmq").option("subscribe", "order_timeouts")
                 .option("startingOffsets", start).load(store_path)
                 .writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
                 .trigger(processingTime="200 milliseconds").start())
        deadline = sent_at + max(delays_ms) / 1000 + 120  # (a cold Spark: a minute or more)
        while len(seen) < len(delays_ms) and time.time() < deadline:
            time.sleep(0.1)
        query.stop()
    for key, due, seen_ms in sorted(seen, key=lambda s: s[1]):
        print(f"{key}: due {due}, seen {seen_ms - due} ms after it was due")
    assert len(seen) == len(delays_ms), seen
    assert all(seen_ms >= due for _, due, seen_ms in seen), "a message surfaced early"
    return seen


if __name__ == "__main__":
    main(store_path=sys.argv[1] if len(sys.argv) > 1 else None)
