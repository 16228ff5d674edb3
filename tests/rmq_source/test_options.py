"""Option parsing, offsets JSON, partition planning and row sharing (pure Python, no Spark)."""

from __future__ import annotations

import json
import pickle

import pytest

from rmq_source.errors import InvalidOptionError, RmqSourceError
from rmq_source.offsets import from_spark, serialize, to_spark
from rmq_source.options import EARLIEST, LATEST, RmqOptions, parse_options, parse_tags
from rmq_source.partitions import QueueRange, RmqPartition, plan_partitions
from rmq_source.stream_reader import distribute_rows

BASE = {"path": "/data/rmq", "subscribe": "orders"}


def parse(streaming=True, **extra):
    return parse_options({**BASE, **extra}, streaming=streaming)


def test_defaults_and_case_insensitive_names():
    opts = parse_options({"PATH": "/s", "SubScribe": " orders , payments,orders ",
                          "MAXOFFSETSPERTRIGGER": "10", "failondataloss": "FALSE"},
                         streaming=True)
    assert opts.path == "/s"
    assert opts.subscribe == ("orders", "payments")
    assert opts.max_offsets_per_trigger == 10
    assert opts.fail_on_data_loss is False
    assert opts.deliver_due is True and opts.view == "messages" and opts.tags is None
    assert opts.starting_offsets.default == LATEST
    assert parse(streaming=False).starting_offsets.default == EARLIEST
    assert opts.raw["maxoffsetspertrigger"] == "10"
    assert pickle.loads(pickle.dumps(opts)) == opts


def test_offsets_json_and_timestamps():
    opts = parse(streaming=False, startingOffsets='{"orders":{"1":5,"0":-2}}',
                 endingOffsets='{"orders":{"1":-1, "2": 9}}')
    assert opts.starting_offsets.get("orders", 1) == 5
    assert opts.starting_offsets.get("orders", 0) == EARLIEST
    assert opts.starting_offsets.get("orders", 3) == EARLIEST  # not named: earliest
    assert opts.ending_offsets.get("orders", 1) == LATEST
    assert opts.ending_offsets.get("orders", 2) == 9
    assert opts.ending_offsets.get("orders", 0) == LATEST  # not named: latest
    ts = parse(streaming=False, startingTimestamp="100", endingTimestamp="200")
    assert (ts.starting_timestamp_ms, ts.ending_timestamp_ms) == (100, 200)


def test_subscribe_pattern_matches_whole_user_topic_names():
    opts = parse_options({"path": "/s", "subscribePattern": "ord.*"}, streaming=True)
    assert opts.select_topics(["orders", "xorders", "payments", "ord", "rmq_sys_wheel_timer"]) \
        == ["ord", "orders"]
    sys_opts = parse_options({"path": "/s", "subscribePattern": ".*"}, streaming=True)
    assert sys_opts.select_topics(["SCHEDULE_TOPIC_XXXX", "a"]) == ["a"]


def test_tag_expressions():
    assert parse_tags("*") is None and parse_tags("") is None
    assert parse_tags(" created || paid ||created") == ("created", "paid")
    assert parse_tags("a || *") is None
    assert parse(tags="x").tags == ("x",)


