"""``Producer.send_table``: the columnar write path, against single sends and a simple model."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import (
    InvalidDelayError,
    InvalidMessageError,
    InvalidTopicError,
    Message,
    MessageStore,
    MessageTooLargeError,
    StoreConfig,
    StoreError,
)

PROPS = pa.map_(pa.string(), pa.string())


@pytest.fixture(params=["sequential", "parallel"])
def column_paths(request, monkeypatch):
    """Both ways the whole-column path runs: the property maps checked after the other
    columns, or on a helper thread beside them (tables of ``PARALLEL_ROWS`` rows or more;
    here every table)."""
    import store.produce.table_rows

    if request.param == "parallel":
        monkeypatch.setattr(store.produce.table_rows, "PARALLEL_ROWS", 1)
    return request.param


def _record_fields(store, offset):
    rec = store.read_record(offset)
    props = dict(rec.properties)
    props.pop("UNIQ_KEY")
    return (rec.topic, rec.body, rec.flag, rec.sys_flag, rec.born_timestamp_ms,
            rec.reconsume_times, rec.total_size, props)


def _rows(store, topic):
    out = []
    for q in store.queue_ids(topic):
        out += [(q, v) for v in store.pull(topic, q, store.min_offset(topic, q), 10_000)]
    return out


def test_same_records_as_single_sends(tmp_path, small_config, clock, column_paths):
    messages = [Message("orders", b"body-%d" % i, tags=("a", None, "b")[i % 3],
                        keys=(None, "k1", ["k2", "k3"])[i % 3],
                        properties=({}, {"x": "1"}, {"x": "2", "ü": "✓"})[i % 3])
                for i in range(30)]
    singles, table = str(tmp_path / "singles"), str(tmp_path / "table")
    with MessageStore.open(singles, small_config, clock=clock) as s:
        p = s.producer("g")
        sent = [p.send(m) for m in messages]
        expected = [_record_fields(s, r.commitlog_offset) for r in sent]
    with MessageStore.open(table, small_config, clock=clock) as s:
        result = s.producer("g").send_table(pa.table({
            "topic": [m.topic for m in messages], "body": [m.body for m in messages],
            "tags": [m.tags for m in messages],
            "keys": pa.array([[m.keys] if isinstance(m.keys, str) else m.keys
                              for m in messages], pa.list_(pa.string())),
            "properties": pa.array([list(m.properties.items()) for m in messages], PROPS)}))
        got = [_record_fields(s, o) for o in result.column("commitlog_offset").to_pylist()]
        ids = result.column("msg_id").to_pylist()
        assert [s.read_record(o).properties["UNIQ_KEY"]
                for o in result.column("commitlog_offset").to_pylist()] == ids
        assert len(set(ids)) == len(ids)
        # rows of one topic go to one queue, in table order
        rows = _rows(s, "orders")
        assert [v.body for _, v in rows] == [m.body for m in messages]
        assert result.column("queue_offset").to_pylist() == list(range(30))
    assert got == expected


def test_delayed_rows_are_routed_as_single_sends_route_them(tmp_path, small_config, clock):
    """Delay-level and timer rows get the routing pairs the services' rewrite gives a send."""
    delays = [("delay_ms", 1_234), ("delay_level", 3), ("deliver_at", clock() + 99_999),
              (None, None)] * 6
    topics = ["a", "bb", "ccc"]
    singles, table = str(tmp_path / "singles"), str(tmp_path / "table")
    with MessageStore.open(singles, small_config, clock=clock) as s:
        p = s.producer("g")
        expected = []
        for i, (kind, value) in enumerate(delays):
            name = "deliver_at_ms" if kind == "deliver_at" else kind
            kwargs = {} if kind is None else {name: value}
            r = p.send(Message(topics[i % 3], b"m%d" % i, tags="t"), **kwargs)
            expected.append(_record_fields(s, r.commitlog_offset))
    columns = {kind: pa.array([v if k == kind else None for k, v in delays], pa.int64())
               for kind in ("delay_ms", "delay_level", "deliver_at")}
    with MessageStore.open(table, small_config, clock=clock) as s:
        result = s.producer("g").send_table(pa.table({
            "topic": [topics[i % 3] for i in range(len(delays))],
            "body": [b"m%d" % i for i in range(len(delays))], "tags": ["t"] * len(delays),
            **columns}))
        got = [_record_fields(s, o) for o in result.column("commitlog_offset").to_pylist()]
    for fields in got + expected:  # the queue: round robin per send, one per table and topic
        assert fields[-1].pop("REAL_QID", None) in (None, "0", "1", "2", "3")
    assert got == expected
    assert any("TIMER_OUT_MS" in g[-1] for g in got) and any("DELAY" in g[-1] for g in got)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(
    st.sampled_from(["t1", "t2", "t3"]),
    st.binary(min_size=1, max_size=200),
    st.one_of(st.none(), st.sampled_from(["a", "b", "标签"])),
    st.one_of(st.none(), st.lists(st.sampled_from(["k1", "k2", "key-3"]), max_size=3)),
    st.dictionaries(st.sampled_from(["p", "q", "ü"]), st.sampled_from(["1", "v", "✓"]),
                    max_size=3)), min_size=1, max_size=40))
