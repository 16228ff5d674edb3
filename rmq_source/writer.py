"""``.write/.writeStream.format("rmq").option("action", "end_transaction")``: end transactions.

Rows need two columns (others are ignored): ``transaction_id`` (string) and ``state``
(``COMMIT``, ``ROLLBACK`` or ``UNKNOWN``; RocketMQ's ``COMMIT_MESSAGE``,
``ROLLBACK_MESSAGE`` and ``UNKNOW`` are accepted too, in any case).  Each Spark task opens the
store for writing and ends its rows in one call (:meth:`TransactionService.end_transactions`
with ``from_check=True``: these are the answers of the check loop): commits go to their real
topic with an op message, rollbacks write the op message only, UNKNOWN changes nothing and
leaves the transaction to a later check round.

Ending is idempotent: a transaction that already ended is left as it is, so a replayed
micro-batch (after a failure or a restart) never commits anything twice.  A task checks all of
its rows before writing anything: a state that is not one of the three, a missing column or an
unknown transaction id fails the task (and the query) with a message naming the row's
transaction id, the value and what is allowed, and that task's rows change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from pyspark.sql.datasource import (DataSourceStreamWriter, DataSourceWriter,
                                    WriterCommitMessage)

from store import MessageStore, StoreError, TransactionStateError

from .errors import RmqSourceError
from .options import RmqOptions

#: The state strings a row may carry, by upper-cased name.
STATES = {"COMMIT": "COMMIT", "COMMIT_MESSAGE": "COMMIT", "ROLLBACK": "ROLLBACK",
          "ROLLBACK_MESSAGE": "ROLLBACK", "UNKNOWN": "UNKNOWN", "UNKNOW": "UNKNOWN"}


class EndTransactionError(RmqSourceError):
    """A row given to ``action=end_transaction`` cannot end a transaction."""


@dataclass(frozen=True, slots=True)
class EndTransactionCommitMessage(WriterCommitMessage):
    """What one task did: rows seen, transactions ended now, rows that changed nothing."""

    rows: int
    ended: int
    unchanged: int


def _field(row, name: str):
    try:
        return row[name]
    except (KeyError, ValueError, IndexError):
        fields = list(getattr(row, "__fields__", []) or [])
        raise EndTransactionError(
            f"action=end_transaction needs a column {name!r}; the rows have {fields}; allowed: "
            "rows with columns transaction_id (string) and state (COMMIT, ROLLBACK or "
            "UNKNOWN)") from None


def parse_rows(rows: Iterable) -> list[tuple[str, str]]:
    """``(transaction_id, state)`` pairs of the rows, every row checked (nothing written)."""
    pairs = []
    for row in rows:
        tx = _field(row, "transaction_id")
        state = _field(row, "state")
        if not isinstance(tx, str) or not tx:
            raise EndTransactionError(
                f"a row has transaction_id={tx!r} (state={state!r}); allowed: the non-empty "
                "transaction_id of a row of view=transaction_checks (or of send_in_transaction)")
        name = STATES.get(state.strip().upper()) if isinstance(state, str) else None
        if name is None:
            raise EndTransactionError(
                f"the row of transaction {tx} has state={state!r}; allowed: COMMIT, ROLLBACK "
                "or UNKNOWN")
        pairs.append((tx, name))
    return pairs


def end_rows(path: str, rows: Iterator) -> EndTransactionCommitMessage:
    """End the transactions of ``rows`` in the store at ``path`` (one Spark task)."""
    pairs = parse_rows(rows)
    if not pairs:
        return EndTransactionCommitMessage(0, 0, 0)
    try:
        store = MessageStore.open(path)
    except (OSError, StoreError) as exc:
        raise EndTransactionError(
            f"action=end_transaction could not open the store {path!r} for writing "
            f"({type(exc).__name__}: {exc}); allowed: a writable rmq store directory") from None
    try:
        try:
            done = store.transactions.end_transactions(pairs, from_check=True)
        except (TransactionStateError, StoreError) as exc:
            raise EndTransactionError(
                f"action=end_transaction: {exc} (no row of this task was applied)") from None
    finally:
        store.close()
    ended = sum(done)
    return EndTransactionCommitMessage(len(pairs), ended, len(pairs) - ended)


class EndTransactionWriter(DataSourceWriter):
    """Batch writer: ``df.write.format("rmq").option("action", "end_transaction")``."""

    def __init__(self, options: RmqOptions) -> None:
        self.options = options
        self.path = options.path

    def write(self, iterator: Iterator) -> EndTransactionCommitMessage:
        return end_rows(self.path, iterator)

    def commit(self, messages) -> None:
        """Nothing to do: each task's rows are durable when its ``write`` returns."""

    def abort(self, messages) -> None:
        """Nothing to undo: tasks that finished ended their transactions for good (and
        idempotently); a failed task changed nothing."""


class EndTransactionStreamWriter(DataSourceStreamWriter):
    """Streaming writer: ``.writeStream.format("rmq").option("action", "end_transaction")``."""

    def __init__(self, options: RmqOptions) -> None:
        self.options = options
        self.path = options.path

    def write(self, iterator: Iterator) -> EndTransactionCommitMessage:
        return end_rows(self.path, iterator)

    def commit(self, messages, batchId: int) -> None:
        """Nothing to do (see :class:`EndTransactionWriter`); a replayed batch is harmless."""

    def abort(self, messages, batchId: int) -> None:
        """Nothing to undo (see :class:`EndTransactionWriter`)."""
