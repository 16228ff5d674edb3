"""``spark.readStream.format("rmq")``: AvailableNow, read limits, restarts, new topics, triggers."""

from __future__ import annotations

import json
import threading

import pytest

from store import Message, MessageStore

pytestmark = pytest.mark.spark


class Collector:
    """A foreachBatch sink that remembers each micro-batch's (topic, queue, offset) rows."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[str, int, int]]] = {}
        self._lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = [(r[0], r[1], r[2]) for r in df.select("topic", "queue_id", "queue_offset")
                .collect()]
        with self._lock:
            self.batches[batch_id] = rows

    def rows(self) -> list[tuple[str, int, int]]:
        with self._lock:
            return [row for b in sorted(self.batches) for row in self.batches[b]]


def send(store, topic, n, tags=None):
    producer = store.producer("stream-test")
    return [(r.topic, r.queue_id, r.queue_offset)
            for r in producer.send_batch([Message(topic, b"m%d" % i, tags=tags)
                                          for i in range(n)])]


def run_available_now(spark, path, checkpoint, sink, **options):
    reader = spark.readStream.format("rmq")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load(path).writeStream.foreachBatch(sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def test_available_now_limits_restart_and_new_topics(spark, store_path, small_config, clock,
                                                     tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        expected = []
        for _ in range(5):  # five batches round-robin over the four queues
            expected += send(store, "orders", 20)
        sink = Collector()
        query = run_available_now(spark, store_path, checkpoint, sink, subscribePattern="ord.*",
                                  startingOffsets="earliest", maxOffsetsPerTrigger="30")
        rows = sink.rows()
        assert sorted(rows) == sorted(expected)  # no duplicate, no gap
        data_batches = [b for b in sink.batches.values() if b]
        assert len(data_batches) == 4 and all(len(b) <= 30 for b in data_batches)
        # the offsets Spark logged are {"topic": {"queue": next}} with sorted keys
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        end = json.loads(progress[-1]["sources"][0]["endOffset"])
        assert end == {"orders": {"0": 40, "1": 20, "2": 20, "3": 20}}

        # restart on the same checkpoint: only what came since, plus a new matching topic
        later = send(store, "orders", 7) + send(store, "ordersEU", 9) + send(store, "other", 3)
        sink2 = Collector()
        run_available_now(spark, store_path, checkpoint, sink2, subscribePattern="ord.*",
                          startingOffsets="earliest", maxOffsetsPerTrigger="30")
        assert sorted(sink2.rows()) == sorted(k for k in later if k[0] != "other")
        # a third run with nothing new reads nothing
        sink3 = Collector()
        run_available_now(spark, store_path, checkpoint, sink3, subscribePattern="ord.*")
        assert sink3.rows() == []


def test_processing_time_trigger_default_latest_and_new_queue_topics(
        spark, store_path, small_config, clock, tmp_path):
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        send(store, "events", 10)  # before the query: not read (streams start at latest)
        sink = Collector()
        query = (spark.readStream.format("rmq").option("subscribe", "events,late")
                 .option("tags", "keep").load(store_path)
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(processingTime="100 milliseconds").start())
        try:
            query.processAllAvailable()
            wanted = send(store, "events", 12, tags="keep")
            send(store, "events", 5, tags="drop")
            query.processAllAvailable()
            assert sorted(sink.rows()) == sorted(wanted)
            late = send(store, "late", 6, tags="keep")  # topic created mid-stream: earliest
            query.processAllAvailable()
            assert sorted(sink.rows()) == sorted(wanted + late)
        finally:
            query.stop()
        assert query.exception() is None
        # restart with AvailableNow on the same checkpoint after more writes: no dup, no gap
        more = send(store, "late", 4, tags="keep")
        sink2 = Collector()
        run_available_now(spark, store_path, str(tmp_path / "cp"), sink2,
                          subscribe="events,late", tags="keep")
        assert sorted(sink2.rows()) == sorted(more)


def test_stream_data_loss_and_bad_option(spark, store_path, small_config, clock, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        send(store, "t", 3)
        run_available_now(spark, store_path, checkpoint, Collector(), subscribe="t",
                          startingOffsets="earliest")
        for _ in range(40):  # several segments the query has not read yet
            send(store, "t", 1)
            store.producer("p").send(Message("t", b"y" * 3000))
        clock.advance(small_config.file_reserved_time_hours * 3_600_000 + 1)
        send(store, "u", 1)
        assert store.clean_expired_files() >= 1
        lows = {q: store.min_offset("t", q) for q in store.queue_ids("t")}
        highs = {q: store.max_offset("t", q) for q in store.queue_ids("t")}

    reader = spark.readStream.format("rmq").option("subscribe", "t")
    query = (reader.load(store_path).writeStream.foreachBatch(Collector())
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    with pytest.raises(Exception) as err:
        query.awaitTermination(120)
    assert "removed by retention" in str(err.value) and "failOnDataLoss=false" in str(err.value)

    sink = Collector()
    run_available_now(spark, store_path, checkpoint, sink, subscribe="t",
                      failOnDataLoss="false")
    assert sorted(sink.rows()) == sorted(
        ("t", q, o) for q in lows for o in range(lows[q], highs[q]))

    with pytest.raises(Exception) as err:
        (spark.readStream.format("rmq").option("subscribe", "t")
         .option("endingOffsets", "latest").load(store_path)
         .writeStream.foreachBatch(Collector())
         .option("checkpointLocation", str(tmp_path / "cp2")).start().awaitTermination(60))
    assert "endingOffsets='latest'" in str(err.value)
    assert "batch queries" in str(err.value)