def test_round_trip_against_a_model(fresh_dir, small_config, clock, column_paths, rows):
    path = str(fresh_dir("rt"))
    with MessageStore.open(path, small_config, clock=clock) as s:
        s.producer("g").send_table(pa.table({
            "topic": [r[0] for r in rows], "body": [r[1] for r in rows],
            "tags": pa.array([r[2] for r in rows], pa.string()),
            "keys": pa.array([r[3] for r in rows], pa.list_(pa.string())),
            "properties": pa.array([list(r[4].items()) for r in rows], PROPS)}))
        for topic in ("t1", "t2", "t3"):
            model = [(r[1], r[2], tuple(r[3] or ()), r[4]) for r in rows if r[0] == topic]
            got = [(v.body, v.tags, v.keys, v.properties) for _, v in _rows(s, topic)] \
                if topic in s.topics() else []
            assert got == model


def test_pandas_value_column_and_topic_argument(store):
    frame = pd.DataFrame({"value": ["a", "b"], "tags": ["x", None]})
    result = store.producer("g").send_table(frame, topic="orders")
    assert result.num_rows == 2 and result.column("topic").to_pylist() == ["orders"] * 2
    assert sorted(v.body for _, v in _rows(store, "orders")) == [b"a", b"b"]


@pytest.mark.parametrize("table, error, needle", [
    (pa.table({"topic": ["t"], "tags": ["x"]}), InvalidMessageError, "body"),
    (pa.table({"topic": ["t"], "body": [b"x"], "colour": ["red"]}), InvalidMessageError,
     "colour"),
    (pa.table({"topic": ["bad topic"], "body": [b"x"]}), InvalidTopicError, "bad topic"),
    (pa.table({"topic": ["t", "t"], "body": [b"x", b"x" * (4 * 1024 * 1024 + 1)]}),
     MessageTooLargeError, "body"),
    (pa.table({"topic": ["t"], "body": [b""]}), InvalidMessageError, "body"),
    (pa.table({"topic": ["t"], "body": [b"x"], "delay_ms": pa.array([5], pa.int64()),
               "delay_level": pa.array([2], pa.int32())}), InvalidDelayError, "at most one"),
    (pa.table({"topic": ["t"], "body": [b"x"], "delay_ms": pa.array([-1], pa.int64())}),
     InvalidDelayError, "delay_ms=-1"),
    (pa.table({"topic": ["t"], "body": [b"x"],
               "properties": pa.array([[("KEYS", "x")]], PROPS)}), InvalidMessageError,
     "reserved"),
    (pa.table({"topic": ["t"], "body": [1]}), InvalidMessageError, "binary or string"),
    (pa.table({"topic": ["t"], "body": [b"x"], "properties": pa.array(
        [[(1, "v")]], pa.map_(pa.int64(), pa.string()))}), InvalidMessageError, "must be str"),
    (pa.table({"topic": ["t"], "body": [b"x"], "properties": pa.array(
        [[("a", 2)]], pa.map_(pa.string(), pa.int64()))}), InvalidMessageError, "must be str"),
], ids=["no-body", "unknown-column", "bad-topic", "oversized", "empty-body", "two-delays",
        "negative-delay", "reserved-property", "body-type", "int-property-names",
        "int-property-values"])
def test_bad_input_is_refused_and_nothing_is_written(store, table, error, needle,
                                                     column_paths):
    before, topics = store.confirmed_offset(), store.topics()
    with pytest.raises(error, match=needle) as info:
        store.producer("g").send_table(table)
    assert isinstance(info.value, StoreError)
    assert store.confirmed_offset() == before and store.topics() == topics


