"""Issue 2's "done when": interface names only, 100,000 messages, three topics, read by Spark."""

from __future__ import annotations

import random

import pytest

from store import Message, MessageStore

pytestmark = pytest.mark.spark


def test_100k_messages_three_topics_round_trip(spark, tmp_path):
    path = str(tmp_path / "store")
    rng = random.Random(3)
    sent = {}
    with MessageStore.open(path) as store:
        producer = store.producer("acceptance")
        for topic in ("orders", "payments", "shipments"):
            batch = []
            for i in range(33_334 if topic != "shipments" else 33_332):
                body = rng.randbytes(rng.randint(1, 200))
                tags = rng.choice([None, "created", "paid", "näive"])
                keys = [f"k{i}", f"x{rng.randint(0, 9)}"] if i % 3 else []
                props = {"i": str(i), "u": "ü✓"} if i % 5 else {}
                batch.append(Message(topic, body, tags=tags, keys=keys, properties=props))
                if len(batch) == 1000:
                    for r, m in zip(producer.send_batch(batch), batch):
                        sent[(topic, r.queue_id, r.queue_offset)] = (r.msg_id, m)
                    batch = []
            for m in batch:
                r = producer.send(m)
                sent[(topic, r.queue_id, r.queue_offset)] = (r.msg_id, m)
    assert len(sent) == 100_000

    with MessageStore.open(path) as reopened:  # reopen: recovery must keep everything
        assert sum(reopened.max_offset(t, q) for t in reopened.topics()
                   for q in reopened.queue_ids(t)) == 100_000

    df = spark.read.format("rmq").option("subscribePattern", ".*").load(path)
    rows = df.select("topic", "queue_id", "queue_offset", "msg_id", "tags", "keys", "body",
                     "properties").collect()
    assert len(rows) == 100_000
    last = {}
    for r in rows:
        key = (r["topic"], r["queue_id"], r["queue_offset"])
        msg_id, m = sent[key]
        assert r["msg_id"] == msg_id
        assert bytes(r["body"]) == m.body
        assert r["tags"] == m.tags
        assert list(r["keys"]) == m.key_list()
        assert dict(r["properties"] or {}) == m.properties
        # collect() keeps partition order, and partitions follow queue order
        q = (r["topic"], r["queue_id"])
        assert r["queue_offset"] == last.get(q, -1) + 1, (q, r["queue_offset"], last.get(q))
        last[q] = r["queue_offset"]
    # every (topic, queue) is contiguous from 0
    by_queue = {}
    for r in rows:
        by_queue.setdefault((r["topic"], r["queue_id"]), []).append(r["queue_offset"])
    for offsets in by_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))
