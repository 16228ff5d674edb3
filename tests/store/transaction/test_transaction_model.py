"""Hypothesis state machine: the store's transactions against a small in-memory model.

The model knows each transaction's fate (open, committed, rolled back) and how often it was
asked about.  Whatever the order of sends, ends, check rounds, clock moves and reopens:
the real topic holds exactly the committed transactions, once each; the check loop never asks
about an ended transaction; ``check_times`` counts the questions; a transaction is discarded
only after ``transaction_check_max`` (here 3) questions, and never asked again after that.
"""

from __future__ import annotations

import shutil
import tempfile

from conftest import SMALL, FakeClock
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from store import LocalTransactionState as S
from store import Message, MessageStore
from store.formats.message import TRANS_CHECK_MAX_TIME_TOPIC

STATES = [S.COMMIT_MESSAGE, S.ROLLBACK_MESSAGE, S.UNKNOW]
CHECK_MAX = 3
CONFIG = SMALL.replace(transaction_check_max=CHECK_MAX)


class Answer:
    def execute_local_transaction(self, message, arg):
        if arg == "raise":
            raise RuntimeError("local transaction failed")
        return arg

    def check_local_transaction(self, view):
        return S.UNKNOW


class TransactionMachine(RuleBasedStateMachine):
    txs = Bundle("txs")

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="rmq-tx-model-")
        self.clock = FakeClock()
        self.store = MessageStore.open(self.dir, CONFIG, clock=self.clock)
        self.fate: dict[str, str] = {}       # open / commit / rollback
        self.asked: dict[str, int] = {}
        self.discarded: set[str] = set()
        self.n = 0

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(target=txs, answer=st.sampled_from(STATES + ["raise"]))
    def send(self, answer):
        txp = self.store.transaction_producer("g", Answer())
        self.n += 1
        r = txp.send_in_transaction(Message("payments", b"x", keys=f"o-{self.n}"), arg=answer)
        fate = {S.COMMIT_MESSAGE: "commit", S.ROLLBACK_MESSAGE: "rollback"}.get(answer, "open")
        self.fate[r.transaction_id] = fate
        self.asked[r.transaction_id] = 0
        assert r.ended == (fate != "open")
        return r.transaction_id

    @rule(tx=txs, state=st.sampled_from(STATES))
    def end(self, tx, state):
        changed = self.store.transactions.end_transaction(tx, state, from_check=True)
        if self.fate[tx] == "open" and state is not S.UNKNOW:
            assert changed
            self.fate[tx] = "commit" if state is S.COMMIT_MESSAGE else "rollback"
        else:
            assert not changed

    @rule(ms=st.sampled_from([500, 6_001, 30_000, 61_000]))
    def advance(self, ms):
        self.clock.advance(ms)

    @rule(answers=st.lists(st.sampled_from(STATES), min_size=1, max_size=5),
          wait=st.sampled_from([0, 6_001, 31_000, 31_000]))
    def check_round(self, answers, wait):
        self.clock.advance(wait)
        asked_now = []

        def resolve(view):
            tx = view.transaction_id
            assert self.fate[tx] == "open", f"asked about ended {tx}"
            assert tx not in self.discarded
            self.asked[tx] += 1
            assert view.check_times == self.asked[tx]
            answer = answers[len(asked_now) % len(answers)]
            asked_now.append((tx, answer))
            return answer

        result = self.store.check_transactions(resolve)
        assert result.checked == len(asked_now)
        for tx, answer in asked_now:
            if answer is not S.UNKNOW:
                self.fate[tx] = "commit" if answer is S.COMMIT_MESSAGE else "rollback"
        if TRANS_CHECK_MAX_TIME_TOPIC in self.store.topics(include_system=True):
            now_discarded = {v.msg_id for v in self.store.pull(TRANS_CHECK_MAX_TIME_TOPIC, 0, 0,
                                                                 10_000)}
            for tx in now_discarded - self.discarded:
                assert self.fate[tx] == "open" and self.asked[tx] == CHECK_MAX
            assert len(now_discarded) == result.discarded + len(self.discarded)
            self.discarded = now_discarded

    @rule()
    def unanswered_rounds(self):
        """Nobody answers for a while: open transactions run out of checks."""
        for _ in range(CHECK_MAX + 1):
            self.check_round([S.UNKNOW], 31_000)

    @rule()
    def reopen(self):
        self.store.close()
        self.store = MessageStore.open(self.dir, CONFIG, clock=self.clock)

    @invariant()
    def real_topic_holds_exactly_the_commits(self):
        store = self.store
        got = []
        if "payments" in store.topics():
            got = [v.transaction_id for q in store.queue_ids("payments")
                   for v in store.pull("payments", q, 0, 10_000)]
        assert len(got) == len(set(got))
        assert set(got) == {t for t, f in self.fate.items() if f == "commit"}


TransactionMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_transactions_against_model = TransactionMachine.TestCase
