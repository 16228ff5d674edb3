"""Store groups through Spark: one stream over several stores, and the sink writing to them."""

from __future__ import annotations

import json
import os

import pytest

from store import Message, StoreConfig, StoreGroup

pytestmark = pytest.mark.spark

CONFIG = StoreConfig(commitlog_file_size_bytes=1 << 20, consume_queue_file_entries=4096)


def _group(tmp_path, n=2, name="group"):
    path = str(tmp_path / name)
    StoreGroup.create(path, n, CONFIG).close()
    return path


def _bodies(rows):
    return sorted(bytes(r["body"]).decode() for r in rows)


def test_batch_read_of_a_group_is_every_stores_messages(spark, tmp_path):
    path = _group(tmp_path)
    with StoreGroup.open(path) as g:
        p = g.producer("pg")
        sent = [p.send(Message("orders", f"o{i}".encode())) for i in range(40)]
        p.send(Message("only-in-one", b"x"), store="store-1")
    assert {r.store_name for r in sent} == {"store-0", "store-1"}
    df = spark.read.format("rmq").option("subscribe", "orders").load(path)
    rows = df.collect()
    assert _bodies(rows) == sorted(f"o{i}" for i in range(40))
    one = spark.read.format("rmq").option("subscribe", "only-in-one").load(path).collect()
    assert _bodies(one) == ["x"]
    # offsets name the store: store-1's queues from offset 1 on, store-0's from the start
    spec = json.dumps({"store-1": {"orders": {str(q): 1 for q in range(4)}}})
    later = (spark.read.format("rmq").option("subscribe", "orders")
             .option("startingOffsets", spec).load(path).collect())
    in_one = sum(1 for r in sent if r.store_name == "store-1")
    assert len(later) == 40 - min(4, in_one)
    with pytest.raises(Exception, match="store group"):
        (spark.read.format("rmq").option("subscribe", "orders")
         .option("startingOffsets", '{"orders": {"0": 1}}').load(path).collect())
    with pytest.raises(Exception, match="not in the group"):
        (spark.read.format("rmq").option("subscribe", "orders")
         .option("startingOffsets", '{"store-9": {"orders": {"0": 1}}}').load(path).collect())
    with pytest.raises(Exception, match="do not exist"):
        spark.read.format("rmq").option("subscribe", "nope").load(path).collect()


def test_a_stream_over_a_group_keys_offsets_by_store(spark, tmp_path):
    path = _group(tmp_path)
    with StoreGroup.open(path) as g:
        p = g.producer("pg")
        for i in range(30):
            p.send(Message("orders", f"a{i}".encode()))
    chk = str(tmp_path / "chk")
    seen = []

    def run():
        q = (spark.readStream.format("rmq").option("subscribe", "orders")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 7)
             .load(path).writeStream.option("checkpointLocation", chk)
             .foreachBatch(lambda df, _: seen.extend(_bodies(df.collect())))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        return q

    q = run()
    assert sorted(seen) == sorted(f"a{i}" for i in range(30))
    offsets = q.lastProgress["sources"][0]["endOffset"]
    offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
    assert sorted(offsets) == ["store-0", "store-1"]
    assert sum(o for s in offsets.values() for per in s.values() for o in per.values()) == 30
    with StoreGroup.open(path) as g:
        p = g.producer("pg")
        for i in range(10):
            p.send(Message("orders", f"b{i}".encode()))
    from rmq_source.lag import checkpoint_offsets, path_lag

    lag = path_lag(path, checkpoint_offsets(chk, raw=True)[1])
    assert lag["lag"] == 10 and sum(lag["stores"].values()) == 10
    assert {r["store"] for r in lag["queues"]} == {"store-0", "store-1"}
    seen.clear()
    run()  # restarted on its checkpoint: only the new messages
    assert sorted(seen) == sorted(f"b{i}" for i in range(10))
    assert path_lag(path, checkpoint_offsets(chk, raw=True)[1])["lag"] == 0


def test_sink_writes_a_group_exactly_once_and_spreads_rows(spark, tmp_path):
    path = _group(tmp_path)
    df = spark.sql("SELECT 'orders' AS topic, concat('row-', id) AS body FROM range(500)")
    df.repartition(3).write.format("rmq").mode("append").save(path)
    rows = spark.read.format("rmq").option("subscribe", "orders").load(path).collect()
    assert _bodies(rows) == sorted(f"row-{i}" for i in range(500))
    with StoreGroup.open(path, read_only=True) as g:
        per = {name: sum(s.max_offset("orders", q) for q in s.queue_ids("orders"))
               for name, s in g.stores()}
    assert sum(per.values()) == 500 and min(per.values()) > 150  # both stores got a share
    with StoreGroup.open(path) as g:
        assert all(s.pending_transaction_stats()["pending"] == 0 for _, s in g.stores())


def test_a_member_that_is_missing_is_named(spark, tmp_path):
    path = _group(tmp_path)
    os.rename(os.path.join(path, "store-1"), os.path.join(path, "elsewhere"))
    with pytest.raises(Exception, match="store-1"):
        spark.read.format("rmq").option("subscribe", "orders").load(path).collect()
    df = spark.sql("SELECT 'orders' AS topic, 'x' AS body")
    with pytest.raises(Exception, match="store-1"):
        df.write.format("rmq").mode("append").save(path)
    assert not os.path.exists(os.path.join(path, "store-1"))  # never created empty
