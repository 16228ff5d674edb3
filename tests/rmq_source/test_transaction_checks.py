"""The check loop as Spark queries: ``view=transaction_checks`` and ``action=end_transaction``."""

from __future__ import annotations

import threading
import time

import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from rmq_source.transaction_checks import (
    TRANSACTION_CHECKS_DDL,
    TRANSACTION_CHECKS_SCHEMA,
    rows_to_batch,
)
from store import LocalTransactionState, Message, MessageStore, StoreConfig

pytestmark = pytest.mark.spark

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
#: the producer's clock runs this far behind: its halves are old enough to check at once
BEHIND_MS = 5_000


class Payments:
    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, view):
        return UNKNOW


class Rows:
    """foreachBatch sink keeping the rows of every micro-batch."""

    def __init__(self, *columns):
        self.columns = columns
        self.rows: list[tuple] = []
        self._lock = threading.Lock()

    def __call__(self, df, batch_id):
        got = [tuple(r) for r in df.select(*self.columns).collect()]
        with self._lock:
            self.rows.extend(got)


def open_store(path):
    """A producer's store: short timeout and interval (recorded for the Spark queries)."""
    config = StoreConfig(transaction_timeout_ms=1000, transaction_check_interval_ms=1000)
    return MessageStore.open(path, config,
                             clock=lambda: time.time_ns() // 1_000_000 - BEHIND_MS)


def test_schema_is_what_spark_expects(spark):
    schema = spark.createDataFrame([], TRANSACTION_CHECKS_DDL).schema
    assert to_arrow_schema(schema, timezone="UTC") == TRANSACTION_CHECKS_SCHEMA
    assert rows_to_batch([]).schema == TRANSACTION_CHECKS_SCHEMA


def test_check_loop_query_resolves_by_join_and_messages_see_commits_once(spark, tmp_path):
    path = str(tmp_path / "store")
    store = open_store(path)
    txp = store.transaction_producer("pay-service", Payments())
    # outcome per order: commit / rollback now, or left to the check loop, which decides
    # from the orders table (paid -> COMMIT, unpaid -> ROLLBACK, no row -> UNKNOWN)
    kinds = ["commit", "rollback", "paid", "unpaid", "absent"]
    sent = {}
    for i in range(40):
        kind = kinds[i % 5]
        arg = {"commit": COMMIT, "rollback": ROLLBACK}.get(kind, UNKNOW)
        r = txp.send_in_transaction(Message("payments", f"p{i}".encode(), tags="paid",
                                            keys=f"o-{i}", properties={"amount": str(i)}),
                                    arg=arg)
        sent[r.transaction_id] = (f"o-{i}", kind)
    orders = spark.createDataFrame(
        [(oid, kind == "paid") for oid, kind in sent.values() if kind in ("paid", "unpaid")],
        "order_id string, paid boolean")

    # a streaming query on the real topic, running while the check loop decides
    seen = Rows("msg_id", "transaction_id", "keys")
    messages = (spark.readStream.format("rmq").option("subscribe", "payments")
                .option("startingOffsets", "earliest").load(path)
                .writeStream.foreachBatch(seen)
                .option("checkpointLocation", str(tmp_path / "chk-messages"))
                .trigger(processingTime="1 second").start())
    try:
        checks = spark.readStream.format("rmq").option("view", "transaction_checks").load(path)
        decisions = (checks.withColumn("order_id", F.col("keys")[0])
                     .join(F.broadcast(orders), "order_id", "left")
                     .select("transaction_id",
                             F.when(F.col("paid"), "COMMIT").when(~F.col("paid"), "ROLLBACK")
                             .otherwise("UNKNOWN").alias("state")))
        loop = (decisions.writeStream.format("rmq").option("action", "end_transaction")
                .queryName("check-loop")  # Spark passes it in the writer's options
                .option("checkpointLocation", str(tmp_path / "chk-loop"))
                .trigger(availableNow=True).start(path))
        loop.awaitTermination(180)
        assert loop.exception() is None, loop.exception()
        assert sum(p["numInputRows"] for p in loop.recentProgress) == 24  # paid/unpaid/absent
        messages.processAllAvailable()
    finally:
        messages.stop()

    expected = {t for t, (_, k) in sent.items() if k in ("commit", "paid")}
    ids = [r[0] for r in seen.rows]
    assert len(ids) == len(set(ids)) and set(ids) == expected  # exactly the commits, once
    assert all(msg_id == tx for msg_id, tx, _ in seen.rows)  # transaction_id is visible
    stats = store.transactions.pending_stats()
    assert stats["pending"] == 8  # the "absent" ones: answered UNKNOWN, asked again later
    store.close()


def test_rows_of_a_round_and_end_transaction_writes(spark, tmp_path):
    path = str(tmp_path / "store")
    store = open_store(path)
    txp = store.transaction_producer("pay-service", Payments())
    ids = [txp.send_in_transaction(Message("payments", f"p{i}".encode(), tags="t",
                                           keys=[f"o-{i}", "x"], properties={"k": "v"}))
           .transaction_id for i in range(6)]
    rows = Rows(*[c.split()[0] for c in TRANSACTION_CHECKS_DDL.split(", ")])
    query = (spark.readStream.format("rmq").option("view", "transaction_checks").load(path)
             .writeStream.foreachBatch(rows)
             .option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    by_id = {r[0]: r for r in rows.rows}
    assert sorted(by_id) == sorted(ids)
    _, group, topic, qid, msg_id, tags, keys, body, props, born, times = by_id[ids[2]]
    assert (group, topic, msg_id, tags, keys, body, props, times) == (
        "pay-service", "payments", ids[2], "t", ["o-2", "x"], b"p2", {"k": "v"}, 1)
    assert 0 <= qid < 4 and born.year >= 2024
    assert not list((tmp_path / "store" / "transaction_checks").glob("*/*.tmp*"))

    def write(pairs):
        (spark.createDataFrame(pairs, "transaction_id string, state string").write
         .format("rmq").option("action", "end_transaction").mode("append").save(path))

    before = store.confirmed_offset()
    with pytest.raises(Exception, match="MAYBE.*allowed: COMMIT, ROLLBACK or UNKNOWN"):
        write([(ids[0], "COMMIT"), (ids[1], "MAYBE")])
    assert store.confirmed_offset() == before  # nothing of the failed batch was applied
    answers = [(ids[0], "COMMIT"), (ids[1], "rollback"), (ids[2], "UNKNOWN"),
               (ids[3], "COMMIT")]
    write(answers)
    write(answers)  # a replayed batch is harmless
    committed = spark.read.format("rmq").option("subscribe", "payments").load(path)
    got = sorted(r[0] for r in committed.select("transaction_id").collect())
    assert got == sorted([ids[0], ids[3]])
    assert store.transactions.is_ended(ids[:3]) == [True, True, False]
    store.close()


def test_server_runs_the_rounds_and_the_query_only_answers(spark, tmp_path):
    from store import StoreServer, last_check_round

    path = str(tmp_path / "store")
    store = open_store(path)
    txp = store.transaction_producer("pay-service", Payments())
    ids = [txp.send_in_transaction(Message("payments", f"p{i}".encode())).transaction_id
           for i in range(5)]
    server = StoreServer(path, check_transactions=True)

    def answer_round(checkpoint):
        rows = Rows("transaction_id", "check_times")
        query = (spark.readStream.format("rmq").option("view", "transaction_checks")
                 .option("checkRounds", "server").load(path).writeStream.foreachBatch(rows)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        return rows.rows

    try:
        assert server.check_round() == 5 and last_check_round(path) == 1
        checkpoint = str(tmp_path / "chk")
        first = answer_round(checkpoint)
        assert sorted(first) == sorted((tx, 1) for tx in ids)  # asked once, by the server
        assert answer_round(checkpoint) == []  # nothing new: the query ran no round itself
        (spark.createDataFrame([(ids[0], "COMMIT"), (ids[1], "ROLLBACK")],
                               "transaction_id string, state string").write.format("rmq")
         .option("action", "end_transaction").mode("append").save(path))
        assert server.check_round() == 3  # the two answered are ended
        second = answer_round(checkpoint)
        assert sorted(second) == sorted((tx, 2) for tx in ids[2:])
        assert server.counters.checks_published == 8
    finally:
        server.close()
    assert store.transactions.is_ended(ids) == [True, True, False, False, False]
    # a checkpoint of one mode refuses the other, naming the option
    with pytest.raises(Exception, match="written with checkRounds=server"):
        (spark.readStream.format("rmq").option("view", "transaction_checks").load(path)
         .writeStream.foreachBatch(lambda df, b: None)
         .option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(availableNow=True).start().awaitTermination(120))
    with pytest.raises(Exception, match="checkRounds='sometimes'"):
        (spark.readStream.format("rmq").option("view", "transaction_checks")
         .option("checkRounds", "sometimes").load(path).writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "chk2")).start().awaitTermination(60))
    store.close()


def test_reader_and_partitions_pickle_without_runner_state(tmp_path):
    import pickle

    from rmq_source.options import parse_options
    from rmq_source.transaction_checks import CheckRoundPartition, TransactionChecksStreamReader
    from rmq_source.writer import EndTransactionError, parse_rows

    path = str(tmp_path / "store")
    MessageStore.open(path).close()
    opts = parse_options({"path": path, "view": "transaction_checks"}, streaming=True)
    reader = TransactionChecksStreamReader(opts)
    first = reader.initialOffset()
    assert reader.initialOffset() == first  # stable within the runner
    try:
        assert reader.latestOffset(first, None) == first  # nothing to ask about: no batch
    finally:
        reader.stop()  # closes the store the runner keeps open
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._initial is None and copy.path == path
    end = {"round": 2, "stream": first["stream"]}
    parts = reader.partitions(first, end)
    assert parts == [CheckRoundPartition(path, first["stream"], 1),
                     CheckRoundPartition(path, first["stream"], 2)]
    assert pickle.loads(pickle.dumps(parts)) == parts
    with pytest.raises(EndTransactionError, match="column 'state'"):
        parse_rows([{"transaction_id": "A" * 32}])
    with pytest.raises(EndTransactionError, match="state=None"):
        parse_rows([{"transaction_id": "A" * 32, "state": None}])
    assert parse_rows([{"transaction_id": "A", "state": " commit_message "}]) == [("A", "COMMIT")]


def test_check_loop_over_a_store_group_asks_every_store_and_answers_land_in_theirs(spark,
                                                                                  tmp_path):
    from store import StoreGroup

    path = str(tmp_path / "group")
    config = StoreConfig(transaction_timeout_ms=1000, transaction_check_interval_ms=1000)
    group = StoreGroup.create(path, 2, config,
                              clock=lambda: time.time_ns() // 1_000_000 - BEHIND_MS)
    txp = group.transaction_producer("pay-service", Payments())
    sent = [txp.send_in_transaction(Message("payments", f"p{i}".encode())) for i in range(6)]
    assert {t.store_name for t in sent} == {"store-0", "store-1"}
    ids = [t.transaction_id for t in sent]
    rows = Rows("transaction_id")
    chk = str(tmp_path / "chk")
    query = (spark.readStream.format("rmq").option("view", "transaction_checks").load(path)
             .writeStream.foreachBatch(rows).option("checkpointLocation", chk)
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    assert sorted(r[0] for r in rows.rows) == sorted(ids)
    offsets = query.lastProgress["sources"][0]["endOffset"]
    assert sorted(__import__("json").loads(offsets) if isinstance(offsets, str) else offsets) \
        == ["store-0", "store-1"]
    answers = [(ids[0], "COMMIT"), (ids[1], "COMMIT"), (ids[2], "ROLLBACK")]
    (spark.createDataFrame(answers, "transaction_id string, state string").write
     .format("rmq").option("action", "end_transaction").mode("append").save(path))
    committed = spark.read.format("rmq").option("subscribe", "payments").load(path)
    assert sorted(r[0] for r in committed.select("transaction_id").collect()) == \
        sorted(ids[:2])
    with pytest.raises(Exception, match="not known to any store"):
        (spark.createDataFrame([("nope", "COMMIT")], "transaction_id string, state string")
         .write.format("rmq").option("action", "end_transaction").mode("append").save(path))
    assert sum(s.pending_transaction_stats()["pending"] for _, s in group.stores()) == 3
    group.close()
