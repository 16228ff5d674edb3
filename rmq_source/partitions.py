"""Spark input partitions of the ``rmq`` source, their planning and their reading.

A partition is a list of queue offset ranges (:class:`QueueRange`) plus what ``read()`` needs
to decode them: it holds only picklable primitives, because the driver pickles it and each
executor task unpickles a fresh copy.  Planning cuts the ranges of one query into partitions
of about equal row counts (a big queue is split, small queues are packed together), so that
a query over a few large queues still uses every core and one over many small queues does
not pay a task per queue.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable, Iterator

from pyspark.sql.datasource import InputPartition

from store import OffsetOutOfRangeError, keep_freed_heap

from .errors import DataLossError
from .pushdown import RowFilter, read_checked
from .stores import open_reader

#: rows in one yielded RecordBatch at most (Spark's default arrow batch size)
BATCH_ROWS = 65_536
#: partitions are never cut smaller than this many offsets (per-task overhead dominates)
MIN_PARTITION_ROWS = 4 * BATCH_ROWS
#: nor larger than this (bounds a task's run time and a retry's cost)
MAX_PARTITION_ROWS = 4_000_000


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Queue offsets ``[start, end)`` of one (topic, queue)."""

    topic: str
    queue_id: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class RmqPartition(InputPartition):
    """One Spark task's work: ranges of one store, read in order.

    Parameters
    ----------
    path : str
        The store directory.
    ranges : tuple of QueueRange
        What to read, in this order.
    tags : tuple of str or None
        Keep only messages with one of these tags (``None``: every message).
    fail_on_data_loss : bool
        Raise :class:`DataLossError` (``True``) or skip ahead (``False``) when a range starts
        below the queue's minimum offset because retention removed older messages.
    columns : tuple of str or None
        The message columns to decode, in the order of the user's schema (``None``: all).
    verify_crc : bool
        Check every body against its CRC (option ``verifyCrc``).  A record failing a check
        fails the task with a ``CorruptRecordError`` naming file and offset, or with
        ``failOnDataLoss=false`` is skipped.
    row_filter : RowFilter or None
        Pushed filters the rows are checked against (:mod:`rmq_source.pushdown`).
    """

    path: str
    ranges: tuple[QueueRange, ...]
    tags: tuple[str, ...] | None = None
    fail_on_data_loss: bool = True
    columns: tuple[str, ...] | None = None
    verify_crc: bool = False
    row_filter: RowFilter | None = None

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.ranges)


#: partitions per core when a read is big enough: two keep both cores busy when one task
#: runs late (page-cache misses, a slow Python worker start) at little per-task cost
#: (bench/bench_spark_read.py: 2 partitions per core were as fast as 1 and steadier)
PARTITIONS_PER_CORE = 2


def default_parallelism() -> int:
    """How many partitions a big read is cut into, guessed from the planner's cores."""
    return PARTITIONS_PER_CORE * max(1, os.cpu_count() or 1)


def plan_partitions(path: str, ranges: Iterable[QueueRange], *, tags: tuple[str, ...] | None,
                    fail_on_data_loss: bool, parallelism: int | None = None,
                    target_rows: int | None = None,
                    columns: tuple[str, ...] | None = None,
                    verify_crc: bool = False,
                    row_filter: RowFilter | None = None) -> list[RmqPartition]:
    """Cut queue ranges into partitions of about ``target_rows`` offsets each.

    Parameters
    ----------
    path : str
        The store directory.
    ranges : iterable of QueueRange
        Ranges to read; empty ones are dropped.
    tags, fail_on_data_loss, columns, verify_crc, row_filter :
        Copied into each partition.
    parallelism : int, optional
        Tasks that run at once (default: :func:`default_parallelism`); with ``target_rows``
        unset, partitions are sized so that every slot gets work.
    target_rows : int, optional
        Offsets per partition (default: total / parallelism, clamped to
        [:data:`MIN_PARTITION_ROWS`, :data:`MAX_PARTITION_ROWS`]).

    Returns
    -------
    list of RmqPartition
        ``[]`` when no range holds an offset.
    """
    work = sorted((r for r in ranges if r.rows > 0), key=lambda r: (r.topic, r.queue_id, r.start))
    total = sum(r.rows for r in work)
    if total == 0:
        return []
    if target_rows is None:
        slots = parallelism or default_parallelism()
        target_rows = min(MAX_PARTITION_ROWS, max(MIN_PARTITION_ROWS, math.ceil(total / slots)))
    # with the target fixed, even the pieces out: n partitions of total / n offsets each
    count = math.ceil(total / target_rows)
    size = math.ceil(total / count)
    def partition(ranges: list[QueueRange]) -> RmqPartition:
        return RmqPartition(path, tuple(ranges), tags, fail_on_data_loss, columns, verify_crc,
                            row_filter)

    partitions: list[RmqPartition] = []
    current: list[QueueRange] = []
    room = size
    for r in work:
        start = r.start
        while start < r.end:
            take = min(room, r.end - start)
            current.append(QueueRange(r.topic, r.queue_id, start, start + take))
            start += take
            room -= take
            if room == 0:
                partitions.append(partition(current))
                current, room = [], size
    if current:
        partitions.append(partition(current))
    return partitions


