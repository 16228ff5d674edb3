"""A batch backfill: read a store by a store-time range and write it to Parquet.

The orders are stamped by a simulated clock, six hours of them in a few milliseconds.  Each
run's hours start after the newest order already stored, so the example runs any number of
times on one store and its range holds this run's orders only.
"""

import os
import sys
import tempfile

from store import Message, MessageStore


def main(spark=None, store_path=None, out_dir=None):
    from _session import local_spark, newest_store_time_ms

    spark = spark or local_spark()
    store_path = store_path or tempfile.mkdtemp(prefix="rmq-example-")
    out_dir = out_dir or os.path.join(tempfile.mkdtemp(prefix="rmq-backfill-"), "orders.parquet")
    clock = {"now": 1_700_000_000_000}
    with MessageStore.open(store_path, clock=lambda: clock["now"]) as store:
        newest = newest_store_time_ms(store, "orders")  # (an earlier run's last order)
        if newest is not None:
            clock["now"] = max(clock["now"], newest + 3_600_000)
        first = clock["now"]
        producer = store.producer("order-service")
        for hour in range(6):  # six hours of orders, 20 an hour
            for i in range(20):
                producer.send(Message("orders", f"h{hour} o{i}".encode(), keys=f"o-{hour}-{i}"))
                clock["now"] += 180_000

    start = first + 2 * 3_600_000  # hours 2 and 3 only
    end = start + 2 * 3_600_000
    df = (spark.read.format("rmq").option("subscribe", "orders")
          .option("startingTimestamp", str(start)).option("endingTimestamp", str(end))
          .load(store_path))
    df.write.mode("overwrite").parquet(out_dir)
    back = spark.read.parquet(out_dir)
    n = back.count()
    print(f"backfilled {n} orders stored between {start} and {end} into {out_dir}")
    assert n == 40, n
    return n


if __name__ == "__main__":
    main(store_path=sys.argv[1] if len(sys.argv) > 1 else None)
