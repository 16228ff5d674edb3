"""The sink's ``key``, ``schedule_key``, ``cron`` / ``every_ms`` columns: replace-by-key
delays, key cancels and schedule definitions, exactly once across a replayed micro-batch."""

from __future__ import annotations

import glob
import json
import os
import time

import pytest

from store import Message, MessageStore

pytestmark = pytest.mark.spark

SCHEMA = ("topic string, body string, key string, delay_ms long, schedule_key string, "
          "every_ms long, cron string")


def _write_json(directory, name, rows):
    with open(os.path.join(directory, name), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows))


def _bodies(store, topic):
    if topic not in store.topics():
        return []
    return sorted(b for q in store.queue_ids(topic) for b in store.read_arrow(
        topic, q, 0, store.max_offset(topic, q)).column("body").to_pylist())


def test_keys_and_schedules_from_a_stream_take_effect_once(spark, tmp_path):
    path, src, ckpt = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "ckpt")
    os.makedirs(src)

    def run():
        q = (spark.readStream.schema(SCHEMA).json(src)
             .writeStream.format("rmq").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(path))
        q.awaitTermination(120)

    _write_json(src, "a.json", [
        {"topic": "orders", "body": "k1-v1", "key": "k1", "delay_ms": 600_000},
        {"topic": "orders", "body": "k2-v1", "key": "k2", "delay_ms": 600_000},
        {"topic": "orders", "body": "plain", "delay_ms": 600_000},
        {"topic": "reminders", "body": "ping", "schedule_key": "s1", "every_ms": 3_600_000},
        {"topic": "reminders", "body": "daily", "schedule_key": "s-old", "cron": "0 9 * * *"},
    ])
    run()
    _write_json(src, "b.json", [
        {"topic": "orders", "key": "k1"},  # no body: cancels k1
        {"topic": "orders", "body": "k2-v2", "key": "k2", "delay_ms": 600_000},
        {"topic": "reminders", "schedule_key": "s-old"},  # no cron, no every_ms: removed
        {"topic": "reminders", "body": "pong", "schedule_key": "s2", "every_ms": 7_200_000},
    ])
    run()
    with MessageStore.open(path) as store:
        p = store.producer()
        assert p.pending_keys(["k1", "k2"]).tolist() == [False, True]
        assert sorted(s.key for s in store.schedules()) == ["s1", "s2"]
        first = {s.key: s.next_fire_ms for s in store.schedules()}
        # after the batch: someone sends k1 again; a replay of the batch must not cancel it
        p.send(Message("orders", b"k1-external"), delay_ms=600_000, key="k1")
    commits = sorted(glob.glob(os.path.join(ckpt, "commits", "[0-9]*")),
                     key=lambda f: int(os.path.basename(f)))
    os.remove(commits[-1])  # Spark forgets it committed the last batch: it is re-run
    crc = os.path.join(ckpt, "commits", f".{os.path.basename(commits[-1])}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    time.sleep(0.01)
    run()
    later = int(time.time() * 1000) + 700_000
    with MessageStore.open(path, clock=lambda: later) as store:
        p = store.producer()
        assert p.pending_keys(["k1", "k2"]).tolist() == [True, True]
        assert {s.key: s.next_fire_ms for s in store.schedules()} == first
        store.deliver_due()
        assert _bodies(store, "orders") == [b"k1-external", b"k2-v2", b"plain"]


def test_at_least_once_applies_keys_and_schedules_in_the_task(spark, tmp_path):
    path = str(tmp_path / "store")
    df = spark.createDataFrame(
        [("orders", "a1", "a", 600_000, None, None), ("orders", "a2", "a", 600_000, None, None),
         ("reminders", "r", None, None, "s", 60_000)],
        "topic string, body string, key string, delay_ms long, schedule_key string, "
        "every_ms long").coalesce(1)
    df.write.format("rmq").option("guarantee", "at_least_once").mode("append").save(path)
    later = int(time.time() * 1000) + 700_000
    with MessageStore.open(path, clock=lambda: later) as store:
        assert [s.key for s in store.schedules()] == ["s"]
        store.deliver_due()
        assert _bodies(store, "orders") == [b"a2"]


def test_bad_operation_rows_fail_the_job_and_name_the_problem(spark, tmp_path):
    from pyspark.errors import PySparkException

    path = str(tmp_path / "store")
    df = spark.createDataFrame([("orders", "x", "s", "61 * * * *")],
                               "topic string, body string, schedule_key string, cron string")
    with pytest.raises((PySparkException, Exception), match="cron|minute"):
        df.write.format("rmq").mode("append").save(path)
    with MessageStore.open(path) as store:
        assert store.schedules() == []
