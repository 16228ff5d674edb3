"""Stores of mixed messages for the read tests (plain, tagged, delayed and transactional, in
two topics), written the same way by the key-read and pushdown tests."""

from __future__ import annotations

from store import LocalTransactionState, Message


class CommitAll:
    """A transaction listener that commits every half message (and answers checks so)."""

    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, view):
        return LocalTransactionState.COMMIT_MESSAGE


def send_mixed(store, clock, group: str, session: int, n: int, topics, tags,
               keys_of=None, settle_ms: int = 20_000) -> None:
    """``n`` messages of body ``body-<session>-<i>`` to ``topics[i % 2]`` with tag
    ``tags[i % len(tags)]`` (and keys ``keys_of(i)``): every 7th (from 3) delayed
    2 s + 100 ms * i, every 11th (from 5) in a committed transaction, the rest plain, the
    fake ``clock`` 250 ms on after each; then ``settle_ms`` on and the due ones delivered."""
    producer = store.producer(group)
    transactions = store.transaction_producer(f"{group}-tx", CommitAll())
    for i in range(n):
        m = Message(topics[i % 2], b"body-%d-%d" % (session, i), tags=tags[i % len(tags)],
                    keys=None if keys_of is None else keys_of(i))
        if i % 7 == 3:
            producer.send(m, delay_ms=2_000 + 100 * i)
        elif i % 11 == 5:
            transactions.send_in_transaction(m)
        else:
            producer.send(m)
        clock.advance(250)
    clock.advance(settle_ms)
    assert store.deliver_due() > 0
