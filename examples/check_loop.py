"""The transaction check loop as a Spark query: resolve payments by joining the orders table.

A payment service sends each payment as a transactional message.  Some local transactions
never report their outcome (a crash, a timeout): those half messages wait in the store.  The
check-loop query reads ``view=transaction_checks`` (the transactions the store asks about),
joins them with the orders table and answers COMMIT (the order is paid) or ROLLBACK through
``action=end_transaction``.  Committed payments then appear in the ``payments`` topic.

Run: ``PYTHONPATH=. python examples/check_loop.py [STORE]``; any number of times on one store
(each run reads the payments committed after it started; its checkpoint is removed).
"""

import os
import sys
import tempfile
import time

from store import LocalTransactionState, Message, MessageStore, StoreConfig


class PaymentService:
    """Local transaction: commits even-numbered orders, never answers for the others."""

    def execute_local_transaction(self, message, order_no):
        return LocalTransactionState.COMMIT_MESSAGE if order_no % 2 == 0 else \
            LocalTransactionState.UNKNOW

    def check_local_transaction(self, view):
        return LocalTransactionState.UNKNOW  # the Spark query answers instead


def main(spark=None, store_path=None):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(  # Spark's workers import store and rmq_source
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get(
            "PYTHONPATH", "")])
    from _session import local_spark, offsets_now
    from pyspark.sql import functions as F

    spark = spark or local_spark("rmq-check-loop")
    store_path = store_path or tempfile.mkdtemp(prefix="rmq-check-loop-")
    # a short immunity so the example does not wait RocketMQ's 6 s (recorded in the store)
    with MessageStore.open(store_path, StoreConfig(transaction_timeout_ms=500)) as store:
        start = offsets_now(store, ["payments"])  # this run's payments come after
        payer = store.transaction_producer("pay-service", PaymentService())
        for n in range(20):
            payer.send_in_transaction(Message("payments", b'{"amount": 10}', keys=f"o-{n}"),
                                      arg=n)
    orders = spark.createDataFrame([(f"o-{n}", n % 3 != 0) for n in range(20)],
                                   "order_id string, paid boolean")
    time.sleep(0.6)  # past the immunity: the open transactions are due for a check

    checks = spark.readStream.format("rmq").option("view", "transaction_checks").load(store_path)
    answers = (checks.withColumn("order_id", F.col("keys")[0]).join(orders, "order_id")
               .select("transaction_id",
                       F.when(F.col("paid"), "COMMIT").otherwise("ROLLBACK").alias("state")))
    with tempfile.TemporaryDirectory(prefix="rmq-check-loop-chk-") as checkpoint:
        query = (answers.writeStream.format("rmq").option("action", "end_transaction")
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start(store_path))
        query.awaitTermination()
    asked = sum(p["numInputRows"] for p in query.recentProgress)

    paid = (spark.read.format("rmq").option("subscribe", "payments")
            .option("startingOffsets", start).load(store_path))
    keys = sorted(r["keys"][0] for r in paid.select("keys").collect())
    print(f"check loop asked about {asked} transactions; committed payments: {keys}")
    expected = sorted(f"o-{n}" for n in range(20) if n % 2 == 0 or n % 3 != 0)
    assert asked == 10 and keys == expected, (asked, keys)
    return keys


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(store_path=sys.argv[1] if len(sys.argv) > 1 else None)
