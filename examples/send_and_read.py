"""Send messages with tags, keys and properties, then read them back with spark.read.

Run it any number of times on one store: each run reads from where the queues ended when it
started, so it counts its own messages only.
"""

import sys
import tempfile

from store import Message, MessageStore


def main(spark=None, store_path=None):
    from _session import local_spark, offsets_now

    spark = spark or local_spark()
    store_path = store_path or tempfile.mkdtemp(prefix="rmq-example-")
    with MessageStore.open(store_path) as store:
        start = offsets_now(store, ["orders", "audit"])  # this run's messages come after
        producer = store.producer("example")
        for i in range(100):
            producer.send(Message("orders", f"order {i}".encode(), tags="created",
                                  keys=f"o-{i}", properties={"region": "eu" if i % 2 else "us"}))
        producer.send_batch([Message("audit", f"event {i}".encode()) for i in range(50)])

    df = (spark.read.format("rmq").option("subscribe", "orders,audit")
          .option("startingOffsets", start).load(store_path))
    counts = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    print(counts)
    df.where("topic = 'orders'").select("queue_id", "queue_offset", "keys", "body",
                                        "properties").show(5, truncate=False)
    assert counts == {"orders": 100, "audit": 50}, counts
    return counts


if __name__ == "__main__":
    main(store_path=sys.argv[1] if len(sys.argv) > 1 else None)
