"""The columnar check round and end_transactions against a per-record model of RocketMQ's rules.

The model below is the check round as it was written before it became columnar: one decoded
record at a time, in walk order, with RocketMQ's rules (see store.transaction.check_loop).  The
store's round must decide every half offset the same way, append copies with the same
topics and properties, stop at the same offset and ask about the same transactions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import SMALL, FakeClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import store.transaction.check_loop as check_module
from store import (
    InvalidMessageError,
    MessageStore,
    TransactionStateError,
    UnknownMessageError,
)
from store.formats.record_codec import TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK, RecordSpec
from store.base.errors import CorruptRecordError
from store.formats.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
)
from store.formats.message import PROPERTY_SINK
from store.transaction.half import half_spec, immunity_ms, ordered_properties

CONFIG = dataclasses.replace(SMALL, transaction_check_max=4)
TIMEOUT, INTERVAL, CHECK_MAX = 6000, 30_000, 4


def check_times(record) -> int:
    try:
        return int(record.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, 0))
    except ValueError:
        return 0


def put_back_spec(record, **changes) -> RecordSpec:
    """The model's copy of a half for the end of the half queue."""
    props = ordered_properties(record.properties, record.properties["__transactionId__"],
                               **changes)
    return record.to_spec(topic=TRANS_HALF_TOPIC, queue_id=0, properties=props,
                          prepared_transaction_offset=0)


def discard_spec(record) -> RecordSpec:
    return dataclasses.replace(put_back_spec(record), topic=TRANS_CHECK_MAX_TIME_TOPIC)


def model_round(store, started, max_checks):
    """The per-record round: ``(kinds, specs of the copies, tx ids asked with counts, stop)``."""
    index = store.transactions.index
    index.refresh()
    qoffs, _ = index.window(0, index.half_scanned)
    reserved = store.config.file_reserved_time_ms
    kinds, specs, asks = [], [], []
    for q in qoffs.tolist():
        if max_checks is not None and len(asks) >= max_checks:
            return kinds, specs, asks, q
        try:
            record = store.read_record(int(index.half_clog.data[q - index.base]))
        except CorruptRecordError:
            continue
        props = record.properties
        times = check_times(record)
        age = started - record.born_timestamp_ms
        if times >= CHECK_MAX or age > reserved:
            specs.append(discard_spec(record))
            kinds.append("discard")
            continue
        if record.store_timestamp_ms >= started:
            return kinds, specs, asks, q
        made = (PROPERTY_TRANSACTION_CHECK_TIMES in props
                or PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in props)
        if made and started - record.store_timestamp_ms < INTERVAL:
            return kinds, specs, asks, q
        custom = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if custom is not None:
            if age <= immunity_ms(custom, TIMEOUT, raise_to_timeout=False):
                first = props.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET) or str(q)
                specs.append(put_back_spec(
                    record, **{PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: first}))
                kinds.append("immune")
                continue
        elif 0 <= age <= TIMEOUT:
            return kinds, specs, asks, q
        specs.append(put_back_spec(record, **{PROPERTY_TRANSACTION_CHECK_TIMES: str(times + 1)}))
        kinds.append("check")
        asks.append((record.properties["__transactionId__"], times + 1))
    return kinds, specs, asks, index.half_scanned


half_st = st.fixed_dictionaries({
    "times": st.one_of(st.none(), st.integers(0, 6)),
    "first": st.booleans(),
    "immunity": st.one_of(st.none(), st.sampled_from(["-1", "0", "3", "20", "x"])),
    "born_age": st.integers(0, 60_000),
    "store_age": st.integers(0, 60_000),
    "ended": st.booleans(),
    "body": st.integers(10, 3000),
})


def build(path, halves, clock):
    started = clock()
    store = MessageStore.open(path, CONFIG, clock=clock)
    ids = store.id_generator.next_ids(len(halves), started)
    for i, (h, tx) in enumerate(zip(halves, ids)):
        props = {"UNIQ_KEY": tx, "KEYS": f"o-{i}", "TAGS": f"t{i % 3}", "note": "é"}
        if h["times"] is not None:
            props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(h["times"])
        if h["first"]:
            props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(1000 + i)
        if h["immunity"] is not None:
            props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = h["immunity"]
        clock.set(started - h["store_age"])
        store.append([half_spec(RecordSpec(topic="payments", body=b"b" * h["body"],
                                           properties=props,
                                           born_timestamp_ms=started - h["born_age"]),
                                "pay", i % 4)])
    clock.set(started)
    ended = [tx for h, tx in zip(halves, ids) if h["ended"]]
    if ended:
        store.end_transactions([(tx, "ROLLBACK") for tx in ended], from_check=True)
    return store


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(halves=st.lists(half_st, min_size=1, max_size=40),
       max_checks=st.one_of(st.none(), st.integers(1, 10)),
       chunk=st.sampled_from([1, 3, 8192]))
