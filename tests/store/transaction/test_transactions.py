"""Transactional messages: half messages, end_transaction, the check round (reference §6)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import SMALL

from store import (
    InvalidDelayError,
    InvalidMessageError,
    InvalidTopicError,
    LocalTransactionState,
    Message,
    MessageStore,
    MessageView,
    StoreConfig,
    TransactionStateError,
    UnknownMessageError,
)
from store.formats.record_codec import TRANSACTION_COMMIT_TYPE, RecordSpec
from store.formats.message import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from store.transaction.half import immunity_ms
from store.transaction.op import REMOVE_TAG, op_specs, parse_op_body

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
TIMEOUT = 6000
INTERVAL = 30_000


class Listener:
    """Local transaction answers ``arg``; raises when ``arg`` is an exception."""

    def __init__(self, check=UNKNOW):
        self.check_answer = check
        self.checked: list[MessageView] = []

    def execute_local_transaction(self, message, arg):
        if isinstance(arg, Exception):
            raise arg
        return arg

    def check_local_transaction(self, view):
        self.checked.append(view)
        return self.check_answer


def real_messages(store, topic="payments"):
    if topic not in store.topics():
        return []
    return [v for q in store.queue_ids(topic) for v in store.pull(topic, q, 0, 10_000)]


def system_count(store, topic):
    if topic not in store.topics(include_system=True):
        return 0
    return store.max_offset(topic, 0)


def op_offsets(store):
    out = []
    for v in store.pull(TRANS_OP_HALF_TOPIC, 0, 0, 10_000) if system_count(
            store, TRANS_OP_HALF_TOPIC) else []:
        assert v.tags == REMOVE_TAG
        out.extend(parse_op_body(v.body))
    return out


@pytest.fixture
def tx_store(store_path, clock):
    s = MessageStore.open(store_path, SMALL, clock=clock)
    yield s
    s.close()


def send(txp, i, arg, **props):
    return txp.send_in_transaction(
        Message("payments", f"pay-{i}".encode(), tags="paid", keys=f"o-{i}",
                properties=props), arg=arg)


# --------------------------------------------------------------------------- the five outcomes
def test_five_outcomes_only_committed_are_consumable(store, clock):
    """120 messages cycling commit, rollback, commit-on-check, rollback-on-check, UNKNOW."""
    listener = Listener()
    txp = store.transaction_producer("pay-service", listener)
    kinds = ["commit", "rollback", "check-commit", "check-rollback", "unknown"]
    sent = {}
    for i in range(120):
        kind = kinds[i % 5]
        arg = {"commit": COMMIT, "rollback": ROLLBACK}.get(kind, UNKNOW)
        r = send(txp, i, arg)
        assert r.local_state is arg and r.ended == (arg is not UNKNOW)
        sent[r.transaction_id] = kind
    # nothing open is visible yet; the direct outcomes are
    assert {v.transaction_id for v in real_messages(store)} == {
        t for t, k in sent.items() if k == "commit"}

    asked = []

    def resolve(view):
        asked.append(view.transaction_id)
        return {"check-commit": COMMIT, "check-rollback": ROLLBACK}.get(sent[view.transaction_id],
                                                                         UNKNOW)

    clock.advance(TIMEOUT + 1)
    first = store.check_transactions(resolve)
    assert (first.checked, first.committed, first.rolled_back, first.unknown) == (72, 24, 24, 24)
    for round_no in range(2, 16):
        clock.advance(INTERVAL)
        r = store.check_transactions(resolve)
        assert (r.checked, r.unknown, r.discarded) == (24, 24, 0), round_no
    clock.advance(INTERVAL)
    last = store.check_transactions(resolve)
    assert (last.checked, last.discarded) == (0, 24)
    clock.advance(INTERVAL)
    assert store.check_transactions(resolve).checked == 0

    unknown = {t for t, k in sent.items() if k == "unknown"}
    assert all(asked.count(t) == 15 for t in unknown)  # transaction_check_max checks each
    assert all(asked.count(t) == 1 for t, k in sent.items() if k.startswith("check-"))
    views = real_messages(store)
    committed = [v.transaction_id for v in views]
    assert sorted(committed) == sorted(t for t, k in sent.items()
                                       if k in ("commit", "check-commit"))
    assert len(set(committed)) == len(committed)
    discarded = store.pull(TRANS_CHECK_MAX_TIME_TOPIC, 0, 0, 1000)
    assert sorted(v.msg_id for v in discarded) == sorted(unknown)
    assert store.transactions.pending_stats()["pending"] == 0


def test_in_process_listener_answers_checks(tx_store, clock):
    listener = Listener(check=COMMIT)
    txp = tx_store.transaction_producer("pay-service", listener)
    r = send(txp, 1, RuntimeError("local transaction failed"))
    assert r.local_state is UNKNOW and not r.ended and "local transaction failed" in r.error
    clock.advance(TIMEOUT + 1)
    result = tx_store.check_transactions()  # no resolver: the producer's listener is asked
    assert (result.checked, result.committed) == (1, 1)
    view = listener.checked[0]
    assert isinstance(view, MessageView)
    assert (view.transaction_id, view.producer_group, view.check_times) == (
        r.transaction_id, "pay-service", 1)
    assert (view.topic, view.queue_id, view.keys, view.body) == ("payments", r.queue_id,
                                                                 ("o-1",), b"pay-1")
    assert view.properties == {}
    assert [v.transaction_id for v in real_messages(tx_store)] == [r.transaction_id]


def test_failing_resolver_counts_as_unknown(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    send(txp, 1, UNKNOW)
    clock.advance(TIMEOUT + 1)

    def boom(view):
        raise ValueError("db down")

    r = tx_store.check_transactions(boom)
    assert (r.checked, r.unknown, r.committed) == (1, 1, 0)
    assert "db down" in r.errors[0]
    clock.advance(INTERVAL)
    r = tx_store.check_transactions(lambda v: "maybe")  # not a state: also unknown
    assert r.unknown == 1 and "maybe" in r.errors[0]
    assert real_messages(tx_store) == []


# --------------------------------------------------------------------------- records written
def test_commit_record_rollback_and_op_messages(tx_store):
    txp = tx_store.transaction_producer("pay-service", Listener())
    c = send(txp, 1, UNKNOW, note="x")
    rb = send(txp, 2, UNKNOW)
    half = tx_store.read_record(c.commitlog_offset)
    assert half.topic == TRANS_HALF_TOPIC and half.queue_id == 0 and half.sys_flag & 0xC == 0
    assert next(iter(half.properties)) == "__transactionId__"
    assert half.properties["__transactionId__"] == half.properties["UNIQ_KEY"] == c.transaction_id
    assert (half.properties["TRAN_MSG"], half.properties["PGROUP"]) == ("true", "pay-service")
    assert (half.properties["REAL_TOPIC"], half.properties["REAL_QID"]) == ("payments",
                                                                          str(c.queue_id))
    before = tx_store.confirmed_offset()
    assert tx_store.end_transaction(c.transaction_id, COMMIT) is True
    [view] = real_messages(tx_store)
    assert (view.topic, view.queue_id, view.msg_id, view.transaction_id) == (
        "payments", c.queue_id, c.transaction_id, c.transaction_id)
    assert view.properties == {"note": "x"} and view.tags == "paid" and view.keys == ("o-1",)
    rec = tx_store.read_record(view.commitlog_offset)
    assert rec.sys_flag & 0xC == TRANSACTION_COMMIT_TYPE
    assert rec.prepared_transaction_offset == c.commitlog_offset
    assert rec.born_timestamp_ms == half.born_timestamp_ms
    # RocketMQ serialises the properties before clearing them: they stay in the bytes
    assert rec.properties["REAL_TOPIC"] == "payments" and rec.properties["TRAN_MSG"] == "true"
    # the commit and its op were written by one append, right after each other
    op_rec = tx_store.read_record(rec.physical_offset + rec.total_size)
    assert op_rec.topic == TRANS_OP_HALF_TOPIC and op_rec.body == f"{c.queue_offset},".encode()
    assert op_rec.properties["TAGS"] == "d" and op_rec.sys_flag == 0
    assert before < tx_store.confirmed_offset()

    n_real = len(real_messages(tx_store))
    assert tx_store.end_transaction(rb.transaction_id, "ROLLBACK") is True
    assert len(real_messages(tx_store)) == n_real  # rollback: the op only
    assert op_offsets(tx_store) == [c.queue_offset, rb.queue_offset]
    # UNKNOW changes nothing
    u = send(txp, 3, UNKNOW)
    off = tx_store.confirmed_offset()
    assert tx_store.end_transaction(u.transaction_id, "UNKNOWN") is False
    assert tx_store.confirmed_offset() == off


@pytest.mark.parametrize("first,second", [
    (COMMIT, COMMIT), (COMMIT, ROLLBACK), (ROLLBACK, COMMIT), ("COMMIT", "commit_message")])
def test_ending_twice_changes_nothing(tx_store, first, second):
    txp = tx_store.transaction_producer("g", Listener())
    r = send(txp, 1, UNKNOW)
    assert tx_store.end_transaction(r.transaction_id, first) is True
    off = tx_store.confirmed_offset()
    assert tx_store.end_transaction(r.transaction_id, second) is False
    assert tx_store.confirmed_offset() == off
    expected = 1 if first in (COMMIT, "COMMIT") else 0
    assert len(real_messages(tx_store)) == expected


def test_batch_end_is_all_or_nothing_and_idempotent(tx_store):
    txp = tx_store.transaction_producer("g", Listener())
    ids = [send(txp, i, UNKNOW).transaction_id for i in range(6)]
    off = tx_store.confirmed_offset()
    with pytest.raises(TransactionStateError, match="MAYBE"):
        tx_store.transactions.end_transactions([(ids[0], "COMMIT"), (ids[1], "MAYBE")])
    with pytest.raises(UnknownMessageError, match="NOPE"):
        tx_store.transactions.end_transactions([(ids[0], "COMMIT"), ("NOPE", "COMMIT")])
    assert tx_store.confirmed_offset() == off
    pairs = [(t, "COMMIT" if i % 2 else "ROLLBACK") for i, t in enumerate(ids)]
    pairs.append((ids[1], "COMMIT"))  # the same id twice in one call
    assert tx_store.transactions.end_transactions(pairs) == [True] * 6 + [False]
    assert tx_store.transactions.end_transactions(pairs) == [False] * 7  # a replayed batch
    assert sorted(v.transaction_id for v in real_messages(tx_store)) == sorted(ids[1::2])
    assert sorted(op_offsets(tx_store)) == list(range(6))


def test_two_store_objects_agree_on_ended(store_path, clock):
    """Ended is read from the op queue, so another process (here: store object) agrees."""
    a = MessageStore.open(store_path, SMALL, clock=clock)
    b = MessageStore.open(store_path, SMALL, clock=clock)
    try:
        r = send(a.transaction_producer("g", Listener()), 1, UNKNOW)
        assert b.end_transaction(r.transaction_id, COMMIT) is True
        assert a.end_transaction(r.transaction_id, COMMIT) is False
        clock.advance(TIMEOUT + 1)
        assert a.check_transactions(lambda v: COMMIT).checked == 0
        assert len(real_messages(a)) == 1
    finally:
        b.close()
        a.close()


# --------------------------------------------------------------------------- bad input
def test_bad_input_is_refused_and_changes_nothing(tx_store):
    txp = tx_store.transaction_producer("g", Listener())
    ok = send(txp, 0, UNKNOW)
    plain = tx_store.producer("p").send(Message("payments", b"plain"))
    off = tx_store.confirmed_offset()
    with pytest.raises(UnknownMessageError, match="not known"):
        tx_store.end_transaction("0" * 32, COMMIT)
    with pytest.raises(UnknownMessageError, match="ordinary messages"):
        tx_store.end_transaction(plain.msg_id, COMMIT)  # a non-transactional message
    for bad in ("MAYBE", "", None, 1, "COMMITTED"):
        with pytest.raises(TransactionStateError, match="allowed: COMMIT, ROLLBACK, UNKNOWN"):
            tx_store.end_transaction(ok.transaction_id, bad)
    with pytest.raises(TransactionStateError, match="transaction id"):
        tx_store.end_transaction(None, COMMIT)
    with pytest.raises(InvalidDelayError, match="cannot be delayed"):
        txp.send_in_transaction(Message("payments", b"x"), delay_ms=1000)
    with pytest.raises(InvalidDelayError, match="cannot be delayed"):
        txp.send_in_transaction(Message("payments", b"x"), delay_level=2)
    with pytest.raises(InvalidMessageError, match="DELAY"):
        txp.send_in_transaction(Message("payments", b"x", properties={"DELAY": "3"}))
    with pytest.raises(InvalidMessageError, match="TRANSACTION_CHECK_TIMES"):
        txp.send_in_transaction(Message("payments", b"x",
                                        properties={"TRANSACTION_CHECK_TIMES": "99"}))
    with pytest.raises(InvalidMessageError, match="CHECK_IMMUNITY_TIME_IN_SECONDS"):
        txp.send_in_transaction(Message("payments", b"x",
                                        properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "soon"}))
    with pytest.raises(InvalidTopicError, match="system topic"):
        txp.send_in_transaction(Message(TRANS_HALF_TOPIC, b"x"))
    assert tx_store.confirmed_offset() == off
    assert not tx_store.transactions.is_ended([ok.transaction_id])[0]


# --------------------------------------------------------------------------- immunity
def test_immunity_helper_matches_rocketmq():
    for value, expected in (("1", 6000), ("5", 6000), ("7", 7000), (None, 6000), ("-1", 6000)):
        assert immunity_ms(value, 6000, raise_to_timeout=True) == expected
    # the check loop uses a custom immunity as given (not raised to the timeout)
    assert immunity_ms("1", 6000, raise_to_timeout=False) == 1000
    assert immunity_ms("x", 6000, raise_to_timeout=False) == 6000


def test_default_immunity_is_the_transaction_timeout(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    send(txp, 1, UNKNOW)
    clock.advance(TIMEOUT)  # age == timeout: still immune, the walk stops there
    r = tx_store.check_transactions(lambda v: COMMIT)
    assert (r.checked, r.half_offset) == (0, 0)
    clock.advance(1)
    assert tx_store.check_transactions(lambda v: COMMIT).committed == 1


def test_custom_immunity_put_back_then_checked(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    long = send(txp, 1, UNKNOW, CHECK_IMMUNITY_TIME_IN_SECONDS="60")
    short = send(txp, 2, UNKNOW, CHECK_IMMUNITY_TIME_IN_SECONDS="1")
    clock.advance(1001)  # past "1" s (used as given, below the 6 s timeout)
    asked = []
    r = tx_store.check_transactions(lambda v: asked.append(v.transaction_id) or UNKNOW)
    assert asked == [short.transaction_id] and r.immune == 1
    halves = tx_store.pull(TRANS_HALF_TOPIC, 0, 0, 100)
    copy = [v for v in halves if v.msg_id == long.transaction_id][-1]
    assert copy.system_properties["TRAN_PREPARED_QUEUE_OFFSET"] == str(long.queue_offset)
    assert "TRANSACTION_CHECK_TIMES" not in copy.system_properties  # immunity is no check
    clock.advance(INTERVAL)  # 31 s: still inside 60 s
    asked.clear()
    r = tx_store.check_transactions(lambda v: asked.append(v.transaction_id) or UNKNOW)
    assert long.transaction_id not in asked and r.immune == 1
    later = [v for v in tx_store.pull(TRANS_HALF_TOPIC, 0, 0, 100) if v.msg_id ==
             long.transaction_id][-1]
    assert later.system_properties["TRAN_PREPARED_QUEUE_OFFSET"] == str(long.queue_offset)
    clock.advance(INTERVAL)  # 61 s
    asked.clear()
    tx_store.check_transactions(lambda v: asked.append(v.transaction_id) or COMMIT)
    assert sorted(asked) == sorted([long.transaction_id, short.transaction_id])
    assert len(real_messages(tx_store)) == 2


def test_late_direct_commit_refused_for_custom_immunity(tx_store, clock):
    """RocketMQ's 604: a non-check end after the (raised) custom immunity is refused."""
    txp = tx_store.transaction_producer("g", Listener())
    r = send(txp, 1, UNKNOW, CHECK_IMMUNITY_TIME_IN_SECONDS="2")
    clock.advance(TIMEOUT + 1)  # "2" is raised to the 6 s timeout here
    with pytest.raises(TransactionStateError, match="604"):
        tx_store.end_transaction(r.transaction_id, COMMIT)
    assert real_messages(tx_store) == []
    assert tx_store.transactions.end_transaction(r.transaction_id, COMMIT, from_check=True)
    plain = send(txp, 2, UNKNOW)  # no custom immunity: a late direct commit is fine
    clock.advance(10 * TIMEOUT)
    assert tx_store.end_transaction(plain.transaction_id, COMMIT)


