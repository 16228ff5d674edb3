"""``spark.read.format("rmq")`` of a store directory written by Apache RocketMQ 4.9.8.

Spark sees exactly the user-topic messages RocketMQ itself returns (system topics stay hidden,
committed transactional messages and delivered delay-level messages are in their real topics).
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from store import is_system_topic

pytestmark = pytest.mark.spark


def _mtimes(path: str) -> dict[str, int]:
    return {os.path.join(d, n): os.stat(os.path.join(d, n)).st_mtime_ns
            for d, _, files in os.walk(path) for n in files}


def test_batch_read_of_a_rocketmq_store_equals_what_rocketmq_returns(spark, rocketmq_root):
    """With the default deliverDue=true, too: a store rmq did not create is never written."""
    path = os.path.join(rocketmq_root, "clean-shutdown")
    before = _mtimes(path)
    with open(path + ".getMessage.jsonl", encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    expected = sorted((e["topic"], e["queue_id"], e["queue_offset"], e["commitlog_offset"],
                       e["body_sha256"]) for e in lines
                      if e["kind"] == "got" and not is_system_topic(e["topic"]))
    rows = (spark.read.format("rmq").option("subscribePattern", ".*").load(path)
            .select("topic", "queue_id", "queue_offset", "commitlog_offset", "body").collect())
    got = sorted((r.topic, r.queue_id, r.queue_offset, r.commitlog_offset,
                  hashlib.sha256(bytes(r.body)).hexdigest()) for r in rows)
    assert len(expected) > 100 and got == expected
    assert _mtimes(path) == before