def test_round_decides_like_the_per_record_model(fresh_dir, monkeypatch, halves,
                                                  max_checks, chunk):
    monkeypatch.setattr(check_module, "WALK_CHUNK", chunk)
    clock = FakeClock()
    store = build(fresh_dir("round") / "s", halves, clock)
    with store:
        kinds, specs, asks, stop = model_round(store, clock(), max_checks)
        half_before = store.max_offset(TRANS_HALF_TOPIC, 0)
        disc_before = (store.max_offset(TRANS_CHECK_MAX_TIME_TOPIC, 0)
                       if TRANS_CHECK_MAX_TIME_TOPIC in store.topics(include_system=True) else 0)
        plan = store.prepare_transaction_checks(max_checks=max_checks)
        assert plan.discarded == kinds.count("discard")
        assert plan.immune == kinds.count("immune")
        assert plan.half_offset == stop
        assert [(v.transaction_id, v.check_times) for v in plan.checks] == asks
        # the copies: same topics and properties, in walk order per queue
        copies = store.pull(TRANS_HALF_TOPIC, 0, half_before, 10_000)
        discards = (store.pull(TRANS_CHECK_MAX_TIME_TOPIC, 0, disc_before, 10_000)
                    if plan.discarded else [])
        want_half = [s for s in specs if s.topic == TRANS_HALF_TOPIC]
        want_disc = [s for s in specs if s.topic == TRANS_CHECK_MAX_TIME_TOPIC]
        assert len(copies) == len(want_half) and len(discards) == len(want_disc)
        for got, want in zip(copies + discards, want_half + want_disc):
            record = store.read_record(got.commitlog_offset)
            assert record.properties == dict(want.properties)
            assert record.body == want.body and record.born_timestamp_ms == want.born_timestamp_ms
            assert record.prepared_transaction_offset == 0
        # the Arrow rows are the views
        rows = plan.checks.to_arrow().to_pylist()
        for row, view in zip(rows, plan.checks):
            assert row["transaction_id"] == view.transaction_id
            assert (row["topic"], row["queue_id"]) == (view.topic, view.queue_id)
            assert row["producer_group"] == view.producer_group == "pay"
            assert row["check_times"] == view.check_times
            assert row["body"] == view.body and row["keys"] == list(view.keys)
            assert dict(row["properties"]) == view.properties
            assert row["commitlog_offset"] == view.commitlog_offset


def test_rocketmq_half_without_closing_separator_is_copied_and_committed(tmp_path):
    """RocketMQ writes the last pair without its 0x02: a put-back appends after closing it,
    and the commit record keeps the half's properties exactly."""
    clock = FakeClock()
    with MessageStore.open(tmp_path / "s", SMALL, clock=clock) as store:
        tx = store.id_generator.next_ids(1, clock())[0]
        props = {"__transactionId__": tx, "UNIQ_KEY": tx, "REAL_TOPIC": "payments",
                 "REAL_QID": "1", "PGROUP": "pay", "TRAN_MSG": "true", "TAGS": "paid"}
        raw = "".join(f"{k}\x01{v}\x02" for k, v in props.items())[:-1].encode()
        store.ensure_topic("payments")
        import zlib

        from store.formats.record_codec import HEADER_DTYPE, MESSAGE_MAGIC_CODE_V1
        from store.core.append_types import EncodedRecords
        from store.formats.byte_columns import ByteColumn
        h = np.zeros(1, HEADER_DTYPE)
        h["magic"] = MESSAGE_MAGIC_CODE_V1
        h["body_length"] = 3
        h["body_crc"] = zlib.crc32(b"abc") & 0x7FFFFFFF
        h["born_timestamp"] = clock() - 10_000
        store.append_encoded(EncodedRecords(
            headers=h, bodies=ByteColumn.of([b"abc"]), properties=ByteColumn.of([raw]),
            properties_length=np.array([len(raw)]), topics=[TRANS_HALF_TOPIC],
            topic_ids=np.zeros(1, np.int64), queue_ids=np.zeros(1, np.int64),
            tags_codes=np.zeros(1, np.int64), body_crc_known=True))
        clock.advance(10_000)
        plan = store.prepare_transaction_checks()
        (view,) = plan.checks
        assert view.check_times == 1 and view.topic == "payments" and view.tags == "paid"
        copy = store.read_record(view.commitlog_offset)
        assert copy.properties == {**props, PROPERTY_TRANSACTION_CHECK_TIMES: "1"}
        assert store.end_transactions([(tx, "COMMIT")], from_check=True) == [True]
        (final,) = store.pull("payments", 1, 0, 10)
        record = store.read_record(final.commitlog_offset)
        assert record.properties == copy.properties and record.body == b"abc"
        assert record.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE
        assert record.prepared_transaction_offset == view.commitlog_offset
        assert final.tags == "paid"
        assert store.consume_queue("payments", 1).entries(0, 1)["tags_code"][0] == \
            store.tag_hashes(["paid"])[0]


