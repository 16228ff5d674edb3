"""Batch reads by key and message id through the key index (``rmq_source.key_lookup``): the
option ``keys``, pushed ``msg_id`` and ``keys`` equality; the same rows with the index on and
off; one lookup per topic and key; store groups and ``rmq://``; ``keys`` on a stream.

The planning and reading tests run the source's reader in this process (no Spark session);
those marked ``spark`` go through Spark."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_source.errors import InvalidOptionError
from rmq_source.options import parse_options
from rmq_source.pushdown import PUSHDOWN_CONF
from store import (
    Message,
    MessageStore,
    StoreGroup,
    StoreReader,
    StoreServer,
)
from tests.conftest import SMALL, FakeClock
from tests.rmq_source.mixed import send_mixed

TOPICS = ("alpha", "beta")
COLUMNS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "tags", "keys",
           "body", "transaction_id")
NO_INDEX = replace(SMALL, message_index_enable=False)
TOKEN = "key-reads-token"


def key_of(i: int) -> list[str]:
    """Keys of message ``i``: one of 13 shared keys, every third one more (``own-i``)."""
    return [f"k{i % 13}"] + ([f"own-{i}"] if i % 3 == 0 else [])


def fill(store, clock, session: int, n: int = 90) -> None:
    """Plain, tagged, delayed and transactional messages with keys, in two topics."""
    send_mixed(store, clock, "keys", session, n, TOPICS, (None, "red", "blue"), key_of,
               settle_ms=40_000)


def write_store(path: str, config) -> str:
    clock = FakeClock()
    for session in range(2):  # a reopen between the two halves
        with MessageStore.open(path, config, clock=clock) as store:
            fill(store, clock, session)
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same messages in a store keeping the key index and in one keeping none."""
    root = tmp_path_factory.mktemp("key-reads")
    return {"index": write_store(str(root / "index"), SMALL),
            "scan": write_store(str(root / "scan"), NO_INDEX)}


def reader_for(path: str, *, filters=None, **options):
    """The batch reader Spark would get (with pushdown when ``filters`` is given)."""
    from rmq_source.batch_reader import RmqBatchReader, RmqPushdownReader

    opts = parse_options({"path": path, "subscribe": ",".join(TOPICS), "deliverdue": "false",
                          **options}, streaming=False)
    if filters is None:
        return RmqBatchReader(opts)
    reader = RmqPushdownReader(opts)
    assert not list(reader.pushFilters(filters))
    return reader


def plan_and_read(reader) -> tuple[int, list[tuple]]:
    """(offsets planned, the rows read) of a batch reader, read in this process."""
    parts = reader.partitions()
    rows = [tuple(_hashable(row[c]) for c in COLUMNS) for p in parts for batch in reader.read(p)
            for row in batch.to_pylist()]
    return sum(p.rows for p in parts), sorted(rows)


def _hashable(value):
    if isinstance(value, bytearray):
        return bytes(value)
    return tuple(value) if isinstance(value, list) else value


def spark_rows(df) -> list[tuple]:
    return sorted(tuple(_hashable(v) for v in r) for r in df.select(*COLUMNS).collect())


def all_rows(path: str) -> list[tuple]:
    return plan_and_read(reader_for(path))[1]


@pytest.fixture
def lookups(monkeypatch):
    """Every ``query_messages`` call the planner makes on a store directory: (topic, key)."""
    calls = []
    original = StoreReader.query_messages

    def counted(self, topic, key=None, **kwargs):
        calls.append((topic, key))
        return original(self, topic, key, **kwargs)

    monkeypatch.setattr(StoreReader, "query_messages", counted)
    return calls


def without_id(rows: list[tuple]) -> list[tuple]:
    """What two stores of the same messages agree on: each draws its own unique keys and
    transaction ids, and its producer its own queues (topic, tags, keys, body)."""
    return sorted((tuple(r[COLUMNS.index(c)] for c in ("topic", "tags", "keys", "body"))
                   for r in rows), key=repr)


def carrying(rows: list[tuple], keys) -> list[tuple]:
    at = COLUMNS.index("keys")
    return [r for r in rows if set(r[at]) & set(keys)]


# --------------------------------------------------------------------------- option keys


def test_option_keys_is_parsed_and_a_bad_value_names_what_is_allowed():
    opts = parse_options({"path": "/x", "subscribe": "t", "keys": " a, b ,a"}, streaming=False)
    assert opts.keys == ("a", "b")
    assert parse_options({"path": "/x", "subscribe": "t", "keys": "a"},
                         streaming=True).keys == ("a",)
    for bad in ("", "a,,b", "a b", "a,b\tc"):
        with pytest.raises(InvalidOptionError, match="option keys=.*allowed: comma-separated "
                                                     "message keys"):
            parse_options({"path": "/x", "subscribe": "t", "keys": bad}, streaming=False)
    with pytest.raises(InvalidOptionError, match="does not apply to view=schedules"):
        parse_options({"path": "/x", "view": "schedules", "keys": "a"}, streaming=False)


