"""``spark.readStream.format("rmq")``: the stream reader of the ``messages`` view.

Offsets are ``{"topic": {"queue_id": next_offset}}`` (:mod:`rmq_source.offsets`).  Where each
method runs decides what it may keep: ``initialOffset``, ``latestOffset``, ``partitions``,
``prepareForTriggerAvailableNow`` and ``getDefaultReadLimit`` run in one long-lived
driver-side runner process and may keep state there (the AvailableNow target, the last
latest offsets); the planner pickles the reader and executors unpickle fresh copies, so the
object holds only options and plain data, and every store handle is opened where it is used.

Correctness never rests on ``commit()`` (it lags one batch) or ``stop()`` (not observed to
run): each batch is fully described by its start and end offsets, so a restarted query
replays the same ranges.

* Queues (and, with ``subscribePattern``, topics) that appear mid-stream start at their
  earliest offset: ``latestOffset`` adds them, and a queue missing from a batch's start
  offset is read from its minimum offset.
* Every queue of the start offset is carried into the end offset, so no queue is ever
  forgotten (and re-read from earliest) by a later batch.
* ``maxOffsetsPerTrigger`` (``ReadMaxRows``) is shared by the queues max-min fairly: each
  queue gets an equal share, queues with less backlog give the rest to the others.
* The path may be a store group (:class:`store.StoreGroup`): its offsets carry a store
  level (``{"store": {"topic": {"queue_id": n}}}``), queues are keyed ``(store, topic,
  queue)`` inside, ``maxOffsetsPerTrigger`` is shared by the queues of every store, and
  each partition reads one store.  One store keeps the offsets without a store level.
* ``failOnDataLoss``: a start below a queue's minimum offset (retention removed messages)
  raises :class:`DataLossError`; a start, or a replayed batch's end, above a queue's end
  (the store lost messages the query had read: a failover to a replica that had not copied
  them) raises :class:`OffsetsPastEndError`, as does a subscribed queue of the checkpoint
  that the store no longer has (its end is taken as 0).  With ``false`` the reader moves to
  the queue's minimum / end.  A query cannot see a loss that new messages have already covered again
  (the queue grew back past its checkpoint before it looked): it reads on from its
  checkpoint, as Kafka's source does after an unclean leader election.
* The option ``keys`` filters the stream: every message is read and only those carrying one
  of the keys are returned (no key index: a stream reads every offset anyway, and its
  offsets still move over every message, as with ``tags``).
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from .delivery import TRIGGER_DELIVERY_MESSAGES, close_kept_open, deliver_due_kept_open
from .errors import OffsetsPastEndError
from .offsets import (
    QueueKey,
    flatten,
    members_from_spark,
    members_to_spark,
    unflatten,
)
from .options import RmqOptions
from .partitions import QueueRange, RmqPartition, plan_member_partitions, read_partition
from .pushdown import RowFilter
from .queues import (
    apply_data_loss,
    check_named_queues,
    queue_bounds,
    resolve_offsets,
    subscribed_queues,
)
from .stores import open_reader, store_members

#: a queue of a query over one store or a group: ``(store name, topic, queue id)``
FlatKey = tuple[str, str, int]


def distribute_rows(max_rows: int, available: Mapping[QueueKey, int],
                    position: Mapping[QueueKey, int] | None = None) -> dict[QueueKey, int]:
    """Share ``max_rows`` among queues max-min fairly (water-filling), deterministically.

    Every queue gets ``min(available, L)`` for the largest level ``L`` that fits; the rows
    left over go one each to the queues that still have backlog, least advanced first (lowest
    ``position``, then key order), so that a limit below the number of busy queues still
    moves every queue in turn.
    """
    position = position or {}
    keys = sorted(available, key=lambda k: (position.get(k, 0), k))
    backlog = np.array([max(0, int(available[k])) for k in keys], dtype=np.int64)
    if int(backlog.sum()) <= max_rows:
        return dict(zip(keys, backlog.tolist()))
    lo, hi = 0, int(backlog.max())
    while lo < hi:  # largest level whose total fits
        mid = (lo + hi + 1) // 2
        if int(np.minimum(backlog, mid).sum()) <= max_rows:
            lo = mid
        else:
            hi = mid - 1
    grant = np.minimum(backlog, lo)
    left = max_rows - int(grant.sum())
    if left:
        more = np.flatnonzero(backlog > lo)[:left]
        grant[more] += 1
    return dict(zip(keys, grant.tolist()))


def past_end_message(key: FlatKey, offset: int, high: int, what: str = "start") -> str:
    """The :class:`OffsetsPastEndError` text: the queue, the query's offset, the queue's end,
    the likely causes and what to do."""
    where = f" of store {key[0]}" if key[0] else ""
    had = ("this query's checkpoint says it already read up to offset" if what == "start"
           else "a batch this query planned before a restart ends at offset")
    return (f"queue {key[1]}/{key[2]}{where} now ends at offset {high}, but {had} "
            f"{offset}: the store no longer holds messages {high} to {offset - 1} "
            "(a failover to a replica that had not copied them, with asynchronous "
            "replication; a store restored from an older copy; a crash with ASYNC_FLUSH); "
            f"set option failOnDataLoss=false to go on from offset {high} (the messages "
            "stored there from now on are read), or start the query with a new "
            "checkpointLocation")


class RmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader of the ``messages`` view.

    Parameters
    ----------
    options : RmqOptions
        Parsed with ``streaming=True``.
    """

    def __init__(self, options: RmqOptions) -> None:
        self.options = options
        self.members = store_members(options.path)
        self.names = tuple(name for name, _ in self.members)
        self._target: dict[FlatKey, int] | None = None  # AvailableNow: read no further
        self._latest: dict[FlatKey, int] | None = None  # for reportLatestOffset
        # the driver's readers, kept open from one micro-batch to the next: opening a store
        # maps every queue file again, and closing it unmaps them (tens of ms per 1,000)
        self._readers: dict[str, object] = {}

    def __getstate__(self) -> dict:
        # runner-side state is not shipped to executors
        return {"options": self.options, "members": self.members, "names": self.names,
                "_target": None, "_latest": None, "_readers": {}}

    def _reader(self, path: str):
        reader = self._readers.get(path)
        if reader is None:
            reader = self._readers[path] = open_reader(path)
        elif hasattr(reader, "refresh"):  # a served store: its bounds snapshot is stale now
            reader.refresh()
        return reader

    # -- driver side -------------------------------------------------------------------------
    def _deliver(self, everything: bool = False) -> None:
        """``deliverDue``: a bounded step per trigger (the rest of a burst follows in the
        background, :mod:`rmq_source.delivery`); everything for an AvailableNow target."""
        if self.options.deliver_due:
            for _, path in self.members:
                deliver_due_kept_open(path, None if everything else TRIGGER_DELIVERY_MESSAGES)

    def _bounds(self, keys: list[FlatKey] | None = None) -> dict[FlatKey, tuple[int, int]]:
        """``{(store, topic, queue): (min, max)}`` of the subscribed queues (or of ``keys``)."""
        out: dict[FlatKey, tuple[int, int]] = {}
        for name, path in self.members:
            store = self._reader(path)
            queues = subscribed_queues(store, self.options) if keys is None else \
                [(t, q) for n, t, q in keys if n == name]
            out.update(((name,) + k, b) for k, b in queue_bounds(store, queues).items())
        return out

    def _to_spark(self, flat) -> dict:
        return members_to_spark(unflatten(flat, self.names), self.names)

    def _from_spark(self, data) -> dict[FlatKey, int]:
        return flatten(members_from_spark(data, self.names))

    def initialOffset(self) -> dict:
        opts = self.options
        starts: dict[FlatKey, int] = {}
        bounds: dict[FlatKey, tuple[int, int]] = {}
        for name, path in self.members:
            store = open_reader(path)
            try:
                member = queue_bounds(store, subscribed_queues(store, opts, missing_topics="warn"))
                spec = opts.starting_offsets.for_store(name, self.names)
                check_named_queues(spec, "startingOffsets", member, store)
                resolved = resolve_offsets(store, member, spec, opts.starting_timestamp_ms,
                                           "startingOffsets")
            finally:
                store.close()
            starts.update(((name,) + k, o) for k, o in resolved.items())
            bounds.update(((name,) + k, b) for k, b in member.items())
        return self._to_spark(apply_data_loss(starts, bounds, opts.fail_on_data_loss))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._deliver(everything=True)
        self._target = {k: high for k, (_, high) in self._bounds().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._deliver()
        starts = self._from_spark(start)
        bounds = self._bounds()
        self._latest = {k: high for k, (_, high) in bounds.items()}
        target = self._target
        from_here: dict[FlatKey, int] = {}
        stops: dict[FlatKey, int] = {}
        for key, (low, high) in bounds.items():
            if key in starts:
                from_here[key] = self._not_past_end(key, starts[key], high)
            elif target is not None and key not in target:
                continue  # appeared after the AvailableNow target was fixed
            else:
                from_here[key] = low  # a queue new to this query starts at earliest
            stops[key] = high if target is None else min(high, target.get(key, from_here[key]))
        from_here = apply_data_loss(from_here, bounds, self.options.fail_on_data_loss)
        backlog = {k: max(0, stops[k] - from_here[k]) for k in from_here}

        if isinstance(limit, ReadMaxRows):
            grant = distribute_rows(limit.max_rows, backlog, from_here)
        elif isinstance(limit, ReadMinRows) and sum(backlog.values()) < limit.min_rows:
            return self._to_spark(starts)
        else:
            grant = backlog
        end = dict(starts)  # queues no longer listed keep their offset
        for key in starts.keys() - bounds.keys():
            if self.options.matches_topic(key[1]):  # subscribed, yet gone from the store
                end[key] = self._not_past_end(key, starts[key], 0)
        for key, begin in from_here.items():
            end[key] = begin + grant[key]
        return self._to_spark(end)

    def _not_past_end(self, key: FlatKey, start: int, high: int, what: str = "start") -> int:
        """An offset of the query past the queue's end: the store lost messages the query
        read (``what`` "start": the checkpoint) or planned to read ("end": a batch planned
        before a restart).  :class:`OffsetsPastEndError`, or with ``failOnDataLoss=false``
        the queue's end."""
        if start <= high:
            return start
        if self.options.fail_on_data_loss:
            raise OffsetsPastEndError(past_end_message(key, start, high, what))
        return high

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else self._to_spark(self._latest)

    def partitions(self, start: dict, end: dict) -> list[RmqPartition]:
        starts, ends = self._from_spark(start), self._from_spark(end)
        if starts == ends:
            return []
        opts = self.options
        keys = sorted(k for k in ends if ends[k] > starts.get(k, -1))
        bounds = self._bounds(keys)
        # a batch planned before a restart, replayed from the offsets log: its ends must
        # still be in the queues (a failover may have put a shorter log in their place)
        ends.update((k, self._not_past_end(k, ends[k], bounds[k][1], "end")) for k in keys)
        begins = {k: starts.get(k, bounds[k][0]) for k in keys}
        begins = apply_data_loss(begins, bounds, opts.fail_on_data_loss)
        planned = [(path, [QueueRange(t, q, begins[k], max(begins[k], ends[k]))
                           for k in keys if k[0] == name for t, q in [k[1:]]])
                   for name, path in self.members]
        # option keys: a filter over the stream, every message checked (no index; the
        # offsets still move over every message, as with the option tags)
        row_filter = None if opts.keys is None else RowFilter(keys=opts.keys)
        return plan_member_partitions(planned, tags=opts.tags,
                                      fail_on_data_loss=opts.fail_on_data_loss,
                                      columns=opts.columns, verify_crc=opts.verify_crc,
                                      row_filter=row_filter)

    def commit(self, end: dict) -> None:
        """Nothing to do: the store keeps every message until retention removes it."""

    def stop(self) -> None:
        for _, path in self.members:
            close_kept_open(path)
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()

    # -- executor side -----------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(partition)