@pytest.mark.parametrize("table, error, needle", [
    (pa.table({"topic": pa.array([None], pa.string()), "body": [b"x"],
               "properties": pa.array([1])}), InvalidTopicError, "None"),
    (pa.table({"topic": ["t"], "body": [b"x"], "properties": pa.array([1])}),
     InvalidMessageError, "column properties has type"),
    (pa.table({"topic": ["t"], "body": [1], "properties": pa.array([1])}),
     InvalidMessageError, "binary or string"),
    (pa.table({"topic": ["t", "t"], "body": [b"x", b"y"],
               "properties": pa.array([[("p", "1")], [("p", "a\x02b")]], PROPS)}),
     InvalidMessageError, "p"),
], ids=["null-topic-and-properties-type", "properties-type", "body-type-and-properties-type",
        "separator-in-a-value"])
def test_two_faults_raise_what_the_sequential_path_raises(store, table, error, needle,
                                                          column_paths):
    """With the property maps checked on a helper thread, a table with several faults still
    gets the error of the first one in the order of the columns (what a sequential check
    raises), and nothing is written."""
    before = store.confirmed_offset()
    with pytest.raises(error, match=needle):
        store.producer("g").send_table(table)
    assert store.confirmed_offset() == before


@pytest.mark.parametrize("keys", [
    ["é b", "k-ü", None, ""], ["a  b", "c"], [" a", "c"], ["a ", "c"], ["a\tb", "c"],
    ["日本 語", "a\u3000b"], ["日本  語"],
], ids=["non-ascii", "two-spaces", "leading", "trailing", "tab", "wide", "wide-two-spaces"])
def test_keys_are_what_single_sends_write(tmp_path, small_config, clock, keys):
    """Keys the column path writes as given (plain ASCII, text checked by Arrow) or hands to
    the per-row path (normalised) come out as single sends write them."""
    messages = [Message("t", b"x", keys=k) for k in keys]
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as s:
        p = s.producer("g")
        singles = [s.read_record(p.send(m).commitlog_offset).properties.get("KEYS")
                   for m in messages]
        result = p.send_table(pa.table({"topic": ["t"] * len(keys), "body": [b"x"] * len(keys),
                                        "keys": pa.array(keys, pa.string())}))
        got = [s.read_record(o).properties.get("KEYS")
               for o in result.column("commitlog_offset").to_pylist()]
    assert got == singles


@pytest.mark.parametrize("value", ["\u3000", "a \u3000", "\u00a0 b"])
def test_keys_only_of_wide_whitespace_are_refused(store, value):
    before = store.confirmed_offset()
    with pytest.raises(InvalidMessageError, match="blank"):
        store.producer("g").send(Message("t", b"x", keys=value))
    with pytest.raises(InvalidMessageError, match="blank"):
        store.producer("g").send_table(pa.table({"topic": ["t", "t"], "body": [b"x", b"y"],
                                                 "keys": ["ok", value]}))
    assert store.confirmed_offset() == before


def test_delayed_rows_surface_once_due_and_never_early(store, clock):
    now = clock()
    table = pa.table({
        "topic": ["d"] * 4, "body": [b"timer", b"at", b"level", b"now"],
        "delay_ms": pa.array([3_000, None, None, None], pa.int64()),
        "deliver_at": pa.array([None, dt.datetime.fromtimestamp((now + 7_000) / 1000,
                                                                tz=dt.timezone.utc), None, None],
                               pa.timestamp("ms", tz="UTC")),
        "delay_level": pa.array([None, None, 1, None], pa.int32())})
    result = store.producer("g").send_table(table)
    assert result.column("deliver_at_ms").to_pylist() == [now + 3_000, now + 7_000,
                                                          now + 1_000, None]
    assert result.column("queue_offset").to_pylist()[:3] == [None] * 3
    seen = []
    for step in range(10):
        store.deliver_due()
        bodies = {v.body for _, v in _rows(store, "d")}
        for body, due in ((b"now", now), (b"level", now + 1_000), (b"timer", now + 3_000),
                          (b"at", now + 7_000)):
            assert (body in bodies) == (clock() >= due), (body, clock() - now)
        seen.append(len(bodies))
        clock.advance(1_000)
    assert seen[-1] == 4 and sorted(v.body for _, v in _rows(store, "d")) == sorted(
        [b"timer", b"at", b"level", b"now"])


