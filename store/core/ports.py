"""The narrow port the services (delay levels, timer wheel, transactions) see of the core.

A service is handed an object satisfying :class:`StorePort` (in practice the
:class:`~store.core.store_core.StoreCore` under a :class:`~store.facade.message_store.MessageStore`)
and uses nothing else of it.  The port is what the services needed before the store was cut
into layers, made explicit, plus the three hooks through which a service makes itself known
to the core instead of being known by it:

* :meth:`StorePort.register_system_topic`: a system topic's queue count and, when its
  ConsumeQueue ``tagsCode`` is not the tag hash, the rule that computes it (the delay levels
  index a record by its due time, the timer by its fire time);
* :meth:`StorePort.add_retention_listener`: called with the new CommitLog minimum after
  retention deleted segments (the timer drops TimerLog files that pointed below it);
* :meth:`StorePort.add_recovery_listener`: called with a :class:`RecoveryScan` after
  recovery re-dispatched the CommitLog tail, before the recovered end is published
  (transactions note commit records kept without their op).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from .queue_dispatch import Dispatcher, TagsCodeRule

if TYPE_CHECKING:  # pragma: no cover - type-only imports (this floor and below)
    from ..files.checkpoint import StoreCheckpoint
    from ..formats.record_codec import Record, RecordSpec
    from ..files.commit_log import CommitLog
    from ..base.config import StoreConfig
    from ..files.consume_queue import ConsumeQueue
    from ..formats.message_id import MessageIdGenerator
    from ..files.topics import TopicTable
    from .append_types import (AppendResult, AssembledRecords, BatchAppendResult,
                               EncodedAppend, EncodedRecords, Presume, SingleAppend)
    from .appender import Appender
    from .placement_chain import PlacementChain
    from .write_placement import Allocate

#: ``listener(commitlog_min)`` after retention deleted CommitLog segments.
RetentionListener = Callable[[int], None]
#: ``guard() -> lowest CommitLog offset still needed, or None``: retention keeps the segment
#: holding it and every later one.
RetentionGuard = Callable[[], "int | None"]


@dataclass(frozen=True, slots=True)
class RecoveryScan:
    """What a recovery scan kept: the records from ``start`` to ``end`` it re-dispatched.

    ``limited`` is True when the scan cut an unconfirmed append whole (the same boot as the
    crashed writer), False when it kept every valid record (after a reboot, or a damaged
    tail found on a clean open) and so may have kept part of an append.  ``offsets`` and
    ``sys_flags`` describe each kept record, in log order.
    """

    start: int
    end: int
    limited: bool
    offsets: np.ndarray
    sys_flags: np.ndarray


#: ``listener(core, scan)`` after a recovery scan, before the recovered end is published.
RecoveryListener = Callable[["StorePort", RecoveryScan], None]


class ReplicaAcks(Protocol):
    """What acknowledges an append beyond this disk (a replica set's leader with
    ``min_insync_replicas`` above 1: :mod:`store.replication.acks`).  The core calls
    :meth:`wait` once per outermost write-locked step that appended (a send, a batch, a
    table, an atomic group), after releasing the lock."""

    def wait(self, end: int) -> None:
        """Return once enough replicas hold the CommitLog up to ``end``; raise
        :class:`~store.base.errors.ReplicaAckTimeoutError` when they do not in time."""


class StorePort(Protocol):
    """What a service may use of the core (see the module docstring)."""

    root: str
    config: StoreConfig
    commit_log: CommitLog
    id_generator: MessageIdGenerator
    encode_threads: int
    #: The id recorded at creation (store.core.identity): progress files carry it.
    store_id: str | None

    def now_ms(self) -> int: ...

    # -- writing ------------------------------------------------------------------------
    def write_lock(self, lease: bool = False) -> AbstractContextManager[None]: ...

    def atomic_append(self) -> AbstractContextManager[None]: ...

    def append(self, specs: Sequence[RecordSpec], *, batch: bool = False) -> list[AppendResult]: ...

    def append_one(self, topic: str, body: bytes, properties: bytes, tags: str | None = None,
                   flag: int = 0, born_timestamp_ms: int = 0,
                   queue_id: int | None = None) -> SingleAppend: ...

    def append_batch(self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes],
                     **kwargs) -> BatchAppendResult: ...

    def append_encoded(self, records: EncodedRecords) -> EncodedAppend: ...

    def append_assembled(self, records: AssembledRecords) -> EncodedAppend: ...

    def assemble_encoded(self, records: EncodedRecords, *, allocate: Allocate | None = None,
                         presume: Presume | None = None) -> AssembledRecords: ...

    def placement_chain(self, count: int,
                        queues: Iterable[tuple[str, int]]) -> PlacementChain: ...

    def max_record_bytes(self) -> int: ...

    def flush(self) -> None: ...

    def ensure_topic(self, topic: str) -> int: ...

    def queue_count_for(self, topic: str) -> int: ...

    def tags_code(self, topic: str, properties: Mapping[str, str],
                  store_timestamp_ms: int) -> int: ...

    def tag_hashes(self, tags: Sequence[str | None]) -> np.ndarray: ...

    def has_tags_rule(self, topic: str) -> bool: ...

    def next_queue(self, topic: str, queue_count: int) -> int: ...

    # -- reading ------------------------------------------------------------------------
    def confirmed_offset(self) -> int: ...

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue: ...

    def read_record(self, commitlog_offset: int) -> Record: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def all_consume_queues(self) -> list[tuple[str, int]]: ...

    def heal_queue(self, topic: str, queue_id: int) -> bool: ...

    # -- hooks --------------------------------------------------------------------------
    def register_system_topic(self, topic: str, queue_count: int,
                              tags_code: TagsCodeRule | None = None) -> None: ...

    def add_retention_listener(self, listener: RetentionListener) -> None: ...

    def add_recovery_listener(self, listener: RecoveryListener) -> None: ...


class CoreParts(StorePort, Protocol):
    """What the core's own parts (recovery, retention) use of the core besides the port."""

    checkpoint: StoreCheckpoint
    topic_table: TopicTable
    dispatcher: Dispatcher
    appender: Appender
