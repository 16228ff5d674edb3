"""The stream reader's driver-side offset logic, called directly (no Spark session needed)."""

from __future__ import annotations

import json
import pickle

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from rmq_source.errors import DataLossError, InvalidOptionError, OffsetsPastEndError
from rmq_source.options import parse_options
from rmq_source.partitions import RmqPartition
from rmq_source.stream_reader import RmqStreamReader
from store import Message, MessageStore


def reader(path, **options):
    opts = {"path": path, "deliverDue": "false", **options}
    if "subscribePattern" not in opts:
        opts.setdefault("subscribe", "a,b")
    return RmqStreamReader(parse_options(opts, streaming=True))


def fill(store, topic, n):
    """One send_batch: it goes to the topic's next queue in round robin."""
    store.producer("p").send_batch([Message(topic, b"x%d" % i) for i in range(n)])


@pytest.fixture
def opened(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        yield store


def test_initial_offsets_and_read_limits(opened, store_path):
    for n in (10, 4, 6, 0):
        if n:
            fill(opened, "a", n)
    r = reader(store_path, startingOffsets="earliest", maxOffsetsPerTrigger="9")
    start = r.initialOffset()
    assert start == {"a": {"0": 0, "1": 0, "2": 0, "3": 0}}
    assert json.dumps(start) == json.dumps(start, sort_keys=True)
    assert reader(store_path).initialOffset() == {"a": {"0": 10, "1": 4, "2": 6, "3": 0}}
    assert r.getDefaultReadLimit() == ReadMaxRows(9)
    assert reader(store_path).getDefaultReadLimit() == ReadAllAvailable()

    end = r.latestOffset(start, ReadMaxRows(9))
    assert end == {"a": {"0": 3, "1": 3, "2": 3, "3": 0}}
    assert r.reportLatestOffset() == {"a": {"0": 10, "1": 4, "2": 6, "3": 0}}
    end2 = r.latestOffset(end, ReadMaxRows(9))
    assert end2 == {"a": {"0": 8, "1": 4, "2": 6, "3": 0}}
    assert r.latestOffset(end2, ReadAllAvailable()) == {"a": {"0": 10, "1": 4, "2": 6, "3": 0}}
    assert r.latestOffset(end2, ReadMinRows(100)) == end2  # not enough yet: no batch

    parts = r.partitions(start, end)
    assert r.partitions(end, end) == []
    covered = sorted((x.topic, x.queue_id, x.start, x.end) for p in parts for x in p.ranges)
    assert covered == [("a", 0, 0, 3), ("a", 1, 0, 3), ("a", 2, 0, 3)]
    clone = pickle.loads(pickle.dumps(r))  # what executors get: options only
    assert clone.options == r.options and clone._latest is None
    assert all(isinstance(p, RmqPartition) for p in parts)


def test_new_queues_and_topics_start_at_earliest_and_available_now_target(opened,
                                                                          store_path):
    fill(opened, "a", 5)
    r = reader(store_path, subscribePattern="[ab].*")
    start = r.initialOffset()  # latest: {"a": {"0": 5, ...}}
    fill(opened, "bee", 3)  # a topic that appears mid-stream
    end = r.latestOffset(start, ReadAllAvailable())
    assert end["bee"] == {"0": 3, "1": 0, "2": 0, "3": 0}
    assert end["a"] == start["a"]
    parts = r.partitions(start, end)
    assert [(x.topic, x.start, x.end) for p in parts for x in p.ranges] == [("bee", 0, 3)]

    r.prepareForTriggerAvailableNow()  # fixes the target ...
    fill(opened, "bee", 4)  # ... so these (queue 1) and this new topic stay unread
    fill(opened, "art", 2)
    assert r.latestOffset(end, ReadAllAvailable()) == end
    # a queue the start offset lacks (and is in the target) is read from earliest
    partial = {"a": end["a"], "bee": {"1": 0, "2": 0, "3": 0}}
    assert r.latestOffset(partial, ReadAllAvailable())["bee"]["0"] == 3


def test_data_loss_fails_or_skips(opened, store_path, small_config, clock):
    for _ in range(60):
        opened.producer("p").send(Message("a", b"y" * 3000))
    clock.advance(small_config.file_reserved_time_hours * 3_600_000 + 1)
    opened.producer("p").send(Message("b", b"z"))
    assert opened.clean_expired_files() >= 1
    low = {q: opened.min_offset("a", q) for q in opened.queue_ids("a")}
    assert any(low.values())
    start = {"a": {str(q): 0 for q in low}}
    strict = reader(store_path, subscribe="a")
    with pytest.raises(DataLossError, match=r"removed by retention.*failOnDataLoss=false"):
        strict.latestOffset(start, ReadAllAvailable())
    with pytest.raises(DataLossError):
        strict.partitions(start, {"a": {str(q): 15 for q in low}})
    lenient = reader(store_path, subscribe="a", failOnDataLoss="false")
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert end == {"a": {str(q): opened.max_offset("a", q) for q in low}}
    ranges = [x for p in lenient.partitions(start, end) for x in p.ranges]
    assert {(x.queue_id, x.start) for x in ranges} == {(q, low[q]) for q in low}
    with pytest.raises(DataLossError):
        reader(store_path, subscribe="a", startingOffsets=json.dumps(start)).initialOffset()
    # a start past a queue's end: the store lost messages this query had read
    ahead = {"a": {str(q): opened.max_offset("a", q) + 5 for q in low}}
    with pytest.raises(DataLossError, match=r"now ends at offset \d+, but this query's "
                       r"checkpoint says it already read up to offset"):
        strict.latestOffset(ahead, ReadAllAvailable())
    assert lenient.latestOffset(ahead, ReadAllAvailable()) == end


def test_offsets_past_the_end_after_a_failover(opened, store_path):
    """A new leader holding less than the old one (asynchronous replication): the query's
    checkpoint, or the end of a batch it planned before a restart, lies past a queue's end.
    ``failOnDataLoss=true``: a typed error naming the queue, both offsets and what to do;
    ``false``: the query goes on from the queue's end and reads what is stored there next."""
    opened.producer("p").send_batch([Message("a", b"x%d" % i) for i in range(10)], queue_id=0)
    strict, lenient = reader(store_path, subscribe="a"), reader(
        store_path, subscribe="a", failOnDataLoss="false")
    others = {"1": 0, "2": 0, "3": 0}
    checkpoint = {"a": {"0": 14, **others}}  # read up to 14 on the old leader
    with pytest.raises(OffsetsPastEndError) as err:
        strict.latestOffset(checkpoint, ReadAllAvailable())
    text = str(err.value)
    assert "queue a/0 now ends at offset 10" in text and "up to offset 14" in text
    assert "messages 10 to 13" in text and "failover" in text
    assert "failOnDataLoss=false" in text and "checkpointLocation" in text
    # a batch planned on the old leader (5 to 16), replayed after a restart: refused on the
    # driver, not left to a task failing on offsets that are not written
    planned = ({"a": {"0": 5, **others}}, {"a": {"0": 16, **others}})
    with pytest.raises(OffsetsPastEndError, match=r"a batch this query planned before a "
                       r"restart ends at offset 16"):
        strict.partitions(*planned)
    # failOnDataLoss=false: the replayed batch reads what the queue still holds, and the
    # query goes on from the queue's end, so the new leader's next messages are read
    ranges = [x for p in lenient.partitions(*planned) for x in p.ranges]
    assert [(x.start, x.end) for x in ranges] == [(5, 10)]
    assert lenient.latestOffset(checkpoint, ReadAllAvailable()) == {"a": {"0": 10, **others}}
    opened.producer("p").send_batch([Message("a", b"new%d" % i) for i in range(3)],
                                    queue_id=0)
    end = lenient.latestOffset({"a": {"0": 10, **others}}, ReadAllAvailable())
    assert end == {"a": {"0": 13, **others}}
    # a subscribed queue the store no longer has (a topic created on the old leader only):
    # its end is 0; a topic no longer subscribed keeps its offset, unchecked
    gone = {"a": {"0": 13, **others}, "b": {"0": 7}}
    with pytest.raises(OffsetsPastEndError, match=r"queue b/0 now ends at offset 0, but "):
        reader(store_path, subscribe="a,b").latestOffset(gone, ReadAllAvailable())
    assert reader(store_path, subscribe="a,b", failOnDataLoss="false").latestOffset(
        gone, ReadAllAvailable())["b"] == {"0": 0}
    assert strict.latestOffset(gone, ReadAllAvailable())["b"] == {"0": 7}
    # once the queue grew back past the checkpoint the loss cannot be seen from the queue's
    # end: the query reads on from its checkpoint (offsets 10 to 13 are not read), as Kafka's
    # source after an unclean leader election (docs/operations.md says so)
    opened.producer("p").send_batch([Message("a", b"more%d" % i) for i in range(3)],
                                    queue_id=0)
    assert strict.latestOffset(checkpoint, ReadAllAvailable()) == {"a": {"0": 16, **others}}


def test_starting_offsets_checked_against_the_store(opened, store_path, clock):
    fill(opened, "a", 5)
    clock.advance(1000)
    t = clock()
    fill(opened, "a", 5)
    with pytest.raises(InvalidOptionError, match=r"offset 99 of queue a/0 is past its end"):
        reader(store_path, startingOffsets='{"a":{"0":99}}').initialOffset()
    with pytest.raises(InvalidOptionError, match=r"queue a/7 does not exist"):
        reader(store_path, startingOffsets='{"a":{"7":0}}').initialOffset()
    with pytest.raises(InvalidOptionError, match=r"option path='/nonexistent/rmq'"):
        RmqStreamReader(parse_options({"path": "/nonexistent/rmq", "subscribe": "a"},
                                      streaming=True)).initialOffset()
    assert reader(store_path, startingTimestamp=str(t)).initialOffset() == {
        "a": {"0": 5, "1": 0, "2": 0, "3": 0}}
    assert reader(store_path, startingOffsets='{"a":{"0":2}}').initialOffset() == {
        "a": {"0": 2, "1": 0, "2": 0, "3": 0}}
