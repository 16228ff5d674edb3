"""``df.write.format("rmq")`` / ``df.writeStream.format("rmq")``: the exactly-once sink."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os

import pytest

from store import MessageStore

pytestmark = pytest.mark.spark


def _read(spark, path, topic):
    return spark.read.format("rmq").option("subscribe", topic).load(path)


def _write_json(directory, name, rows):
    with open(os.path.join(directory, name), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows))


@pytest.mark.parametrize("commit", ["index", "copy"])
def test_batch_write_every_column_round_trips(spark, tmp_path, commit):
    path = str(tmp_path / "store")  # a new store: the write creates it
    df = spark.sql("""
        SELECT CASE WHEN id % 2 = 0 THEN 'orders' ELSE 'payments' END AS topic,
               concat('order-', id) AS body,
               CASE WHEN id % 3 = 0 THEN NULL ELSE 'created' END AS tags,
               array(concat('o', id), 'all') AS keys,
               map('amount', cast(id * 10 AS string), 'ü', '✓') AS properties
        FROM range(200)""")
    df.write.format("rmq").mode("append").option("sinkCommit", commit).save(path)
    rows = _read(spark, path, "orders,payments").collect()
    assert len(rows) == 200
    by_body = {bytes(r["body"]).decode(): r for r in rows}
    for i in range(200):
        r = by_body[f"order-{i}"]
        assert r["topic"] == ("orders" if i % 2 == 0 else "payments")
        assert r["tags"] == (None if i % 3 == 0 else "created")
        assert list(r["keys"]) == [f"o{i}", "all"]
        assert r["properties"] == {"amount": str(i * 10), "ü": "✓"}
    with MessageStore.open(path) as store:
        assert store.pending_transaction_stats()["pending"] == 0


def test_sharding_key_keeps_each_order_in_one_queue_in_order(spark, tmp_path):
    from store.formats.message import sharding_queue

    path = str(tmp_path / "store")
    df = spark.sql("""
        SELECT 'orders' AS topic, concat('order-', id % 5, ':', id) AS body,
               concat('order-', id % 5) AS sharding_key
        FROM range(300)""").coalesce(1)
    df.write.format("rmq").mode("append").save(path)
    rows = _read(spark, path, "orders").select("queue_id", "queue_offset", "body").collect()
    assert len(rows) == 300
    by_key = {}
    for r in sorted(rows, key=lambda r: (r["queue_id"], r["queue_offset"])):
        key, i = bytes(r["body"]).decode().split(":")
        assert r["queue_id"] == sharding_queue(key, 4)
        by_key.setdefault(key, []).append(int(i))
    assert all(ids == sorted(ids) for ids in by_key.values())  # one task: written order kept


def test_value_column_option_topic_and_delays(spark, tmp_path):
    path = str(tmp_path / "store")
    now = dt.datetime.now(dt.timezone.utc)
    df = spark.createDataFrame(
        [(b"plain", None, None, None), (b"in-1h", 3_600_000, None, None),
         (b"at", None, now + dt.timedelta(hours=2), None), (b"level", None, None, 18)],
        "value binary, delay_ms long, deliver_at timestamp, delay_level int")
    df.write.format("rmq").option("topic", "reminders").mode("append").save(path)
    rows = _read(spark, path, "reminders").collect()
    assert [bytes(r["body"]) for r in rows] == [b"plain"]  # the others are not due
    with MessageStore.open(path) as store:
        stats = store.pending_delayed_stats()
        assert (stats["timer_pending"], stats["schedule_pending"]) == (2, 1)


@pytest.mark.parametrize("select, option, message", [
    ("'t' AS topic, 'x' AS body, 1 AS color", {}, r"column 'color' the sink does not know"),
    ("'t' AS topic", {}, "has no body column"),
    ("'t' AS topic, 'x' AS body", {"topic": "u"}, "both a topic column and option topic"),
    ("'x' AS body", {}, r"no topic for the rows"),
    ("'t' AS topic, 'x' AS body, 1.5D AS delay_ms", {}, r"column 'delay_ms' has type double"),
    ("'t' AS topic, 'x' AS body, array(1) AS keys", {}, r"keys has type array<int>"),
    ("'t' AS topic, 'x' AS body", {"guarantee": "maybe"}, r"guarantee='maybe'"),
])
def test_bad_dataframes_are_refused_at_start(spark, tmp_path, select, option, message):
    path = str(tmp_path / "store")
    writer = spark.range(1).selectExpr(*select.split(", ")).write.format("rmq").mode("append")
    for k, v in option.items():
        writer = writer.option(k, v)
    with pytest.raises(Exception, match=message):
        writer.save(path)


def test_a_bad_row_fails_the_job_and_nothing_is_visible(spark, tmp_path):
    path = str(tmp_path / "store")
    df = spark.sql("SELECT 'orders' AS topic, concat('b', id) AS body, "
                   "CASE WHEN id = 150 THEN 5 END AS delay_ms, "
                   "CASE WHEN id = 150 THEN 2 END AS delay_level FROM range(300)").repartition(2)
    with pytest.raises(Exception, match="more than one of delay_ms, deliver_at, delay_level"):
        df.write.format("rmq").mode("append").save(path)
    with MessageStore.open(path) as store:
        assert "orders" not in store.topics()
        assert store.pending_transaction_stats()["pending"] == 0  # the good task's halves too


def test_stream_replayed_batch_adds_nothing(spark, tmp_path):
    """Spark re-runs the last batch when its commit was not recorded (a driver died between
    the sink's commit and Spark's commit log): the sink recognises it."""
    path, src, ckpt = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "ckpt")
    os.makedirs(src)

    def run():
        q = (spark.readStream.schema("topic string, body string, delay_ms long").json(src)
             .writeStream.format("rmq").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(path))
        q.awaitTermination(120)
        return q

    _write_json(src, "a.json", [{"topic": "s", "body": f"a{i}"} for i in range(40)])
    run()
    _write_json(src, "b.json", [{"topic": "s", "body": f"b{i}", "delay_ms": 600_000 if i == 0
                                 else None} for i in range(25)])
    run()
    assert _read(spark, path, "s").count() == 64
    commits = sorted(glob.glob(os.path.join(ckpt, "commits", "[0-9]*")), key=lambda p: int(
        os.path.basename(p)))
    os.remove(commits[-1])  # Spark forgets it committed the last batch
    crc = os.path.join(ckpt, "commits", f".{os.path.basename(commits[-1])}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    run()
    bodies = [bytes(r["body"]).decode() for r in _read(spark, path, "s").collect()]
    assert len(bodies) == 64 and len(set(bodies)) == 64
    with MessageStore.open(path) as store:
        assert store.pending_transaction_stats()["pending"] == 0
        assert store.pending_delayed_stats()["timer_pending"] == 1  # b0 once, not twice
        batches = store.sink(ckpt).committed_batches()
        assert sorted(batches) == [0, 1]
        # the re-run staged halves of its own, which its commit found replayed and rolled back
        committed = sum(len(m["transactions"]) for m in batches.values())
        assert store.pending_transaction_stats()["transactions"] > committed


def test_stream_at_least_once_and_sink_id(spark, tmp_path):
    path, src = str(tmp_path / "store"), str(tmp_path / "in")
    os.makedirs(src)
    _write_json(src, "a.json", [{"body": f"x{i}"} for i in range(10)])
    q = (spark.readStream.schema("body string").json(src).writeStream.format("rmq")
         .option("topic", "alo").option("guarantee", "at_least_once")
         .option("checkpointLocation", str(tmp_path / "c1")).trigger(availableNow=True)
         .start(path))
    q.awaitTermination(120)
    q = (spark.readStream.schema("body string").json(src).writeStream.format("rmq")
         .option("topic", "named").option("sinkId", "orders-sink")
         .option("checkpointLocation", str(tmp_path / "c2")).trigger(availableNow=True)
         .start(path))
    q.awaitTermination(120)
    assert _read(spark, path, "alo").count() == 10 and _read(spark, path, "named").count() == 10
    with MessageStore.open(path) as store:
        assert list(store.sink("orders-sink").committed_batches()) == [0]
        assert store.sink(str(tmp_path / "c1")).committed_batches() == {}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["store", "group"])
def test_stream_driver_killed_again_and_again_keeps_every_row_exactly_once(tmp_path, kind):
    """A streaming query into the sink whose driver (JVM, Python, workers) is SIGKILLed at
    random moments and restarted on its checkpoint: every input row lands exactly once,
    delayed rows surface once due and never early, no half of the sink stays open.  The
    ``group`` case writes to a store group of two stores (each batch committed store by
    store, so a kill may fall between two stores' commits)."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from store import MessageStore, StoreGroup

    # 20 for the full run (docs/sink.md); the suite runs 2 (each restart starts a driver
    # JVM: about 20 s on two cores; the suite is at its time budget), and the group case
    # only in the full run (about 3.5 minutes in the suite for one kill; its partial commits
    # are covered exhaustively by tests/store/test_group.py's model test, and a store group
    # under a local cluster by tests/rmq_source/test_cluster.py)
    if kind == "group" and "RMQ_SINK_KILLS" not in os.environ:
        pytest.skip("the store-group case runs with RMQ_SINK_KILLS set (docs/sink.md)")
    kills = int(os.environ.get("RMQ_SINK_KILLS", "2"))
    kills = kills if kind == "store" else max(1, kills // 3)
    path, src, ckpt = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "ckpt")
    os.makedirs(src)
    expected = {}
    # a micro-batch per file: enough files that the kills fall inside the stream (each kill
    # lets one batch commit, then kills within 1.5 s: 1-3 batches a kill; the full run's 20
    # kills reach batch ~25), few enough that the final drain stays short
    files, per_file = (5 * kills, 20) if kind == "store" else (max(8, 2 * kills), 40)
    for f in range(files):
        rows = []
        for i in range(per_file):
            body = f"f{f}-r{i}"
            delay = 1500 if i % 10 == 0 else None
            rows.append({"topic": "kill", "body": body, "delay_ms": delay})
            expected[body] = delay
        _write_json(src, f"{f:03d}.json", rows)
    if kind == "group":
        StoreGroup.create(path, 2).close()
    else:
        MessageStore.open(path).close()
    proc_py = os.path.join(os.path.dirname(__file__), "sink_stream_proc.py")
    rng = random.Random(7)

    def committed() -> int:
        return len(glob.glob(os.path.join(ckpt, "commits", "[0-9]*")))

    log = []
    for _ in range(kills):
        before = committed()
        p = subprocess.Popen([sys.executable, proc_py, path, src, ckpt, "run"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        assert p.stdout.readline().strip() == b"started"
        # let the restarted query commit a batch, then kill it at a random moment of the
        # batches that follow (staging, the sink's commit, Spark's own commit log)
        deadline = time.time() + 90
        while committed() == before and time.time() < deadline and before < files:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log.append(committed())
    subprocess.run([sys.executable, proc_py, path, src, ckpt, "drain"], check=True,
                   stderr=subprocess.DEVNULL, timeout=300)
    assert log[0] > 0 and log[-1] < files, f"the kills interrupted nothing: {log}"
    print(f"committed batches after each kill: {log}")
    group = StoreGroup.open(path) if kind == "group" else None
    stores = [s for _, s in group.stores()] if group else [MessageStore.open(path)]

    def visible():
        return [v for store in stores if "kill" in store.topics()
                for q in store.queue_ids("kill")
                for v in store.pull("kill", q, store.min_offset("kill", q), 100_000)]

    def pending():
        return sum(store.pending_delayed_stats()["pending"] for store in stores)

    try:
        seen = {}
        for v in visible():
            seen.setdefault(v.body.decode(), []).append(v)
        # delayed rows not yet due are pending; none is visible early
        for body, views in seen.items():
            assert len(views) == 1, f"{body} surfaced {len(views)} times"
            if expected[body]:
                assert views[0].store_timestamp_ms >= views[0].born_timestamp_ms + 1500 - 1
        assert set(seen) <= set(expected)
        assert len(seen) + pending() == len(expected)
        deadline = time.time() + 15  # due within delay + timer precision
        while pending() and time.time() < deadline:
            time.sleep(0.2)
            for store in stores:
                store.deliver_due()
        assert sorted(v.body.decode() for v in visible()) == sorted(expected)
        assert all(store.pending_transaction_stats()["pending"] == 0 for store in stores)
        if group:  # both stores took a share of the rows
            assert all(len([v for q in s.queue_ids("kill")
                            for v in s.pull("kill", q, 0, 100_000)]) > len(expected) // 4
                       for s in stores)
    finally:
        for store in stores:
            store.close()
