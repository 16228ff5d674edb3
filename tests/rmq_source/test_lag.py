"""Lag of a streaming query: from its checkpoint (``rmq lag``) and from ``lastProgress``."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from rmq_cli.cli import main
from rmq_source.errors import RmqSourceError
from rmq_source.lag import checkpoint_offsets, progress_offsets, query_lag, queue_lag
from store import Message, MessageStore


def _write_checkpoint(root, batches: dict[int, str], committed: set[int]) -> str:
    os.makedirs(os.path.join(root, "offsets"))
    os.makedirs(os.path.join(root, "commits"))
    for batch, source_line in batches.items():
        with open(os.path.join(root, "offsets", str(batch)), "w") as fh:
            fh.write('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n' + source_line + "\n")
        if batch in committed:
            with open(os.path.join(root, "commits", str(batch)), "w") as fh:
                fh.write('v1\n{"nextBatchWatermarkMs":0}\n')
    return str(root)


def test_the_last_committed_batch_counts_not_the_planned_one(tmp_path):
    cp = _write_checkpoint(tmp_path / "cp", {
        0: '{"orders": {"0": 3, "1": 2}}',
        1: '{"orders": {"0": 5, "1": 4}}',
        2: '{"orders": {"0": 9, "1": 9}}',  # planned, not committed
    }, committed={0, 1})
    batch, sources = checkpoint_offsets(cp)
    assert batch == 1 and sources == [{("orders", 0): 5, ("orders", 1): 4}]


def test_other_sources_are_left_out_and_bad_dirs_named(tmp_path):
    cp = _write_checkpoint(tmp_path / "cp", {
        0: '{"logs": {"3": 17}}\n{"topic-a":{"0":"not an offset"}}'}, committed={0})
    assert checkpoint_offsets(cp) == (0, [{("logs", 3): 17}])
    assert checkpoint_offsets(_write_checkpoint(tmp_path / "empty", {}, set())) == (None, [])
    with pytest.raises(RmqSourceError, match="checkpointLocation"):
        checkpoint_offsets(str(tmp_path))
    progress = {"sources": [{"endOffset": {"orders": {"0": 4}}},
                            {"endOffset": '{"topic-a": {"0": 1}}'},
                            {"endOffset": {"kafka": {"p": "x"}}}]}
    assert progress_offsets(progress) == [{("orders", 0): 4}, {("topic-a", 0): 1}]


def test_queue_lag_counts_new_queues_from_their_start(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        p = store.producer("g")
        for q in range(4):
            p.send_batch([Message("orders", b"x")] * (q + 1))  # one batch per queue
        lag = queue_lag(store, {("orders", 0): 1, ("orders", 1): 0, ("gone", 0): 5})
    by_queue = {r["queue_id"]: r for r in lag["queues"]}
    # queues 2 and 3 are not in the offsets: counted from their first offset
    assert [by_queue[q]["lag"] for q in range(4)] == [0, 2, 3, 4]
    assert lag["lag"] == 9 and lag["max_lag"] == 4 and lag["topics"] == {"orders": 9}


@pytest.mark.spark
def test_rmq_lag_of_a_real_query(spark, store_path, small_config, clock, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        store.producer("g").send_batch([Message("orders", b"m%d" % i) for i in range(10)])
    query = (spark.readStream.format("rmq").option("subscribe", "orders")
             .option("startingOffsets", "earliest").load(store_path)
             .writeStream.format("noop").option("checkpointLocation", checkpoint).start())
    try:
        query.processAllAvailable()
        assert query_lag(query, store_path)["lag"] == 0
    finally:
        query.stop()
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        store.producer("g").send_batch([Message("orders", b"late")] * 7)
    r = CliRunner().invoke(main, ["lag", "--checkpoint", checkpoint, "--store", store_path,
                                  "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["lag"] == 7 and data["topics"] == {"orders": 7}
    r = CliRunner().invoke(main, ["lag", "--checkpoint", checkpoint, "--store", store_path])
    assert "7 message(s) behind" in r.stdout


def test_offsets_of_other_sources_that_are_not_json_are_left_out():
    progress = {"sources": [{"endOffset": "file:/x/y"}, {"endOffset": "12345"},
                            {"endOffset": '{"orders": {"0": 4}}'},
                            {"endOffset": '{"store-0": {"orders": {"1": 2}}}'},
                            {"endOffset": "file:/x/z"}]}
    assert progress_offsets(progress) == [{("orders", 0): 4}]
    assert progress_offsets(progress, raw=True) == [{"orders": {"0": 4}},
                                                    {"store-0": {"orders": {"1": 2}}}]