def _open_halves(store, clock, n, **props):
    from store import Message

    class Unknown:
        def execute_local_transaction(self, message, arg):
            from store import LocalTransactionState
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, view):
            from store import LocalTransactionState
            return LocalTransactionState.UNKNOW

    txp = store.transaction_producer("pay", Unknown())
    return [txp.send_in_transaction(Message("payments", b"x", keys=f"o-{i}",
                                            properties=props)).transaction_id
            for i in range(n)]


def test_end_transactions_checks_every_item_before_writing(tmp_path):
    clock = FakeClock()
    with MessageStore.open(tmp_path / "s", SMALL, clock=clock) as store:
        ids = _open_halves(store, clock, 5)
        confirmed = store.confirmed_offset()
        with pytest.raises(UnknownMessageError, match="not known"):
            store.end_transactions([(ids[0], "COMMIT"), ("F" * 32, "COMMIT")])
        with pytest.raises(TransactionStateError, match="allowed: COMMIT"):
            store.end_transactions([(ids[0], "COMMIT"), (ids[1], "MAYBE")])
        assert store.confirmed_offset() == confirmed
        assert store.transactions.is_ended(ids) == [False] * 5
        # UNKNOW, then COMMIT of the same id in one call: the COMMIT ends it, a repeat does not
        assert store.end_transactions([(ids[0], "UNKNOWN"), (ids[0], "COMMIT"),
                                       (ids[0], "ROLLBACK"), (ids[1], "ROLLBACK")]) == \
            [False, True, False, True]
        assert store.end_transactions([(ids[0], "COMMIT")]) == [False]
        assert sum(len(store.pull("payments", q, 0, 100)) for q in store.queue_ids("payments")) \
            == 1


def test_late_answer_and_sink_commit_are_refused_and_nothing_is_written(tmp_path):
    clock = FakeClock()
    with MessageStore.open(tmp_path / "s", SMALL, clock=clock) as store:
        ids = _open_halves(store, clock, 3, **{PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "10"})
        clock.advance(10_001)
        confirmed = store.confirmed_offset()
        with pytest.raises(TransactionStateError, match="past its immunity of 10000 ms"):
            store.end_transactions([(ids[0], "COMMIT"), (ids[1], "ROLLBACK")])
        assert store.confirmed_offset() == confirmed
        assert store.end_transactions([(ids[0], "COMMIT")], from_check=True) == [True]
        # a sink half may be rolled back, never committed by hand
        sink_tx = "SINK" + "0" * 28
        store.append([half_spec(RecordSpec(topic="payments", body=b"s",
                                           properties={"UNIQ_KEY": sink_tx,
                                                       PROPERTY_SINK: "orders-sink"}),
                                "pay", 0)])
        with pytest.raises(TransactionStateError, match="rmq sink 'orders-sink'"):
            store.end_transactions([(ids[2], "COMMIT"), (sink_tx, "COMMIT")], from_check=True)
        assert store.transactions.is_ended([ids[2], sink_tx]) == [False, False]
        assert store.end_transactions([(sink_tx, "ROLLBACK")]) == [True]


def test_commit_without_a_real_topic_is_refused(tmp_path):
    clock = FakeClock()
    with MessageStore.open(tmp_path / "s", SMALL, clock=clock) as store:
        tx = store.id_generator.next_ids(1, clock())[0]
        spec = half_spec(RecordSpec(topic="payments", body=b"x", properties={"UNIQ_KEY": tx}),
                         "pay", 0)
        props = {k: v for k, v in spec.properties.items() if k != "REAL_TOPIC"}
        store.append([dataclasses.replace(spec, properties=props)])
        with pytest.raises(InvalidMessageError, match="REAL_TOPIC=None"):
            store.end_transactions([(tx, "COMMIT")])
        assert store.end_transactions([(tx, "ROLLBACK")]) == [True]