def test_columns_with_non_nullable_children_as_spark_sends_them(tmp_path, small_config, clock):
    """Spark's Arrow batches mark list elements and map values "not null"."""
    keys_type = pa.list_(pa.field("element", pa.string(), nullable=False))
    props_type = pa.map_(pa.string(), pa.field("value", pa.string(), nullable=False))
    table = pa.table({"topic": ["a", "a"], "body": [b"x", b"y"],
                      "keys": pa.array([["k1", "k2"], []], keys_type),
                      "properties": pa.array([[("p", "v")], []], props_type)})
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.producer().send_table(table)
        views = store.pull("a", 0, 0)
        assert [(v.keys, dict(v.properties)) for v in views] == [(("k1", "k2"), {"p": "v"}),
                                                                 ((), {})]


def test_a_bad_topic_argument_is_refused(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        for bad in ("../etc", "a b", "RMQ_SYS_TRANS_HALF_TOPIC", ""):
            with pytest.raises(InvalidTopicError):
                store.producer().send_table(pa.table({"body": [b"x"]}), topic=bad)
        assert store.topics() == []




def test_each_chunk_of_a_topic_takes_the_next_queue(tmp_path, clock):
    """Rows of one topic in one chunk of CHUNK_ROWS go to one queue, the next of the topic's
    round robin; each queue's offsets continue in row order and the records follow each
    other in the CommitLog."""
    from store.produce.table_producer import CHUNK_ROWS

    n = 9 * CHUNK_ROWS + 123  # more chunks than queues, and a short last chunk
    config = StoreConfig(commitlog_file_size_bytes=1 << 20, default_queue_count=3)
    with MessageStore.open(str(tmp_path / "s"), config, clock=clock) as s:
        out = s.producer("g").send_table(pa.table({
            "topic": ["a", "b"] * (n // 2) + ["a"] * (n % 2),
            "body": [b"%d" % i for i in range(n)]}))
        queues = out.column("queue_id").to_numpy()
        topics = out.column("topic").to_pylist()
        for lo in range(0, n, CHUNK_ROWS):
            k = lo // CHUNK_ROWS
            for name in ("a", "b"):
                part = zip(queues[lo:lo + CHUNK_ROWS], topics[lo:lo + CHUNK_ROWS])
                got = {int(q) for q, t in part if t == name}
                assert got == {k % 3}, (name, k, got)
        offsets = out.column("queue_offset").to_pylist()
        seen: dict = {}
        for q, t, off in zip(queues.tolist(), topics, offsets):
            assert off == seen.get((t, q), -1) + 1
            seen[(t, q)] = off
        log = out.column("commitlog_offset").to_numpy()
        assert (log[1:] > log[:-1]).all()
        for i in (0, CHUNK_ROWS, 8 * CHUNK_ROWS, 9 * CHUNK_ROWS, n - 1):
            record = s.read_record(int(log[i]))
            assert record.body == b"%d" % i and record.queue_id == queues[i]


def test_results_name_each_rows_own_topic(store):
    """The results' topic column is each row's topic, on the whole-column path (the user's
    column, reused), on the per-row path (a keys value only that path normalises) and with
    ``topic=``."""
    topics = ["a", "b", "a", "c", "b"]
    producer = store.producer("g")
    for extra in ({}, {"keys": ["k", "x  y", "k", None, "k"]}):
        out = producer.send_table(pa.table({"topic": topics, "body": [b"1"] * 5, **extra}))
        assert out.column("topic").type == pa.string()
        assert out.column("topic").to_pylist() == topics
    out = producer.send_table(pa.table({"body": [b"1"] * 3}), topic="c")
    assert out.column("topic").to_pylist() == ["c"] * 3


def test_rows_of_large_bodies_make_chunks_of_fewer_rows(tmp_path, clock):
    """A chunk holds at most CHUNK_BODY_BYTES of bodies (one row at least): each chunk goes
    to the next queue, and every row reads back whole."""
    from store.produce.table_producer import CHUNK_BODY_BYTES

    size = CHUNK_BODY_BYTES // 4  # four rows a chunk
    bodies = [bytes([i]) * size for i in range(10)] + [b"x" * (CHUNK_BODY_BYTES - 1)]
    config = StoreConfig(commitlog_file_size_bytes=1 << 26, default_queue_count=8)
    with MessageStore.open(str(tmp_path / "s"), config, clock=clock) as s:
        out = s.producer("g").send_table(pa.table({"topic": ["big"] * 11, "body": bodies}))
        queues = out.column("queue_id").to_pylist()
        q = queues[0]
        assert queues == [q] * 4 + [(q + 1) % 8] * 4 + [(q + 2) % 8] * 2 + [(q + 3) % 8]
        for i, offset in enumerate(out.column("commitlog_offset").to_pylist()):
            assert s.read_record(offset).body == bodies[i]