def test_a_read_by_keys_plans_only_the_index_answers_with_one_lookup_per_topic_and_key(
        stores, lookups):
    keys = ("k3", "own-9", "no-such-key")
    planned, rows = plan_and_read(reader_for(stores["index"], keys=",".join(keys)))
    expected = carrying(all_rows(stores["index"]), keys)
    assert rows == expected and expected
    assert planned == len(expected)  # only those offsets, no scan
    assert sorted(lookups) == sorted((t, k) for t in TOPICS for k in keys)


def test_without_an_index_a_read_by_keys_scans_and_gives_the_same_rows(stores):
    keys = ("k3", "own-9", "k12")
    planned, rows = plan_and_read(reader_for(stores["scan"], keys=",".join(keys)))
    assert planned == len(all_rows(stores["scan"]))  # every offset read
    assert rows == carrying(all_rows(stores["scan"]), keys)
    assert without_id(rows) == without_id(
        plan_and_read(reader_for(stores["index"], keys=",".join(keys)))[1])


@pytest.mark.slow
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.sampled_from([f"k{i}" for i in range(14)] + ["own-0", "own-33",
                                                                     "own-57", "own-1"]),
                     min_size=1, max_size=4, unique=True),
       tags=st.sampled_from([None, "red", "red||blue"]),
       start=st.sampled_from([None, '{"alpha": {"0": 5, "1": 2}}']))
def test_the_option_keys_with_other_options_gives_the_same_rows_with_the_index_on_and_off(
        stores, keys, tags, start):
    options = {"keys": ",".join(keys)}
    if tags is not None:
        options["tags"] = tags
    if start is not None:
        options["startingoffsets"] = start
    indexed = plan_and_read(reader_for(stores["index"], **options))[1]
    scanned = plan_and_read(reader_for(stores["scan"], **options))[1]
    plain = plan_and_read(reader_for(stores["index"], **{k: v for k, v in options.items()
                                                         if k != "keys"}))[1]
    assert indexed == carrying(plain, keys)
    if start is None:  # (the stores' producers chose their own queues)
        assert without_id(indexed) == without_id(scanned)


# --------------------------------------------------------------------------- pushed filters


def test_pushed_msg_id_is_read_through_the_index(stores, lookups):
    from pyspark.sql.datasource import EqualTo, In

    for name, path in stores.items():
        rows = all_rows(path)
        ids = sorted({r[COLUMNS.index("msg_id")] for r in rows})[::17] + ["no-such-id"]
        filters = [In(("msg_id",), ids)]
        lookups.clear()
        planned, got = plan_and_read(reader_for(path, filters=filters))
        expected = [r for r in rows if r[COLUMNS.index("msg_id")] in ids]
        assert got == expected and len(expected) >= 2
        if name == "index":  # only those offsets, one lookup per topic and id
            assert planned == len(expected)
            assert sorted(lookups) == sorted((t, i) for t in TOPICS for i in ids)
        else:  # every offset read, then checked
            assert planned == len(rows)
        one = plan_and_read(reader_for(path, filters=[EqualTo(("msg_id",), ids[0])]))[1]
        assert one == [r for r in expected if r[COLUMNS.index("msg_id")] == ids[0]]


def test_pushed_keys_equality_of_whole_arrays_is_read_through_the_index(stores):
    from pyspark.sql.datasource import EqualTo, In

    rows = all_rows(stores["index"])
    at = COLUMNS.index("keys")
    for f, wanted in ((EqualTo(("keys",), ["k0", "own-0"]), [("k0", "own-0")]),
                      (In(("keys",), [["k5"], ["k6", "own-6"], ["own-6"]]),
                       [("k5",), ("k6", "own-6"), ("own-6",)])):
        expected = [r for r in rows if r[at] in wanted]
        assert expected
        # planned: the messages carrying each array's first key (then checked)
        firsts = carrying(rows, {w[0] for w in wanted})
        assert plan_and_read(reader_for(stores["index"], filters=[f])) == (
            len(firsts), expected) and len(firsts) < len(rows)
        assert without_id(plan_and_read(reader_for(stores["scan"], filters=[f]))[1]) == \
            without_id(expected)