def plan_member_partitions(planned: list[tuple[str, list[QueueRange]]], **kwargs
                           ) -> list[RmqPartition]:
    """Partitions of ranges in several stores (a store group): each store's ranges are cut
    by :func:`plan_partitions` with its share of the parallelism (by rows)."""
    if len(planned) == 1:
        path, ranges = planned[0]
        return plan_partitions(path, ranges, **kwargs)
    total = sum(r.rows for _, ranges in planned for r in ranges)
    slots = default_parallelism()
    out: list[RmqPartition] = []
    for path, ranges in planned:
        rows = sum(r.rows for r in ranges)
        if rows:
            out += plan_partitions(path, ranges, parallelism=max(1, round(slots * rows / total)),
                                   **kwargs)
    return out


def data_loss_message(topic: str, queue_id: int, start: int, min_offset: int) -> str:
    return (f"offsets {start} to {min_offset - 1} of queue {topic}/{queue_id} were removed by "
            f"retention (the queue now starts at {min_offset}); set option failOnDataLoss=false "
            "to skip them, or restart the query from startingOffsets=earliest")


#: a filtered read (tags, pushed row checks) reads at most this many offsets per step
MAX_STEP_OFFSETS = 16 * BATCH_ROWS


def _next_step(step: int, rows: int) -> int:
    """Offsets to read next, after ``step`` offsets gave ``rows`` rows: about
    :data:`BATCH_ROWS` rows per step, so that a selective filter (a tag of one message in
    ten) makes a few batches of full size rather than many small ones (each read call and
    each batch Spark takes costs about a millisecond); between :data:`BATCH_ROWS` and
    :data:`MAX_STEP_OFFSETS` offsets."""
    return min(MAX_STEP_OFFSETS, max(BATCH_ROWS, step * BATCH_ROWS // max(rows, 1)))


def _sliced(batches) -> Iterator:
    """The non-empty batches, cut to at most :data:`BATCH_ROWS` rows each (zero-copy)."""
    for batch in batches:
        for first in range(0, batch.num_rows, BATCH_ROWS):
            yield batch.slice(first, BATCH_ROWS)


def read_partition(partition: InputPartition) -> Iterator:
    """Yield ``pyarrow.RecordBatch``es (at most :data:`BATCH_ROWS` rows) of a partition.

    The store is opened read-only here, in the task, and closed when the ranges are done.
    """
    if not isinstance(partition, RmqPartition):  # Spark's placeholder for "no partitions"
        return
    keep_freed_heap()  # a Spark Python worker mostly decodes: keep its freed heap for reuse
    store = open_reader(partition.path)
    streamed = getattr(store, "read_batches", None)  # a served store: one call per range
    pushed = partition.row_filter
    checked = () if pushed is None else pushed.checked_columns
    read_columns = partition.columns if not checked or partition.columns is None else tuple(
        dict.fromkeys(partition.columns + checked))

    def chunk_reader(r: QueueRange):
        def read(start: int, end: int, columns: tuple[str, ...] | None):
            return store.read_arrow(r.topic, r.queue_id, start, end, tags=partition.tags,
                                    columns=columns, verify_crc=partition.verify_crc,
                                    skip_corrupt=not partition.fail_on_data_loss)
        return read

    try:
        for r in partition.ranges:
            start = r.start
            low = store.min_offset(r.topic, r.queue_id)
            if start < low:
                if partition.fail_on_data_loss:
                    raise DataLossError(data_loss_message(r.topic, r.queue_id, start, low))
                start = low  # skip what retention removed
            if streamed is not None and start < r.end:
                began = False
                try:
                    for batch in streamed(r.topic, r.queue_id, start, r.end,
                                          tags=partition.tags, columns=read_columns,
                                          verify_crc=partition.verify_crc,
                                          skip_corrupt=not partition.fail_on_data_loss):
                        began = True
                        if checked:
                            batch = pushed.apply(batch, partition.columns)
                        if batch.num_rows:
                            yield batch
                    continue
                except OffsetOutOfRangeError:
                    if began:
                        raise
                    # retention moved the queue's start: the offset-by-offset way below
            step = BATCH_ROWS
            while start < r.end:
                end = min(r.end, start + step)
                try:
                    batches = read_checked(chunk_reader(r), start, end, pushed,
                                           partition.columns) if checked else [
                        chunk_reader(r)(start, end, partition.columns)]
                except OffsetOutOfRangeError:
                    low = store.min_offset(r.topic, r.queue_id)
                    if start >= low:
                        raise
                    if partition.fail_on_data_loss:
                        raise DataLossError(data_loss_message(r.topic, r.queue_id, start, low)) \
                            from None
                    start = low  # skip what retention removed
                    continue
                rows = sum(batch.num_rows for batch in batches)
                yield from _sliced(batches)
                if end - start == step:
                    step = _next_step(step, rows)
                start = end
    finally:
        store.close()
