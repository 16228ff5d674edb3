"""Spark over ``rmq://``: batch and stream reads, the exactly-once sink and transaction ends of
a store served by ``rmq serve --listen``, the executors given only the URL and the token."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pytest

from store import Message, StoreServer, connect

pytestmark = pytest.mark.spark
TOKEN = "spark-token"


@pytest.fixture
def served(tmp_path):
    """A served store whose directory Spark is never told: only its URL."""
    server = StoreServer(str(tmp_path / "hidden" / "store"), listen="127.0.0.1:0", token=TOKEN)
    yield server
    server.close()


def _bodies(spark, url, topic, **options):
    reader = spark.read.format("rmq").option("subscribe", topic).option("token", TOKEN)
    for k, v in options.items():
        reader = reader.option(k, v)
    return sorted(r.body for r in reader.load(url).select("body").collect())


def test_a_batch_read_through_rmq_url(spark, served):
    with connect(served.url, token=TOKEN) as remote:
        remote.producer("g").send_table(pa.table({
            "topic": ["orders"] * 300, "body": [b"o%03d" % i for i in range(300)],
            "tags": ["a" if i % 3 else "b" for i in range(300)]}))
    assert _bodies(spark, served.url, "orders") == [b"o%03d" % i for i in range(300)]
    assert len(_bodies(spark, served.url, "orders", tags="b")) == 100
    rows = (spark.read.format("rmq").option("subscribe", "orders").option("token", TOKEN)
            .load(served.url).groupBy("queue_id").count().collect())
    assert sum(r["count"] for r in rows) == 300


def test_a_wrong_token_or_an_option_of_a_directory_is_a_clear_error(spark, served, tmp_path):
    with pytest.raises(Exception, match="token"):
        (spark.read.format("rmq").option("subscribe", "orders").option("token", "nope")
         .load(served.url).collect())
    with pytest.raises(Exception, match="applies to a served store only"):
        (spark.read.format("rmq").option("subscribe", "orders").option("token", "x")
         .load(str(tmp_path)).collect())


def test_the_sink_writes_exactly_once_through_rmq_url(spark, served):
    df = spark.createDataFrame([("paid", f"p{i}".encode(), 0 if i % 2 else 3_600_000)
                                for i in range(200)], "topic string, body binary, delay_ms int")
    (df.write.format("rmq").option("token", TOKEN).option("sinkId", "job-a")
     .mode("append").save(served.url))
    got = _bodies(spark, served.url, "paid")
    assert got == sorted(f"p{i}".encode() for i in range(200) if i % 2)  # none early
    with connect(served.url, token=TOKEN) as remote:
        assert remote.sink("job-a", "rmq-spark-sink").open_halves() == []


def test_a_stream_reads_each_message_once_across_restarts(spark, served, tmp_path):
    checkpoint = str(tmp_path / "cp")
    seen: list[bytes] = []
    lock = threading.Lock()

    def collect(df, batch_id):
        rows = [r.body for r in df.select("body").collect()]
        with lock:
            seen.extend(rows)

    def run():
        (spark.readStream.format("rmq").option("subscribe", "events").option("token", TOKEN)
         .option("startingOffsets", "earliest")
         .load(served.url).writeStream.foreachBatch(collect)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
         .awaitTermination(120))

    with connect(served.url, token=TOKEN) as remote:
        p = remote.producer("g")
        p.send_table(pa.table({"body": [b"e%d" % i for i in range(100)]}), topic="events")
        run()
        p.send_table(pa.table({"body": [b"f%d" % i for i in range(50)]}), topic="events")
        sent = time.monotonic()
        p.send(Message("events", b"due-soon"), delay_ms=3000)
        run()
        if time.monotonic() - sent < 3.0:  # (a slow run may pass the due time)
            assert b"due-soon" not in seen  # not due yet: never early
        time.sleep(max(0.0, sent + 3.5 - time.monotonic()))
        run()  # deliverDue asks the server to deliver what is due
    assert sorted(seen) == sorted([b"e%d" % i for i in range(100)]
                                  + [b"f%d" % i for i in range(50)] + [b"due-soon"])


def test_transaction_ends_through_rmq_url(spark, served):
    class Open:
        def execute_local_transaction(self, message, arg):
            return None

        def check_local_transaction(self, view):
            return None

    with connect(served.url, token=TOKEN) as remote:
        txp = remote.transaction_producer("pay", Open())
        ids = [txp.send_in_transaction(Message("pay", b"t%d" % i)).transaction_id
               for i in range(4)]
    answers = spark.createDataFrame([(ids[0], "COMMIT"), (ids[1], "COMMIT"),
                                     (ids[2], "ROLLBACK")], "transaction_id string, state string")
    (answers.write.format("rmq").option("action", "end_transaction").option("token", TOKEN)
     .mode("append").save(served.url))
    assert _bodies(spark, served.url, "pay") == [b"t0", b"t1"]


def test_the_check_loop_runs_over_rmq_url(spark, tmp_path):
    """view=transaction_checks against a served store: the server runs the round and keeps
    its rows, the executors fetch them, the answers end the transactions there."""
    server = StoreServer(str(tmp_path / "s"), {"transaction_timeout_ms": 300},
                         listen="127.0.0.1:0", token=TOKEN)
    try:
        class Open:
            def execute_local_transaction(self, message, arg):
                return None

            def check_local_transaction(self, view):
                return None

        with connect(server.url, token=TOKEN) as remote:
            txp = remote.transaction_producer("pay", Open())
            for i in range(3):
                txp.send_in_transaction(Message("pay", b"open-%d" % i, keys=f"o-{i}"))
        time.sleep(0.6)  # past transaction_timeout_ms: the round asks about them
        (spark.readStream.format("rmq").option("view", "transaction_checks")
         .option("token", TOKEN).load(server.url)
         .selectExpr("transaction_id", "CASE WHEN keys[0] = 'o-1' THEN 'ROLLBACK' "
                     "ELSE 'COMMIT' END AS state")
         .writeStream.format("rmq").option("action", "end_transaction").option("token", TOKEN)
         .option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(availableNow=True).start(server.url).awaitTermination(120))
        assert _bodies(spark, server.url, "pay") == [b"open-0", b"open-2"]
        # the round's rows were kept on the server, not in the query's (or Spark's) files
        rounds = os.path.join(server.path, "transaction_checks")
        assert len(os.listdir(rounds)) == 1
    finally:
        server.close()
