"""Check-back storms are bounded: a producer that never answers is asked about each open half
at most once per ``transaction_check_interval_ms`` and at most ``transaction_check_max``
times, and what the store holds after an hour of it is the halves, their put-backs, the ops
and the commits, no more.  A commit sent twice, or raced by a check-back, leaves one message."""

from __future__ import annotations

from collections import Counter

import pytest

from store import LocalTransactionState, Message, MessageStore
from store.formats.message import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from tests.conftest import SMALL

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
HOUR = 3_600_000


class Listener:
    """Commits at once, except the transactions whose arg is UNKNOW: those it never answers."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.asked: dict[str, list[int]] = {}

    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, view):
        self.asked.setdefault(view.transaction_id, []).append(self.clock())
        return UNKNOW


def _records(store) -> Counter:
    """Records per topic (system topics included): each record of the CommitLog is in one
    consume queue."""
    return Counter({t: sum(store.max_offset(t, q) for q in store.queue_ids(t))
                    for t in store.topics(include_system=True)})


def _all(store, topic) -> list:
    return [v for q in store.queue_ids(topic) for v in store.pull(topic, q, 0, 100_000)] \
        if topic in store.topics(include_system=True) else []


@pytest.mark.slow
def test_an_hour_with_five_percent_never_answered_stays_within_its_bound(store_path, clock):
    """Four transactions every 10 s for an hour, one in twenty never answered (its check
    says UNKNOW), the check loop run every 10 s (three times per interval)."""
    config = SMALL
    interval, check_max = config.transaction_check_interval_ms, config.transaction_check_max
    with MessageStore.open(store_path, config, clock=clock) as store:
        listener = Listener(clock)
        txp = store.transaction_producer("pay", listener)
        start = clock()
        sent: dict[str, bool] = {}  # transaction id -> answered
        i = 0
        while clock() < start + HOUR:
            for _ in range(4):
                arg = UNKNOW if i % 20 == 0 else COMMIT
                r = txp.send_in_transaction(Message("payments", b"p%d" % i), arg=arg)
                sent[r.transaction_id] = arg is COMMIT
                i += 1
            store.check_transactions()
            clock.advance(10_000)

        silent = [t for t, answered in sent.items() if not answered]
        answered = len(sent) - len(silent)
        assert len(silent) == len(sent) // 20 and answered > 0
        # asked only about the silent ones, at most once per interval, at most check_max times
        assert set(listener.asked) <= set(silent)
        for tx, times in listener.asked.items():
            assert len(times) <= check_max, tx
            assert all(b - a >= interval for a, b in zip(times, times[1:])), (tx, times)
        # each half: its first copy and at most check_max put-backs
        copies = Counter(v.msg_id for v in _all(store, TRANS_HALF_TOPIC))  # = transaction id
        assert set(copies) == set(sent)
        assert max(copies[t] for t in silent) <= 1 + check_max
        assert all(copies[t] == 1 for t, a in sent.items() if a)
        # the store's growth: halves + put-backs + discards of the silent ones, and for each
        # answered one its message and its op; nothing else
        records = _records(store)
        bound = len(sent) + answered * 2 + len(silent) * (check_max + 1)
        assert sum(records.values()) <= bound
        assert records["payments"] == answered
        assert records[TRANS_OP_HALF_TOPIC] == answered
        assert records[TRANS_HALF_TOPIC] - len(sent) <= len(silent) * check_max
        assert records.get(TRANS_CHECK_MAX_TIME_TOPIC, 0) <= len(silent)
        # a silent one is discarded (once) only after its check_max checks: the early ones
        # were; the last asked its check_max-th time waits an interval more
        full = sum(len(t) == check_max for t in listener.asked.values())
        assert 0 < records[TRANS_CHECK_MAX_TIME_TOPIC] <= full
        discarded = Counter(v.msg_id for v in _all(store, TRANS_CHECK_MAX_TIME_TOPIC))
        assert set(discarded) <= set(silent) and max(discarded.values()) == 1


@pytest.fixture
def open_tx(store_path, clock):
    store = MessageStore.open(store_path, SMALL, clock=clock)
    txp = store.transaction_producer("pay", Listener(clock))
    r = txp.send_in_transaction(Message("payments", b"x"), arg=UNKNOW)
    yield store, r.transaction_id
    store.close()


def test_a_commit_sent_twice_leaves_one_message(open_tx):
    store, tx = open_tx
    assert store.end_transaction(tx, COMMIT) is True
    assert store.end_transaction(tx, COMMIT) is False
    assert store.end_transactions([(tx, COMMIT), (tx, COMMIT)]) == [False, False]
    assert [v.transaction_id for v in _all(store, "payments")] == [tx]


@pytest.mark.parametrize("first", ["producer", "check"])
def test_a_commit_raced_by_a_check_back_leaves_one_message(open_tx, clock, first):
    """The check round has put the half back and asked; the producer's own commit and the
    check's answer arrive in either order: the first ends it, the second changes nothing."""
    store, tx = open_tx
    clock.advance(SMALL.transaction_timeout_ms + 1)
    plan = store.prepare_transaction_checks()
    assert [v.transaction_id for v in plan.checks] == [tx]
    if first == "producer":
        assert store.end_transaction(tx, COMMIT) is True
        result = store.transactions.answer(plan.checks, lambda v: COMMIT)
        assert (result.committed, result.already_ended) == (0, 1)
    else:
        assert store.transactions.answer(plan.checks, lambda v: COMMIT).committed == 1
        assert store.end_transaction(tx, COMMIT) is False
        assert store.end_transaction(tx, ROLLBACK) is False
    assert [v.transaction_id for v in _all(store, "payments")] == [tx]
    clock.advance(SMALL.transaction_check_interval_ms + 1)
    assert store.check_transactions(lambda v: COMMIT).checked == 0  # not asked again
    assert [v.transaction_id for v in _all(store, "payments")] == [tx]
    assert _records(store)[TRANS_OP_HALF_TOPIC] == 1
