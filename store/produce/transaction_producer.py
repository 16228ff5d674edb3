"""TransactionProducer: RocketMQ's ``TransactionMQProducer.sendMessageInTransaction``.

1. validate the message like any send (:class:`~store.produce.producer.Producer`), pick the real
   queue, and store a half message (:mod:`store.transaction.half`);
2. run ``listener.execute_local_transaction(message, arg)``;
3. end the transaction with its answer: COMMIT_MESSAGE commits, ROLLBACK_MESSAGE rolls back;
   UNKNOW, ``None``, an exception or anything else leaves it to the check loop (RocketMQ's
   client sends UNKNOW, which the broker ignores).

A crash after step 1 leaves an open half message: the check loop asks about it later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..files.crash_points import crash_point
from ..base.errors import InvalidDelayError, TransactionStateError
from ..formats.message import (TRANS_HALF_TOPIC, LocalTransactionState, Message, SendResult,
                       validate_msg_id)
from .producer import Producer, ProducerStore
from ..transaction.check_loop import parse_state
from ..transaction.half import check_transactional_properties, half_spec
from ..transaction.transaction_service import TransactionService


class TransactionProducerStore(ProducerStore, Protocol):
    """What a transaction producer uses of its store: a producer's, plus transactions."""

    transactions: TransactionService


@dataclass(frozen=True, slots=True)
class TransactionSendResult(SendResult):
    """What :meth:`TransactionProducer.send_in_transaction` did.

    ``topic`` / ``queue_id`` are the real ones the message goes to when committed;
    ``queue_offset`` / ``commitlog_offset`` are where the half message was stored (in
    ``half_topic``); ``msg_id`` equals ``transaction_id``.  ``local_state`` is the local
    transaction's answer (UNKNOW when it raised: ``error`` says what), ``ended`` whether that
    answer ended the transaction here.
    """

    local_state: LocalTransactionState = LocalTransactionState.UNKNOW
    ended: bool = False
    error: str | None = None
    half_topic: str = TRANS_HALF_TOPIC


class LeaveOpen:
    """The listener of half messages sent for a caller elsewhere (a served store's client, a
    RocketMQ client): the local transaction runs there, and the caller ends the transaction
    itself; asked by a check, it does not know either."""

    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, view):
        return LocalTransactionState.UNKNOW


class TransactionProducer(Producer):
    """Sends transactional messages of one producer group (see the module docstring).

    Parameters
    ----------
    store : MessageStore
        Where to send.
    group : str
        Producer group; recorded in every half message (PGROUP) so the check loop knows whom
        to ask.
    listener : TransactionListener
        ``execute_local_transaction(message, arg)`` and ``check_local_transaction(view)``.
        The store's in-process check loop (``store.check_transactions()`` with no resolver)
        asks this listener about the group's open transactions.
    """

    def __init__(self, store: TransactionProducerStore, group: str, listener) -> None:
        super().__init__(store, group)
        if not callable(getattr(listener, "execute_local_transaction", None)):
            raise TransactionStateError(
                f"listener {listener!r} has no execute_local_transaction(message, arg); "
                "allowed: an object with execute_local_transaction and check_local_transaction")
        self.listener = listener
        store.transactions.register_listener(self.group, listener)

    def send_in_transaction(self, message: Message, arg: object = None, *,
                            delay_level: int | None = None, delay_ms: int | None = None,
                            deliver_at_ms: int | None = None,
                            msg_id: str | None = None) -> TransactionSendResult:
        """Store ``message`` as a half message, run the local transaction, end it.

        ``msg_id``: the message id when the sender made it already (see
        :meth:`Producer.send <store.produce.producer.Producer.send>`); it is also the
        transaction id.

        Raises
        ------
        InvalidDelayError
            Any delay argument: transactional messages cannot be delayed (RocketMQ's client
            clears DELAY; a DELAY property is refused as reserved anyway).
        InvalidMessageError
            The message breaks a sending rule, or sets ``__transactionId__`` /
            ``TRANSACTION_CHECK_TIMES`` or an invalid CHECK_IMMUNITY_TIME_IN_SECONDS.
        """
        given = [n for n, v in (("delay_level", delay_level), ("delay_ms", delay_ms),
                                ("deliver_at_ms", deliver_at_ms)) if v is not None]
        if given:
            raise InvalidDelayError(
                f"send_in_transaction got {', '.join(given)}; allowed: no delay, "
                "transactional messages cannot be delayed (send the delayed message from the "
                "local transaction or after the commit instead)")
        store = self.store
        now = store.now_ms()
        msg_id = store.id_generator.next_id(now) if msg_id is None else validate_msg_id(msg_id)
        spec = self._spec(message, msg_id, now)  # validates (reserved names, sizes, topic)
        check_transactional_properties(message.properties)
        queue_count = store.ensure_topic(message.topic)
        real_qid = store.next_queue(message.topic, queue_count)
        crash_point("transaction.half", "before")
        stored = store.append([half_spec(spec, self.group, real_qid)])[0]
        crash_point("transaction.half", "after")

        error = None
        try:
            answer = self.listener.execute_local_transaction(message, arg)
            state = LocalTransactionState.UNKNOW if answer is None else parse_state(answer)
        except Exception as exc:  # noqa: BLE001 - user code; RocketMQ: the outcome is unknown
            error = f"{type(exc).__name__}: {exc}"
            state = LocalTransactionState.UNKNOW
        ended = False
        if state is not LocalTransactionState.UNKNOW:
            ended = store.transactions.end_transaction(msg_id, state)
        return TransactionSendResult(
            msg_id=msg_id, topic=message.topic, queue_id=real_qid,
            queue_offset=stored.queue_offset, commitlog_offset=stored.commitlog_offset,
            transaction_id=msg_id, local_state=state, ended=ended, error=error,
            store_name=self.store_name)
