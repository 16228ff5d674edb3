"""The transactions a check round asks about: a lazy sequence of views, or one Arrow batch.

A round appends a put-back copy of every half message it asks about
(:mod:`store.transaction.check_chunks`) and keeps only columns: where each copy landed, its
check count, real topic and queue, producer group.  :class:`CheckViews` turns them into

* :class:`TransactionCheckView` objects, one at a time and only when asked for (a resolver
  called in this process looks at them one by one anyway), or
* one ``pyarrow.RecordBatch`` (:meth:`CheckViews.to_arrow`) decoded from the copies with the
  store's columnar reader, for the Spark check loop: no Python object per transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..formats.arrow_properties import arrow_of, string_array
from ..formats.record_codec import Record
from ..core.arrow_decode import read_queue_batch
from ..core.message_columns import MESSAGE_SCHEMA
from ..core.ports import StorePort
from ..formats.message import (
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_UNIQ_KEY,
    SYSTEM_PROPERTY_NAMES,
    TRANS_HALF_TOPIC,
    MessageView,
)
from .half import HALF_QUEUE_ID, transaction_id_of

_MESSAGE = {f.name: f for f in MESSAGE_SCHEMA}
#: Columns of :meth:`CheckViews.to_arrow` (types as in :data:`store.MESSAGE_SCHEMA`).
CHECK_SCHEMA = pa.schema(
    [_MESSAGE["transaction_id"], pa.field("producer_group", pa.string())]
    + [_MESSAGE[n] for n in ("topic", "queue_id", "msg_id", "tags", "keys", "body",
                             "properties", "born_timestamp")]
    + [pa.field("check_times", pa.int32()), _MESSAGE["queue_offset"],
       _MESSAGE["commitlog_offset"]])
_READ = ("queue_offset", "commitlog_offset", "msg_id", "tags", "keys", "body", "properties",
         "born_timestamp")


@dataclass(frozen=True, slots=True)
class TransactionCheckView(MessageView):
    """A half message the check loop asks about: a :class:`MessageView` of the put-back copy
    with topic and queue restored to the real ones, plus who to ask and how often it was asked.

    ``queue_offset`` / ``commitlog_offset`` / ``store_timestamp_ms`` are the copy's (in the
    half topic); ``transaction_id`` is set.
    """

    producer_group: str = ""
    check_times: int = 0


def check_view(record: Record, copy_queue_offset: int, copy_commitlog_offset: int,
               copy_store_ms: int, count: int) -> TransactionCheckView:
    """The view of a put-back copy sent to whoever decides (topic and queue restored)."""
    props = dict(record.properties)
    props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(count)
    qid = props.get(PROPERTY_REAL_QUEUE_ID, "0")
    return TransactionCheckView(
        topic=props.get(PROPERTY_REAL_TOPIC, ""),
        queue_id=int(qid) if qid.lstrip("-").isdigit() else 0,
        queue_offset=copy_queue_offset, commitlog_offset=copy_commitlog_offset,
        msg_id=props.get(PROPERTY_UNIQ_KEY, ""), tags=props.get(PROPERTY_TAGS),
        keys=tuple(k for k in props.get(PROPERTY_KEYS, "").split(" ") if k),
        body=record.body,
        properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES},
        born_timestamp_ms=record.born_timestamp_ms, store_timestamp_ms=copy_store_ms,
        deliver_timestamp_ms=None, transaction_id=transaction_id_of(record),
        reconsume_times=record.reconsume_times, sys_flag=record.sys_flag,
        system_properties={k: v for k, v in props.items() if k in SYSTEM_PROPERTY_NAMES},
        producer_group=props.get(PROPERTY_PRODUCER_GROUP, ""), check_times=count,
    )


class CheckViews(Sequence):
    """The transactions of a round to ask about, in walk order (see the module docstring).

    A sequence of :class:`TransactionCheckView` (each built from its copy when accessed);
    ``+`` with another sequence gives a tuple.
    """

    def __init__(self, store: StorePort, chunks: Sequence = ()) -> None:
        self._store = store
        chunks = [c for c in chunks if c is not None and len(c.commitlog_offsets)]

        def cat(name: str) -> np.ndarray:
            if not chunks:
                return np.empty(0, np.int64)
            return np.concatenate([getattr(c, name) for c in chunks])

        self.commitlog_offsets = cat("commitlog_offsets")
        self.queue_offsets = cat("queue_offsets")
        self.check_times = cat("check_times")
        self.queue_ids = cat("queue_ids")
        self.store_timestamps = np.concatenate(
            [np.full(len(c.commitlog_offsets), c.store_timestamp_ms, np.int64)
             for c in chunks]) if chunks else np.empty(0, np.int64)
        self.sink = np.concatenate([c.sink for c in chunks]) if chunks else np.empty(0, bool)
        self.transaction_ids = pa.concat_arrays([c.transaction_ids for c in chunks]) \
            if chunks else pa.nulls(0, pa.string())
        self.topics, self.topic_ids = _merge(chunks, "topics", "topic_ids")
        self.groups, self.group_ids = _merge(chunks, "groups", "group_ids")

    def select(self, mask: np.ndarray) -> CheckViews:
        """The views where ``mask`` is True."""
        out = CheckViews.__new__(CheckViews)
        out._store = self._store
        for name in ("commitlog_offsets", "queue_offsets", "check_times", "queue_ids",
                     "store_timestamps", "sink", "topic_ids", "group_ids"):
            setattr(out, name, getattr(self, name)[mask])
        out.transaction_ids = self.transaction_ids.take(arrow_of(np.flatnonzero(mask)))
        out.topics, out.groups = self.topics, self.groups
        return out

    def __len__(self) -> int:
        return len(self.commitlog_offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"check view {i} of {len(self)}")
        record = self._store.read_record(int(self.commitlog_offsets[i]))
        return check_view(record, int(self.queue_offsets[i]), int(self.commitlog_offsets[i]),
                          int(self.store_timestamps[i]), int(self.check_times[i]))

    def __add__(self, other):
        return tuple(self) + tuple(other)

    def __radd__(self, other):
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return f"CheckViews({len(self)} transactions)"

    def to_arrow(self) -> pa.RecordBatch:
        """One row per transaction, columns :data:`CHECK_SCHEMA` (topic and queue the real
        ones, ``properties`` the user's, ``queue_offset`` / ``commitlog_offset`` the copy's)."""
        if not len(self):
            return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in CHECK_SCHEMA],
                                              schema=CHECK_SCHEMA)
        lo = int(self.queue_offsets.min())
        hi = int(self.queue_offsets.max()) + 1
        rows = read_queue_batch(self._store, TRANS_HALF_TOPIC, HALF_QUEUE_ID, lo, hi,
                                columns=_READ)
        pos = np.searchsorted(np.asarray(rows.column(0)), self.queue_offsets)
        rows = rows.take(arrow_of(pos))
        cols = {name: rows.column(name) for name in _READ}
        cols["transaction_id"] = self.transaction_ids
        cols["producer_group"] = _strings(self.groups, self.group_ids)
        cols["topic"] = _strings(self.topics, self.topic_ids)
        cols["queue_id"] = arrow_of(self.queue_ids.astype(np.int32))
        cols["check_times"] = arrow_of(self.check_times.astype(np.int32))
        return pa.RecordBatch.from_arrays([cols[f.name] for f in CHECK_SCHEMA],
                                          schema=CHECK_SCHEMA)


def _merge(chunks, names_attr: str, ids_attr: str) -> tuple[list[str], np.ndarray]:
    names: list[str] = []
    ids = []
    for c in chunks:
        ids.append(getattr(c, ids_attr) + len(names))
        names.extend(getattr(c, names_attr))
    return names, (np.concatenate(ids) if ids else np.empty(0, np.int64))


def _strings(names: list[str], ids: np.ndarray) -> pa.Array:
    if not len(ids):
        return pa.nulls(0, pa.string())
    return pa.DictionaryArray.from_arrays(arrow_of(ids.astype(np.int32)),
                                          string_array(names)).cast(pa.string())
