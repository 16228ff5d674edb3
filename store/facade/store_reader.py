"""StoreReader: a store opened for reading only (what Spark executors and ``rmq stats`` open).

A reader takes no lock, writes no marker, runs no recovery and no flush thread, and never
writes a byte of the store's files.  It reads exactly what a writable store reads (see
:class:`~store.core.reading.ReadableStore`): only records up to the confirmed offset.  Every
write method of :class:`~store.MessageStore` exists here too and raises
:class:`~store.base.errors.ReadOnlyStoreError` naming the operation, so code written for a store
fails with a clear typed error rather than an ``AttributeError``.
"""

from __future__ import annotations

import os
from typing import Mapping, NoReturn

from ..base.config import StoreConfig
from ..core.reading import Clock, ReadableStore
from ..core.store_layout import layout_from_files
from ..base.errors import ReadOnlyStoreError, StoreNotFoundError
from ..schedule.recurring_schedule import ScheduleInfo
from ..schedule.schedule_book import read_schedules

#: The write methods of :class:`~store.MessageStore`; each raises on a reader.
WRITE_METHODS = (
    "append", "append_one", "append_batch", "append_encoded", "append_assembled",
    "assemble_encoded", "producer", "placement_chain",
    "transaction_producer",
    "deliver_due", "end_transaction", "end_transactions", "check_transactions",
    "known_transactions",
    "prepare_transaction_checks", "answer_check_rounds", "clean_expired_files", "flush",
    "write_lock", "ensure_topic", "sink", "atomic_append", "drop_tail", "rebuild_queues",
    "rebuild_key_index",
    "remove_schedule", "pause_schedule", "resume_schedule",
)


class StoreReader(ReadableStore):
    """A read-only view of a store directory (see the module docstring).

    Use :meth:`open` (or ``MessageStore.open(path, read_only=True)``).
    """

    read_only = True

    @classmethod
    def open(cls, path: str | os.PathLike, config: StoreConfig | Mapping | None = None, *,
             clock: Clock | None = None) -> "StoreReader":
        """Open the existing store at ``path`` for reading.

        Raises
        ------
        StoreNotFoundError
            ``path`` is not a store directory (no ``config/store.json``).
        """
        return cls(os.fspath(path), config, clock=clock)

    def __init__(self, path: str, config: StoreConfig | Mapping | None = None, *,
                 clock: Clock | None = None) -> None:
        root = os.path.abspath(path)
        if not (os.path.isfile(os.path.join(root, "config", "store.json"))
                or layout_from_files(root)):
            raise StoreNotFoundError(
                f"{root} is not an rmq store (no config/store.json) nor a RocketMQ store (no "
                "CommitLog segments); give the directory a producer wrote to, or a RocketMQ "
                "broker's store directory")
        #: whether rmq created the directory (``False``: another system's, e.g. RocketMQ's)
        self.written_by_rmq = os.path.isfile(os.path.join(root, "config", "store.json"))
        self._open_files(root, config, clock, record_layout=False)
        self.recovered = False

    def schedules(self) -> list[ScheduleInfo]:
        """The store's recurring schedules as last written (see
        :meth:`MessageStore.schedules <store.MessageStore.schedules>`); none for a store
        Apache RocketMQ wrote."""
        return read_schedules(self.root)

    def _refuse(self, operation: str) -> NoReturn:
        self._check_open()
        raise ReadOnlyStoreError(self.root, operation)


def _refusing(operation: str):
    """A method of :class:`StoreReader` that refuses the write ``operation``."""

    def refuse(self: StoreReader, *args, **kwargs) -> NoReturn:
        self._refuse(operation)

    refuse.__name__ = refuse.__qualname__ = operation
    refuse.__doc__ = (f"Refused on a read-only store: raises :class:`ReadOnlyStoreError` "
                      f"(``{operation}`` writes).")
    return refuse


for _operation in WRITE_METHODS:
    setattr(StoreReader, _operation, _refusing(_operation))
del _operation
