"""``spark.read.format("rmq")``: round trip, tags, patterns, offsets, timestamps, data loss."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from store import Message, MessageStore

pytestmark = pytest.mark.spark


def epoch_ms(value: dt.datetime) -> int:
    """Spark returns naive local datetimes; ``timestamp()`` reads them as local time."""
    return round(value.timestamp() * 1000)


@pytest.fixture
def filled(store_path, small_config, clock):
    """Three topics written with send and send_batch across small CommitLog segments."""
    sent = {}
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        producer = store.producer("batch-test")
        for i in range(300):
            topic = ("orders", "payments", "audit")[i % 3]
            m = Message(topic, f"body-{i}-".encode() * (i % 7 + 1),
                        tags=(None, "created", "paid")[(i // 3) % 3],
                        keys=[f"k{i}", "shared"] if i % 2 else None,
                        properties={"i": str(i), "ü": "✓"} if i % 4 else {})
            r = producer.send(m)
            sent[(topic, r.queue_id, r.queue_offset)] = (r, m, clock())
            clock.advance(10)
        batch = [Message("orders", b"b%d" % j, tags="paid", keys=f"batch{j}") for j in range(50)]
        for r, m in zip(producer.send_batch(batch), batch):
            sent[(r.topic, r.queue_id, r.queue_offset)] = (r, m, clock())
        assert len(store.commit_log.segment_paths()) > 1  # crossed segment boundaries
    return store_path, sent


def rows_by_key(df):
    return {(r["topic"], r["queue_id"], r["queue_offset"]): r for r in df.collect()}


def test_round_trip_without_register(spark, filled):
    path, sent = filled
    df = spark.read.format("rmq").option("subscribe", "orders,payments,audit").load(path)
    assert df.columns == ["topic", "queue_id", "queue_offset", "commitlog_offset", "msg_id",
                          "tags", "keys", "body", "properties", "born_timestamp",
                          "store_timestamp", "deliver_timestamp", "transaction_id",
                          "reconsume_times"]
    rows = df.collect()
    got = {(r["topic"], r["queue_id"], r["queue_offset"]): r for r in rows}
    assert len(rows) == len(got) == len(sent) == 350
    for key, (result, message, stored_ms) in sent.items():
        row = got[key]
        assert row["msg_id"] == result.msg_id
        assert row["commitlog_offset"] == result.commitlog_offset
        assert bytes(row["body"]) == message.body
        assert row["tags"] == message.tags
        assert list(row["keys"]) == message.key_list()
        assert dict(row["properties"] or {}) == message.properties
        assert epoch_ms(row["store_timestamp"]) == stored_ms
        assert epoch_ms(row["born_timestamp"]) == stored_ms
        assert row["deliver_timestamp"] is None and row["transaction_id"] is None
        assert row["reconsume_times"] == 0
    # within each queue the rows come in queue order
    last = {}
    for r in rows:
        q = (r["topic"], r["queue_id"])
        assert r["queue_offset"] == last.get(q, -1) + 1
        last[q] = r["queue_offset"]


def test_tags_filter_and_subscribe_pattern(spark, filled):
    path, sent = filled
    paid = rows_by_key(spark.read.format("rmq").option("subscribePattern", "ord.*|pay.*")
                       .option("tags", "paid || nothing").load(path))
    expected = {k for k, (_, m, _) in sent.items() if m.tags == "paid" and k[0] != "audit"}
    assert set(paid) == expected and {k[0] for k in expected} == {"orders", "payments"}
    audit = rows_by_key(spark.read.format("rmq").option("subscribePattern", "a.d.t")
                        .load(path))
    assert set(audit) == {k for k in sent if k[0] == "audit"}


def test_offsets_json_and_timestamps(spark, filled):
    path, sent = filled
    df = (spark.read.format("rmq").option("subscribe", "orders")
          .option("startingOffsets", json.dumps({"orders": {"0": 5, "1": -2}}))
          .option("endingOffsets", json.dumps({"orders": {"0": 9, "2": 3}}))
          .load(path))
    got = set(rows_by_key(df))
    maxima = {}
    for t, q, o in sent:
        if t == "orders":
            maxima[q] = max(maxima.get(q, 0), o + 1)
    want = {("orders", 0, o) for o in range(5, 9)}
    want |= {("orders", 1, o) for o in range(maxima[1])}
    want |= {("orders", 2, o) for o in range(3)}
    want |= {("orders", 3, o) for o in range(maxima[3])}
    assert got == want

    times = sorted(ms for _, _, ms in sent.values())
    lo, hi = times[40], times[120]
    by_time = rows_by_key(spark.read.format("rmq").option("subscribe", "orders,payments,audit")
                          .option("startingTimestamp", str(lo))
                          .option("endingTimestamp", str(hi)).load(path))
    assert set(by_time) == {k for k, (_, _, ms) in sent.items() if lo <= ms < hi}


def test_bad_options_fail_at_query_start(spark, filled):
    path, _ = filled
    with pytest.raises(Exception) as err:
        spark.read.format("rmq").option("subscribe", "orders").option(
            "maxOffsetsPerTrigger", "10").load(path).collect()
    assert "maxOffsetsPerTrigger='10'" in str(err.value)
    assert "streaming queries only" in str(err.value)
    with pytest.raises(Exception) as err:
        spark.read.format("rmq").option("subscribe", "orders").option(
            "startingOffsets", '{"orders":{"9":0}}').load(path).collect()
    assert "queue orders/9 does not exist" in str(err.value)
    with pytest.raises(Exception) as err:
        spark.read.format("rmq").option("subscribe", "orders").load(
            path + "-missing").collect()
    assert "option path=" in str(err.value) and "not an rmq store" in str(err.value)


def test_data_loss_fails_or_skips(spark, store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        producer = store.producer("retention")
        body = b"x" * 2000
        for _ in range(100):  # about three 64 KiB segments
            producer.send_batch([Message("old", body)])
        clock.advance(small_config.file_reserved_time_hours * 3_600_000 + 1)
        producer.send(Message("fresh", b"new"))
        assert store.clean_expired_files() >= 1
        low = {q: store.min_offset("old", q) for q in store.queue_ids("old")}
        high = {q: store.max_offset("old", q) for q in store.queue_ids("old")}
    assert any(low.values())
    start = json.dumps({"old": {str(q): 0 for q in low}})
    reader = (spark.read.format("rmq").option("subscribe", "old")
              .option("startingOffsets", start))
    with pytest.raises(Exception) as err:
        reader.load(store_path).collect()
    message = str(err.value)
    assert "removed by retention" in message and "failOnDataLoss=false" in message
    rows = reader.option("failOnDataLoss", "false").load(store_path).collect()
    assert sorted((r["queue_id"], r["queue_offset"]) for r in rows) == sorted(
        (q, o) for q in low for o in range(low[q], high[q]))


def test_a_batch_read_of_a_topic_that_does_not_exist_names_it(spark, store_path, small_config,
                                                               clock):
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        store.producer("g").send(Message("orders", b"x"))
    with pytest.raises(Exception, match=r"\['ordres'\] do not exist.*'orders'"):
        (spark.read.format("rmq").option("subscribe", "orders,ordres").load(store_path)
         .collect())
    # a pattern matching nothing is not a mistyped name: no rows, no error
    assert spark.read.format("rmq").option("subscribePattern", "nope.*").load(
        store_path).count() == 0


def test_a_narrower_schema_reads_only_its_columns(spark, filled):
    """``.schema(...)`` with some of the columns, in any order: the same values, and only
    those columns (with a tags filter on a schema without ``tags`` too)."""
    path, sent = filled
    full = rows_by_key(spark.read.format("rmq").option("subscribe", "orders,payments")
                       .load(path))
    narrow = (spark.read.format("rmq").schema("body binary, queue_offset bigint, topic string,"
                                              " queue_id int, msg_id string")
              .option("subscribe", "orders,payments").load(path))
    assert narrow.columns == ["body", "queue_offset", "topic", "queue_id", "msg_id"]
    got = rows_by_key(narrow)
    assert set(got) == set(full)
    for key, row in got.items():
        assert bytes(row["body"]) == bytes(full[key]["body"])
        assert row["msg_id"] == full[key]["msg_id"]
    paid = rows_by_key(spark.read.format("rmq").schema("topic string, queue_id int, "
                                                       "queue_offset bigint")
                       .option("subscribe", "orders").option("tags", "paid").load(path))
    assert set(paid) == {k for k, (_, m, _) in sent.items() if k[0] == "orders"
                         and m.tags == "paid"}


@pytest.mark.parametrize("ddl", ["body string", "topic string, nope int",
                                 "topic string, topic string"])
def test_a_schema_that_does_not_fit_is_refused_naming_the_allowed_columns(spark, filled, ddl):
    path, _ = filled
    with pytest.raises(Exception) as info:
        spark.read.format("rmq").schema(ddl).option("subscribe", "orders").load(path).collect()
    assert "any of the messages schema's columns" in str(info.value)


def test_verify_crc_fails_or_skips_a_damaged_body(spark, store_path, small_config, clock):
    """A flipped body bit: served as is by default; with verifyCrc=true the task fails
    naming the file and offset, or with failOnDataLoss=false the row is skipped."""
    import os

    with MessageStore.open(store_path, small_config, clock=clock) as store:
        p = store.producer("crc")
        results = [p.send(Message("crc", b"body-%03d" % i + b"." * 50)) for i in range(40)]
    bad = results[17]
    seg = small_config.commitlog_file_size_bytes
    start = bad.commitlog_offset - bad.commitlog_offset % seg
    path = os.path.join(store_path, "commitlog", f"{start:020d}")
    with open(path, "r+b") as fh:
        where = bad.commitlog_offset % seg + 88 + 3  # the body's fourth byte
        fh.seek(where)
        byte = fh.read(1)[0]
        fh.seek(where)
        fh.write(bytes([byte ^ 0x01]))
    reader = spark.read.format("rmq").option("subscribe", "crc").option("deliverDue", "false")
    assert reader.load(store_path).count() == 40
    with pytest.raises(Exception) as err:
        reader.option("verifyCrc", "true").load(store_path).collect()
    assert "body CRC" in str(err.value) and str(bad.commitlog_offset) in str(err.value)
    rows = (reader.option("verifyCrc", "true").option("failOnDataLoss", "false")
            .load(store_path).collect())
    assert len(rows) == 39 and b"body-017" not in {bytes(r["body"][:8]) for r in rows}
