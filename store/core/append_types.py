"""What the append path takes and returns: records as columns, and where records landed."""

from __future__ import annotations

from dataclasses import dataclass
import struct
from typing import Callable, NamedTuple, Protocol, Sequence

import numpy as np

from ..files.checkpoint import StoreCheckpoint
from ..files.commit_log import CommitLog
from ..base.config import StoreConfig
from ..files.consume_queue import ConsumeQueue
from .queue_dispatch import Dispatcher


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where one record landed."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class BatchAppendResult:
    """Where the records of :meth:`StoreCore.append_batch` landed.

    Record ``i`` has queue offset ``first_queue_offset + i`` (-1 when not indexed: prepared
    or rolled-back transaction records) and CommitLog offset ``commitlog_offsets[i]``.
    """

    topic: str
    queue_id: int
    first_queue_offset: int
    commitlog_offsets: np.ndarray
    sizes: np.ndarray
    store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """Records as columns, for :meth:`Appender.append_encoded`.

    ``headers`` (:data:`store.formats.record_codec.HEADER_DTYPE`) holds every field the caller decides
    (magic, body CRC and length, flag, sys flag, born time and host, reconsume times,
    prepared offset); assembling sets the size in place, and the append writes queue id,
    queue offset, physical offset and store time into the assembled bytes (see
    :class:`AssembledRecords`).  Record ``i`` is the header, ``bodies[i]``, the topic
    ``topics[topic_ids[i]]``, then ``properties[i]`` followed by ``extra_properties[i]``
    (when given) as its properties, ``properties_length[i]`` bytes in all.
    ``queue_ids[i]`` outside the topic's queues is taken modulo the queue count.
    ``tags_codes`` are the ConsumeQueue tagsCodes (ignored when the records are not
    dispatched).  ``store_timestamp_ms`` (default: the store's clock at the append) is the
    store time of every record; a delivery run passes its own "now".
    ``body_crc_known``: the headers' ``body_crc`` are the bodies' CRCs already (records
    copied from the CommitLog keep theirs, so damage in a source stays detectable); else
    they are computed while the records are assembled.
    """

    headers: np.ndarray
    bodies: Sequence
    properties: Sequence
    properties_length: np.ndarray
    topics: Sequence[str]
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    tags_codes: np.ndarray
    extra_properties: Sequence | None = None
    store_timestamp_ms: int | None = None
    body_crc_known: bool = False


class Presumed(NamedTuple):
    """The placement an encoded chunk's four placement fields were written for (see
    :mod:`store.core.placement_chain`)."""

    log_end: int  # where the log ended before the chunk
    key: tuple  # its one queue: (topic, queue id)
    queue_first: int  # the queue offset of its first record
    store_timestamp_ms: int


#: ``presume(records, sizes)``: writes the placement fields it presumes for records about to
#: be assembled into their headers, and says for what (:meth:`PlacementChain.presume
#: <store.core.placement_chain.PlacementChain.presume>`), or ``None``.
Presume = Callable[["EncodedRecords", np.ndarray], "Presumed | None"]


@dataclass(frozen=True, slots=True)
class AssembledRecords:
    """Records encoded before the write lock is taken, as RocketMQ encodes a message before
    its put lock: every byte is final except the four fields only the append knows (queue
    id, queue offset, physical offset, store time), which it writes into ``data`` in place.

    Record ``i`` is ``data[starts[i]:starts[i] + sizes[i]]`` (back to back).  ``topics``,
    ``topic_ids``, ``queue_ids``, ``tags_codes`` and ``store_timestamp_ms`` are those of the
    :class:`EncodedRecords` it was made from; ``dispatched``: whether the records get queue
    entries (their sys flag).  Made by :meth:`StoreCore.assemble_encoded
    <store.core.store_core.StoreCore.assemble_encoded>`, appended by
    :meth:`StoreCore.append_assembled <store.core.store_core.StoreCore.append_assembled>`.
    """

    data: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    topics: Sequence[str]
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    tags_codes: np.ndarray
    dispatched: bool
    store_timestamp_ms: int | None = None
    #: the placement the four fields were already written for, if any (else the append
    #: writes them; it also does when the placement differs)
    presumed: Presumed | None = None

    def __len__(self) -> int:
        return len(self.sizes)


@dataclass(frozen=True, slots=True)
class EncodedAppend:
    """Where :meth:`Appender.append_encoded` put each record (arrays in input order)."""

    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    commitlog_offsets: np.ndarray
    sizes: np.ndarray
    store_timestamp_ms: int


class OneRecord(NamedTuple):
    """One plain record checked and laid out before the write lock (:meth:`Appender.prepare_one
    <store.core.appender.Appender.prepare_one>`); :meth:`Appender.append_one
    <store.core.appender.Appender.append_one>` packs and places it under the lock."""

    topic: str
    topic_bytes: bytes
    body: bytes
    properties: bytes
    layout: struct.Struct  # the whole record (:func:`~store.formats.record_codec.whole_record_layout`)
    size: int
    body_crc: int
    tags_code: int
    flag: int
    born_timestamp_ms: int
    queue_count: int
    queue_id: int | None  # ``None``: the next of the topic's round robin


class SingleAppend(NamedTuple):
    """Where :meth:`Appender.append_one <store.core.appender.Appender.append_one>` put its
    record."""

    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp_ms: int


class AppendTarget(Protocol):
    """What the appender uses of its store (the :class:`~store.core.store_core.StoreCore`)."""

    root: str
    config: StoreConfig
    commit_log: CommitLog
    checkpoint: StoreCheckpoint
    dispatcher: Dispatcher

    def now_ms(self) -> int: ...

    def ensure_topic(self, topic: str) -> int: ...

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue: ...

    def drop_tail(self, offset: int) -> None: ...