@pytest.mark.parametrize("extra, streaming, words", [
    ({"bogus": "1"}, True, ["bogus", "'1'", "allowed", "subscribePattern"]),
    ({"startingOffsets": "newest"}, True, ["startingOffsets", "'newest'", "earliest"]),
    ({"startingOffsets": "latest"}, False, ["startingOffsets", "'latest'", "not allowed"]),
    ({"startingOffsets": '{"orders":{"0":-1}}'}, False, ["startingOffsets", "-1"]),
    ({"startingOffsets": '{"orders":{"x":1}}'}, True, ["startingOffsets", "queue id 'x'"]),
    ({"startingOffsets": '{"orders":{"0":-7}}'}, True, ["startingOffsets", "-7"]),
    ({"startingOffsets": '{"orders":{"0":1.5}}'}, True, ["startingOffsets", "1.5"]),
    ({"startingOffsets": '{"other":{"0":1}}'}, True, ["startingOffsets", "'other'",
                                                     "not subscribed"]),
    ({"startingOffsets": "{broken"}, True, ["startingOffsets", "'{broken'", "JSON"]),
    ({"endingOffsets": "earliest"}, False, ["endingOffsets", "'earliest'", "latest"]),
    ({"endingOffsets": "latest"}, True, ["endingOffsets", "batch queries"]),
    ({"endingTimestamp": "5"}, True, ["endingTimestamp", "batch queries"]),
    ({"maxOffsetsPerTrigger": "10"}, False, ["maxOffsetsPerTrigger", "streaming queries"]),
    ({"maxOffsetsPerTrigger": "0"}, True, ["maxOffsetsPerTrigger", "'0'", ">= 1"]),
    ({"maxOffsetsPerTrigger": "ten"}, True, ["maxOffsetsPerTrigger", "'ten'", "integer"]),
    ({"failOnDataLoss": "yes"}, True, ["failOnDataLoss", "'yes'", "true or false"]),
    ({"deliverDue": "1"}, True, ["deliverDue", "'1'", "true or false"]),
    ({"view": "halfs"}, True, ["view", "'halfs'", "messages, transaction_checks"]),
    ({"view": "transaction_checks"}, False, ["view", "streaming"]),
    ({"startingTimestamp": "-5"}, True, ["startingTimestamp", "'-5'", "epoch milliseconds"]),
    ({"startingTimestamp": "5", "startingOffsets": "earliest"}, True,
     ["startingOffsets", "startingTimestamp", "at most one"]),
    ({"startingTimestamp": "9", "endingTimestamp": "5"}, False, ["endingTimestamp", "'5'"]),
    ({"startingOffsets": '{"orders":{"0":9}}', "endingOffsets": '{"orders":{"0":3}}'}, False,
     ["endingOffsets", "orders/0", "before"]),
    ({"tags": " || "}, True, ["tags", "'a || b'"]),
    ({"subscribe": " , "}, True, ["subscribe", "names no topic"]),
    ({"subscribe": "bad topic"}, True, ["subscribe", "'bad topic'"]),
    ({"subscribe": "SCHEDULE_TOPIC_XXXX"}, True, ["subscribe", "SCHEDULE_TOPIC_XXXX"]),
    ({"subscribePattern": "("}, True, ["subscribe", "subscribePattern", "exactly one"]),
    ({"action": "end_transaction"}, True, ["action", "writing only"]),
])
def test_bad_options_name_option_value_and_allowed(extra, streaming, words):
    with pytest.raises(InvalidOptionError) as err:
        parse(streaming=streaming, **extra)
    message = str(err.value)
    assert "allowed" in message
    for word in words:
        assert word in message, (word, message)


def test_subscription_and_path_rules():
    with pytest.raises(InvalidOptionError, match="neither subscribe nor subscribePattern"):
        parse_options({"path": "/s"}, streaming=True)
    with pytest.raises(InvalidOptionError, match=r"subscribePattern='\(': not a regular"):
        parse_options({"path": "/s", "subscribePattern": "("}, streaming=True)
    with pytest.raises(InvalidOptionError, match="option path is missing"):
        parse_options({"subscribe": "a"}, streaming=False)
    # the transaction_checks view reads the store's half messages: no subscription needed
    assert parse_options({"path": "/s", "view": "transaction_checks"},
                         streaming=True).view == "transaction_checks"
    with pytest.raises(InvalidOptionError, match=r"tags='a': applies to view=messages only"):
        parse_options({"path": "/s", "view": "transaction_checks", "tags": "a"}, streaming=True)


def test_writer_options():
    opts = parse_options({"path": "/s", "action": "END_TRANSACTION",
                          "checkpointLocation": "/c"}, streaming=True, write=True)
    assert isinstance(opts, RmqOptions) and opts.action == "end_transaction"
    assert opts.raw["checkpointlocation"] == "/c"
    sink = parse_options({"path": "/s"}, streaming=False, write=True)
    assert sink.action is None and sink.guarantee == "exactly_once" and sink.topic is None
    assert sink.producer_group == "rmq-spark-sink" and sink.sink_id is None
    sink = parse_options({"path": "/s", "topic": "Orders", "producerGroup": "g1",
                          "guarantee": "AT_LEAST_ONCE", "sinkId": "orders-sink",
                          "queryName": "q"}, streaming=True, write=True)
    assert (sink.topic, sink.producer_group, sink.guarantee, sink.sink_id) == (
        "Orders", "g1", "at_least_once", "orders-sink")
    assert sink.sink_commit == "index"
    assert parse_options({"path": "/s", "sinkCommit": "COPY"}, streaming=False,
                         write=True).sink_commit == "copy"
    with pytest.raises(InvalidOptionError, match=r"sinkCommit='twice'.*index, copy"):
        parse_options({"path": "/s", "sinkCommit": "twice"}, streaming=False, write=True)
    with pytest.raises(InvalidOptionError, match=r"guarantee='twice'.*exactly_once, "
                                                 r"at_least_once"):
        parse_options({"path": "/s", "guarantee": "twice"}, streaming=False, write=True)
    with pytest.raises(InvalidOptionError, match=r"topic='bad topic'"):
        parse_options({"path": "/s", "topic": "bad topic"}, streaming=False, write=True)
    with pytest.raises(InvalidOptionError, match=r"topic='RMQ_SYS_TRANS_HALF_TOPIC'"):
        parse_options({"path": "/s", "topic": "RMQ_SYS_TRANS_HALF_TOPIC"}, streaming=False,
                      write=True)
    with pytest.raises(InvalidOptionError, match=r"producerGroup='a b'"):
        parse_options({"path": "/s", "producerGroup": "a b"}, streaming=False, write=True)
    with pytest.raises(InvalidOptionError, match=r"topic='T'.*not to action=end_transaction"):
        parse_options({"path": "/s", "action": "end_transaction", "topic": "T"},
                      streaming=False, write=True)
    with pytest.raises(InvalidOptionError, match=r"topic='T': applies to writing only"):
        parse_options({"path": "/s", "subscribe": "a", "topic": "T"}, streaming=False)
    with pytest.raises(InvalidOptionError, match=r"action='commit_all'.*end_transaction"):
        parse_options({"path": "/s", "action": "commit_all"}, streaming=False, write=True)
    with pytest.raises(InvalidOptionError, match="subscribe='a': applies to reading only"):
        parse_options({"path": "/s", "action": "end_transaction", "subscribe": "a"},
                      streaming=False, write=True)


