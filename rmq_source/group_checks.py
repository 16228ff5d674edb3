"""``view=transaction_checks`` over a store group: one check loop per store, as one stream.

Each store of the group runs its own check rounds (its half messages never leave it), so
this reader holds one :class:`~rmq_source.transaction_checks.TransactionChecksStreamReader`
per store and combines them: its offset is ``{"store": <that store's offset>}`` for every
store, each micro-batch holds the questions of every store's round, and answers written
back with ``action=end_transaction`` to the group's path are applied in the store that
holds each transaction (:meth:`store.StoreGroup.end_transactions`).  ``checkRounds=server``
works the same way, with a server (``rmq serve --check-transactions``) per store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from .options import RmqOptions
from .transaction_checks import CheckLoopError, TransactionChecksStreamReader


class GroupChecksStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader of ``view=transaction_checks`` on a group of ``members``
    (``[(store name, directory)]``, at least two)."""

    def __init__(self, options: RmqOptions, members: list[tuple[str, str]]) -> None:
        self.options = options
        self.readers = {name: TransactionChecksStreamReader(replace(options, path=path))
                        for name, path in members}

    def _split(self, offset: dict) -> dict:
        if not isinstance(offset, dict) or set(offset) != set(self.readers):
            raise CheckLoopError(
                f"offset {offset!r} is not a transaction_checks offset of the store group "
                f"{self.options.path} (stores {sorted(self.readers)}); allowed: "
                '{"<store>": {"round": n, "stream": id}, ...} (was the checkpoint written '
                "for another path?)")
        return offset

    def initialOffset(self) -> dict:
        return {name: r.initialOffset() for name, r in sorted(self.readers.items())}

    def getDefaultReadLimit(self) -> ReadLimit:
        return next(iter(self.readers.values())).getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        for r in self.readers.values():
            r.prepareForTriggerAvailableNow()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start = self._split(start)
        return {name: r.latestOffset(start[name], limit)
                for name, r in sorted(self.readers.items())}

    def partitions(self, start: dict, end: dict) -> list:
        start, end = self._split(start), self._split(end)
        return [p for name, r in sorted(self.readers.items())
                for p in r.partitions(start[name], end[name])]

    def commit(self, end: dict) -> None:
        end = self._split(end)
        for name, r in self.readers.items():
            r.commit(end[name])

    def stop(self) -> None:
        for r in self.readers.values():
            r.stop()

    def read(self, partition: InputPartition) -> Iterator:
        return next(iter(self.readers.values())).read(partition)
