"""``spark.read.format("rmq").option("view", "schedules")``, and copies read by Spark."""

from __future__ import annotations

import pytest

from store import Message, MessageStore

pytestmark = pytest.mark.spark

T0 = 1_790_000_000_000


def test_the_schedules_view_lists_what_the_store_holds(spark, tmp_path):
    path = str(tmp_path / "s")
    now = [T0]
    with MessageStore.open(path, clock=lambda: now[0]) as store:
        p = store.producer("g")
        p.schedule(Message("orders", b"remind"), key="r1", every_ms=60_000, max_fires=5,
                   catch_up="all")
        p.schedule(Message("reports", b"daily"), key="d1", cron="0 9 * * *", tz="Europe/Paris")
        store.pause_schedule("d1")
        now[0] += 120_000
        assert store.deliver_due() == 2
    rows = {r["key"]: r for r in spark.read.format("rmq").option("view", "schedules")
            .load(path).collect()}
    assert set(rows) == {"r1", "d1"}
    assert (rows["r1"]["state"], rows["r1"]["fires"], rows["r1"]["every_ms"],
            rows["r1"]["max_fires"]) == ("active", 2, 60_000, 5)
    assert int(rows["r1"]["next_fire_timestamp"].timestamp() * 1000) == T0 + 180_000
    assert (rows["d1"]["state"], rows["d1"]["cron"], rows["d1"]["tz"]) == (
        "paused", "0 9 * * *", "Europe/Paris")
    # a batch read delivers what is due first, by the real clock, which is long past T0:
    # the schedule's five fires, each once
    copies = spark.read.format("rmq").option("subscribe", "orders").load(path).collect()
    assert sorted(int(dict(r["properties"])["RMQ_SCHEDULE_FIRE_MS"]) for r in copies) == [
        T0 + k * 60_000 for k in range(1, 6)]
    assert all(r["deliver_timestamp"] is not None for r in copies)


def test_the_schedules_view_takes_only_path_and_view(spark, tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path).close()
    with pytest.raises(Exception, match="does not apply to view=schedules"):
        spark.read.format("rmq").option("view", "schedules").option("subscribe", "x") \
            .load(path).collect()