def test_offsets_json_is_key_sorted_and_round_trips():
    offsets = {("b", 0): 3, ("a", 10): 7, ("a", 2): 1, ("a", 0): 0}
    nested = to_spark(offsets)
    assert list(nested) == ["a", "b"] and list(nested["a"]) == ["0", "10", "2"]
    assert json.dumps(nested) == json.dumps(nested, sort_keys=True) == serialize(offsets)
    assert from_spark(nested) == offsets
    assert from_spark(serialize(offsets)) == offsets
    with pytest.raises(RmqSourceError, match="not valid"):
        from_spark({"a": {"0": -1}})
    with pytest.raises(RmqSourceError, match="not JSON"):
        from_spark("{")


def test_partition_planning_splits_big_queues_and_packs_small_ones():
    ranges = [QueueRange("a", 0, 0, 1_000_000), QueueRange("a", 1, 0, 10),
              QueueRange("b", 0, 5, 300_000), QueueRange("b", 1, 7, 7)]
    parts = plan_partitions("/s", ranges, tags=("t",), fail_on_data_loss=False, parallelism=2)
    assert len(parts) == 2
    sizes = [p.rows for p in parts]
    assert sum(sizes) == 1_000_000 + 10 + 299_995 and max(sizes) - min(sizes) <= 1
    # every offset exactly once, in queue order
    covered = {}
    for p in parts:
        assert p.tags == ("t",) and p.fail_on_data_loss is False and p.path == "/s"
        for r in p.ranges:
            assert covered.get((r.topic, r.queue_id), r.start) == r.start
            covered[(r.topic, r.queue_id)] = r.end
    assert covered == {("a", 0): 1_000_000, ("a", 1): 10, ("b", 0): 300_000}
    small = plan_partitions("/s", [QueueRange("a", q, 0, 100) for q in range(8)],
                            tags=None, fail_on_data_loss=True, parallelism=2)
    assert len(small) == 1 and len(small[0].ranges) == 8
    assert plan_partitions("/s", [QueueRange("a", 0, 4, 4)], tags=None,
                           fail_on_data_loss=True) == []
    assert pickle.loads(pickle.dumps(parts[1])) == parts[1]
    assert isinstance(parts[0], RmqPartition)


def test_row_limit_is_shared_fairly_and_every_queue_moves():
    backlog = {("a", 0): 100, ("a", 1): 2, ("b", 0): 100}
    assert distribute_rows(10, backlog) == {("a", 0): 4, ("a", 1): 2, ("b", 0): 4}
    assert distribute_rows(1000, backlog) == backlog
    position = dict.fromkeys(backlog, 0)
    seen = set()
    for _ in range(3):  # a limit below the number of busy queues still moves each in turn
        grant = distribute_rows(2, backlog, position)
        assert sum(grant.values()) == 2
        for key, n in grant.items():
            position[key] += n
            if n:
                seen.add(key)
    assert seen == set(backlog)


@pytest.mark.parametrize("injected", ["queryName", "checkpointLocation"])
@pytest.mark.parametrize("mode", ["read", "stream", "write", "checks"])
def test_options_spark_injects_are_accepted_everywhere(injected, mode):
    """Spark puts a query's name and checkpoint into the option map of sources and sinks."""
    base = {"path": "/s", injected: "q1"}
    if mode == "write":
        opts = parse_options({**base, "action": "end_transaction"}, streaming=True, write=True)
        assert opts.action == "end_transaction"
    elif mode == "checks":
        opts = parse_options({**base, "view": "transaction_checks"}, streaming=True)
        assert opts.view == "transaction_checks"
    else:
        opts = parse_options({**base, "subscribe": "t"}, streaming=mode == "stream")
        assert opts.subscribe == ("t",)