def test_keys_that_cannot_be_pushed_go_back_to_spark():
    from pyspark.sql.datasource import EqualTo, In

    from rmq_source.pushdown import push_filters

    for f in (EqualTo(("keys",), ["a b"]), In(("keys",), [["a"], [""]]),
              EqualTo(("keys",), "a"), EqualTo(("keys",), [None])):
        assert push_filters([f])[1] == [f]


# --------------------------------------------------------------------------- groups, rmq://


def test_a_group_is_read_by_keys_through_each_members_index(tmp_path, lookups):
    path = str(tmp_path / "group")
    clock = FakeClock()
    with StoreGroup.create(path, 2, SMALL, clock=clock) as group:
        producer = group.producer("keys")
        sent = [producer.send(Message(TOPICS[i % 2], b"g%d" % i, keys=key_of(i)))
                for i in range(104)]
    assert {r.store_name for r in sent} == {"store-0", "store-1"}
    keys = ("k1", "k2", "own-30")
    planned, rows = plan_and_read(reader_for(path, keys=",".join(keys)))
    expected = carrying(all_rows(path), keys)
    assert rows == expected and planned == len(expected) == 2 * 8 + 1
    # per member, topic (of those the member holds) and key
    assert set(lookups) == {(t, k) for t in TOPICS for k in keys}
    assert len(lookups) <= 2 * len(TOPICS) * len(keys)


@pytest.fixture
def served(tmp_path):
    server = StoreServer(str(tmp_path / "served"), SMALL, listen="127.0.0.1:0", token=TOKEN)
    yield server
    server.close()


def test_an_rmq_url_is_read_by_keys_through_the_servers_index(served):
    from store import connect

    with connect(served.url, token=TOKEN, timeout_s=30) as remote:
        producer = remote.producer("keys")
        for i in range(80):
            producer.send(Message(TOPICS[i % 2], b"r%d" % i, keys=key_of(i)))
    keys = ("k4", "own-12")
    planned, rows = plan_and_read(reader_for(served.url, keys=",".join(keys), token=TOKEN))
    expected = carrying(plan_and_read(reader_for(served.url, token=TOKEN))[1], keys)
    assert rows == expected and planned == len(expected) == 7


# --------------------------------------------------------------------------- Spark


@pytest.mark.spark
def test_spark_reads_by_keys_the_rows_of_the_same_where(spark, stores):
    keys = "k2,own-42"
    where = "arrays_overlap(keys, array('k2', 'own-42'))"
    got = {}
    for name, path in stores.items():
        base = (spark.read.format("rmq").option("subscribe", ",".join(TOPICS))
                .option("deliverDue", "false"))
        got[name] = spark_rows(base.option("keys", keys).load(path))
        assert got[name] == spark_rows(base.load(path).where(where)) and got[name], name
    assert without_id(got["index"]) == without_id(got["scan"])


def read_where(spark, path, condition, pushdown):
    if pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
    try:
        df = (spark.read.format("rmq").option("subscribe", ",".join(TOPICS))
              .option("deliverDue", "false").load(path).where(condition))
        return spark_rows(df), df._jdf.queryExecution().optimizedPlan().toString()
    finally:
        spark.conf.unset(PUSHDOWN_CONF)


@pytest.mark.spark
def test_spark_pushes_msg_id_and_keys_to_the_index_with_the_rows_of_pushdown_off(spark, stores):
    for path in stores.values():
        ids = sorted({r[COLUMNS.index("msg_id")] for r in all_rows(path)})[::9]
        by_id = f"msg_id IN ({', '.join(repr(i) for i in ids)})"
        for condition in (by_id, "keys = array('k0', 'own-0')",
                          f"{by_id} AND keys = array('k0', 'own-0')"):
            pushed, plan = read_where(spark, path, condition, pushdown=True)
            plain, plain_plan = read_where(spark, path, condition, pushdown=False)
            assert pushed == plain, condition
            assert "Filter" not in plan and "Filter" in plain_plan
            assert pushed or "AND" in condition


@pytest.mark.spark
def test_a_stream_with_keys_returns_the_messages_carrying_them(spark, stores, tmp_path):
    got, lock = [], threading.Lock()

    def collect(df, batch_id):
        rows = spark_rows(df)
        with lock:
            got.extend(rows)

    query = (spark.readStream.format("rmq").option("subscribe", ",".join(TOPICS))
             .option("startingOffsets", "earliest").option("deliverDue", "false")
             .option("keys", "k7,own-21").option("maxOffsetsPerTrigger", "50")
             .load(stores["index"]).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    expected = carrying(all_rows(stores["index"]), ("k7", "own-21"))
    assert sorted(got) == expected and expected
