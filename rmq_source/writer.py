"""``.write/.writeStream.format("rmq").option("action", "end_transaction")``: end transactions.

Rows need two columns (others are ignored): ``transaction_id`` (string) and ``state``
(``COMMIT``, ``ROLLBACK`` or ``UNKNOWN``; RocketMQ's ``COMMIT_MESSAGE``,
``ROLLBACK_MESSAGE`` and ``UNKNOW`` are accepted too, in any case).

Two phases, so a batch is all or nothing: each Spark task only checks its rows and returns
them in its commit message; the driver's ``commit`` then ends every transaction of the batch
in one call (:meth:`TransactionService.end_transactions` with ``from_check=True``: these are
the answers of the check loop), which writes all commits and op messages in one append.
Commits go to their real topic with an op message, rollbacks write the op message only,
UNKNOWN changes nothing and leaves the transaction to a later check round.  A state that is
not one of the three, a missing column or an unknown transaction id fails the batch (and the
query) with a message naming the transaction id, the value and what is allowed, and nothing
of that batch is applied.

Ending is idempotent: a transaction that already ended is left as it is, so a replayed
micro-batch (after a failure or a restart) never commits anything twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from store import StoreError, TransactionStateError

from .errors import RmqSourceError
from .options import RmqOptions
from .stores import open_writable

#: The state strings a row may carry, by upper-cased name.
STATES = {"COMMIT": "COMMIT", "COMMIT_MESSAGE": "COMMIT", "ROLLBACK": "ROLLBACK",
          "ROLLBACK_MESSAGE": "ROLLBACK", "UNKNOWN": "UNKNOWN", "UNKNOW": "UNKNOWN"}


class EndTransactionError(RmqSourceError):
    """A row given to ``action=end_transaction`` cannot end a transaction."""


@dataclass(frozen=True, slots=True)
class EndTransactionCommitMessage(WriterCommitMessage):
    """One task's checked rows: ``(transaction_id, state)`` pairs, applied by ``commit``."""

    pairs: tuple[tuple[str, str], ...]


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


def end_pairs(path: str, messages) -> tuple[int, int]:
    """Apply the pairs of a batch's commit messages; return (rows, transactions ended)."""
    pairs = [p for m in messages if m is not None for p in m.pairs]
    if not pairs:
        return 0, 0
    store = open_writable(path, needs="action=end_transaction", error=EndTransactionError)
    try:
        try:
            done = store.end_transactions(pairs, from_check=True)
        except (TransactionStateError, StoreError) as exc:
            raise EndTransactionError(
                f"action=end_transaction: {exc} (nothing of this batch was applied)") from None
    finally:
        store.close()
    return len(pairs), sum(done)


class EndTransactionWriter(DataSourceWriter):
    """Batch writer: ``df.write.format("rmq").option("action", "end_transaction")``."""

    def __init__(self, options: RmqOptions) -> None:
        self.options = options
        self.path = options.path

    def write(self, iterator: Iterator) -> EndTransactionCommitMessage:
        return EndTransactionCommitMessage(tuple(parse_rows(iterator)))

    def commit(self, messages) -> None:
        """End the transactions of every task's rows (on the driver, one append)."""
        end_pairs(self.path, messages)

    def abort(self, messages) -> None:
        """Nothing to undo: no row is applied before ``commit``."""


class EndTransactionStreamWriter(DataSourceStreamWriter):
    """Streaming writer: ``.writeStream.format("rmq").option("action", "end_transaction")``."""

    def __init__(self, options: RmqOptions) -> None:
        self.options = options
        self.path = options.path

    def write(self, iterator: Iterator) -> EndTransactionCommitMessage:
        return EndTransactionCommitMessage(tuple(parse_rows(iterator)))

    def commit(self, messages, batchId: int) -> None:
        """End the batch's transactions (idempotent: a replayed batch changes nothing)."""
        end_pairs(self.path, messages)

    def abort(self, messages, batchId: int) -> None:
        """Nothing to undo: no row is applied before ``commit``."""
