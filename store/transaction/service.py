"""Transaction service (interim: filled in by the transactions work)."""

from __future__ import annotations


class TransactionService:
    def __init__(self, store) -> None:
        self.store = store

    def end_transaction(self, transaction_id, state):
        raise NotImplementedError("transactions are not implemented yet")

    def check(self, resolve):
        raise NotImplementedError("transactions are not implemented yet")

    def on_retention(self, commitlog_min: int) -> None:
        pass

    def close(self) -> None:
        pass