def test_checks_are_paced_by_the_check_interval(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    send(txp, 1, UNKNOW)
    clock.advance(TIMEOUT + 1)
    assert tx_store.check_transactions(lambda v: UNKNOW).checked == 1
    clock.advance(INTERVAL - 1)  # the copy is younger than one interval: not asked again
    assert tx_store.check_transactions(lambda v: UNKNOW).checked == 0
    clock.advance(1)
    assert tx_store.check_transactions(lambda v: UNKNOW).checked == 1


# --------------------------------------------------------------------------- discard and skip
def test_discard_is_a_single_copy_with_properties(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    r = send(txp, 1, UNKNOW, note="n")
    clock.advance(TIMEOUT + 1)
    for _ in range(15):
        assert tx_store.check_transactions(lambda v: UNKNOW).checked == 1
        clock.advance(INTERVAL)
    res = tx_store.check_transactions(lambda v: UNKNOW)
    assert (res.checked, res.discarded) == (0, 1)
    [d] = tx_store.pull(TRANS_CHECK_MAX_TIME_TOPIC, 0, 0, 10)
    assert d.msg_id == r.transaction_id and d.properties == {"note": "n"}
    assert d.system_properties["TRANSACTION_CHECK_TIMES"] == "15"
    assert d.system_properties["REAL_TOPIC"] == "payments"
    assert d.born_timestamp_ms == tx_store.read_record(r.commitlog_offset).born_timestamp_ms
    for _ in range(3):
        clock.advance(INTERVAL)
        assert tx_store.check_transactions(lambda v: COMMIT).discarded == 0
    assert system_count(tx_store, TRANS_CHECK_MAX_TIME_TOPIC) == 1
    # discarded is not ended: an operator may still commit it (RocketMQ does the same)
    assert tx_store.end_transaction(r.transaction_id, COMMIT) is True
    assert len(real_messages(tx_store)) == 1


def test_half_older_than_retention_is_skipped_to_discard(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    send(txp, 1, UNKNOW)
    clock.advance(tx_store.config.file_reserved_time_ms + 1)
    r = tx_store.check_transactions(lambda v: COMMIT)
    assert (r.checked, r.discarded) == (0, 1)
    assert real_messages(tx_store) == []


# --------------------------------------------------------------------------- op messages
def test_op_body_parsing_and_foreign_ops(tx_store, clock):
    assert parse_op_body(b"5") == [5] and parse_op_body(b"5,6,") == [5, 6]
    assert parse_op_body(b"") == [] and parse_op_body(b"x,7,,") == [7]
    txp = tx_store.transaction_producer("g", Listener())
    rs = [send(txp, i, UNKNOW) for i in range(3)]
    now = clock()
    # a 4.x-style op (no comma) ends half 0; an op with another tag is ignored
    tx_store.append([RecordSpec(topic=TRANS_OP_HALF_TOPIC, body=b"0", properties={"TAGS": "d"},
                                queue_id=0, born_timestamp_ms=now),
                     RecordSpec(topic=TRANS_OP_HALF_TOPIC, body=b"1,", properties={"TAGS": "x"},
                                queue_id=0, born_timestamp_ms=now)])
    assert tx_store.transactions.is_ended([r.transaction_id for r in rs]) == [True, False, False]
    specs = op_specs(range(10_000, 12_000), now)  # long lists: several bodies of <= 4096
    assert [len(s.body) for s in specs] == [4092, 4092, 3816]
    assert [o for s in specs for o in parse_op_body(s.body)] == list(range(10_000, 12_000))


def test_progress_offsets_advance_and_persist(store_path, clock):
    s = MessageStore.open(store_path, SMALL, clock=clock)
    txp = s.transaction_producer("g", Listener())
    rs = [send(txp, i, UNKNOW) for i in range(10)]
    for r in rs[:4]:  # ends of the first halves: these ops are behind the half offset later
        s.end_transaction(r.transaction_id, ROLLBACK)
    clock.advance(TIMEOUT + 1)
    first = s.check_transactions(lambda v: COMMIT)
    assert (first.checked, first.committed) == (6, 6)
    assert first.half_offset == 10 and first.op_offset == 4  # the 5th op names copies at >= 10
    path = os.path.join(store_path, "config", "transactionOffset.json")
    with open(path) as fh:
        saved = json.load(fh)["offsetTable"]
    assert saved == {"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS": {"0": 10},
                     "RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS": {"0": 4}}
    s.close()
    s = MessageStore.open(store_path, SMALL, clock=clock)
    walked = []
    original = s.transactions.index.window

    def spy(start, end):
        walked.append((start, end))
        return original(start, end)

    s.transactions.index.window = spy
    clock.advance(INTERVAL)
    second = s.check_transactions(lambda v: COMMIT)
    assert walked == [(10, 16)]  # resumed from the saved offset, not from 0
    assert (second.checked, second.half_offset, second.op_offset) == (0, 16, 5)
    assert len(real_messages(s)) == 6
    s.close()


def test_index_snapshot_is_used_and_checked(store_path, clock):
    s = MessageStore.open(store_path, SMALL, clock=clock)
    txp = s.transaction_producer("g", Listener())
    ids = [send(txp, i, COMMIT if i % 3 == 0 else UNKNOW).transaction_id for i in range(4000)]
    s.close()
    snap = os.path.join(store_path, "config", "transactionIndex.npz")
    assert os.path.exists(snap)
    s = MessageStore.open(store_path, SMALL, clock=clock)
    index = s.transactions.index
    assert index.half_scanned == 4000  # loaded, not rebuilt
    assert s.transactions.is_ended(ids[:3]) == [True, False, False]
    assert s.end_transaction(ids[1], COMMIT) and not s.end_transaction(ids[0], COMMIT)
    s.close()
    # a snapshot from another store is not trusted
    other = MessageStore.open(store_path + "-other", SMALL, clock=clock)
    send(other.transaction_producer("g", Listener()), 1, UNKNOW)
    other.close()
    os.replace(snap, os.path.join(store_path + "-other", "config", "transactionIndex.npz"))
    other = MessageStore.open(store_path + "-other", SMALL, clock=clock)
    assert other.transactions.index.half_scanned == 0  # rebuilt lazily instead
    assert other.transactions.pending_stats()["pending"] == 1
    other.close()


def test_vectorised_index_matches_records(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    rs = [send(txp, i, [COMMIT, ROLLBACK, UNKNOW][i % 3]) for i in range(300)]
    index = tx_store.transactions.index
    index.refresh()
    assert index.rows == 300
    for r in rs[::7]:
        row = index.row_of(r.transaction_id)
        assert index.transaction_id(row) == r.transaction_id
        assert index.latest_clog(row) == r.commitlog_offset
        assert bool(index.row_ended.data[row]) == (r.local_state is not UNKNOW)
    qoffs, _ = index.window(0, 300)
    assert np.array_equal(qoffs, np.arange(2, 300, 3))


def test_settings_given_at_open_are_used_by_default_openers(store_path, clock):
    cfg = StoreConfig(commitlog_file_size_bytes=SMALL.commitlog_file_size_bytes,
                      consume_queue_file_entries=SMALL.consume_queue_file_entries,
                      transaction_timeout_ms=500, transaction_check_interval_ms=1000)
    a = MessageStore.open(store_path, cfg, clock=clock)
    send(a.transaction_producer("g", Listener()), 1, UNKNOW)
    b = MessageStore.open(store_path, clock=clock)  # e.g. a Spark query: default settings
    try:
        assert b.transactions.settings["transaction_timeout_ms"] == 500
        assert b.transactions.settings["transaction_check_interval_ms"] == 1000
        clock.advance(501)
        assert b.check_transactions(lambda v: UNKNOW).checked == 1
        clock.advance(1000)
        assert b.check_transactions(lambda v: COMMIT).committed == 1
    finally:
        b.close()
        a.close()


def test_max_checks_limits_a_round(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    for i in range(10):
        send(txp, i, UNKNOW)
    clock.advance(TIMEOUT + 1)
    plan = tx_store.transactions.prepare_checks(max_checks=4)
    assert len(plan.checks) == 4 and plan.half_offset == 4
    assert [v.check_times for v in plan.checks] == [1] * 4
    rest = tx_store.transactions.prepare_checks()
    assert len(rest.checks) == 6
    assert len({v.transaction_id for v in plan.checks + rest.checks}) == 10


def test_pending_stats(tx_store, clock):
    txp = tx_store.transaction_producer("g", Listener())
    born = clock()
    send(txp, 1, UNKNOW)
    clock.advance(5)
    send(txp, 2, COMMIT)
    stats = tx_store.transactions.pending_stats()
    assert (stats["pending"], stats["oldest_born_ms"], stats["ended"]) == (1, born, 1)
