"""``spark.read.format("rmq")``: the batch reader of the ``messages`` view.

``partitions()`` runs once in Spark's planner process: it (optionally) delivers due delayed
messages, resolves ``startingOffsets``/``startingTimestamp`` and ``endingOffsets``/
``endingTimestamp`` per queue, applies ``failOnDataLoss`` and cuts the ranges into partitions.
``read()`` runs in the executors and only decodes the ranges it is given.

The path may be one store or a store group (:class:`store.StoreGroup`): a group is planned
store by store (each partition reads one store) and its offsets options carry a store level.

With Spark's filter pushdown on, the data source hands out :class:`RmqPushdownReader`, which
takes the filters :mod:`rmq_source.pushdown` can answer exactly: planning then drops the
queues and cuts the offset ranges they exclude, and the tasks check the rest row by row.

A read by key (option ``keys``, pushdown or not) or by message id (pushed ``msg_id``) is
planned through each store's key index when it has one (:mod:`rmq_source.key_lookup`): only
the offsets of those messages are read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .delivery import deliver_due_once
from .key_lookup import index_ranges
from .options import RmqOptions
from .partitions import QueueRange, RmqPartition, plan_member_partitions, read_partition
from .pushdown import RowFilter, narrow_ranges, push_filters
from .queues import (
    apply_data_loss,
    check_named_queues,
    check_subscribed_exist,
    queue_bounds,
    resolve_offsets,
    subscribed_queues,
)
from .stores import open_reader, store_members


class RmqBatchReader(DataSourceReader):
    """Batch reader: every subscribed queue from its start to its end offset.

    Parameters
    ----------
    options : RmqOptions
        Parsed with ``streaming=False``.
    """

    def __init__(self, options: RmqOptions) -> None:
        self.options = options
        self.pushed: RowFilter | None = None

    @property
    def row_filter(self) -> RowFilter | None:
        """What every row read must pass: the pushed filters and the option ``keys``."""
        if self.options.keys is None:
            return self.pushed
        return replace(self.pushed or RowFilter(), keys=self.options.keys)

    def plan_ranges(self) -> list[tuple[str, list[QueueRange]]]:
        """``[(store directory, offset ranges of its subscribed queues)]`` (driver side)."""
        opts = self.options
        members = store_members(opts.path)
        names = tuple(name for name, _ in members)
        planned, known = [], set()
        row_filter = self.row_filter
        for name, path in members:
            if opts.deliver_due:
                deliver_due_once(path)
            store = open_reader(path)
            try:
                known.update(store.topics())
                bounds = queue_bounds(store, subscribed_queues(
                    store, opts, missing_topics="fail" if len(members) == 1 else "ignore"))
                starting = opts.starting_offsets.for_store(name, names)
                ending = opts.ending_offsets.for_store(name, names)
                check_named_queues(starting, "startingOffsets", bounds, store)
                check_named_queues(ending, "endingOffsets", bounds, store)
                starts = resolve_offsets(store, bounds, starting, opts.starting_timestamp_ms,
                                         "startingOffsets")
                ends = resolve_offsets(store, bounds, ending, opts.ending_timestamp_ms,
                                       "endingOffsets")
                starts = apply_data_loss(starts, bounds, opts.fail_on_data_loss)
                ranges = [QueueRange(k[0], k[1], starts[k], max(starts[k], ends[k]))
                          for k in sorted(bounds)]
                if row_filter is not None:
                    ranges = narrow_ranges(store, ranges, row_filter)
                    by_key = index_ranges(store, ranges, row_filter)
                    ranges = ranges if by_key is None else by_key
            finally:
                store.close()
            planned.append((path, ranges))
        check_subscribed_exist(opts, sorted(known))
        return planned

    def partitions(self) -> list[RmqPartition]:
        opts = self.options
        tags = opts.tags
        pushed_tags = None if self.pushed is None else self.pushed.values("tags")
        if pushed_tags is not None:  # the subscription's tags and the query's: both hold
            tags = tuple(t for t in tags if t in pushed_tags) if tags is not None else pushed_tags
        return plan_member_partitions(self.plan_ranges(), tags=tags,
                                      fail_on_data_loss=opts.fail_on_data_loss,
                                      columns=opts.columns, verify_crc=opts.verify_crc,
                                      row_filter=self.row_filter)

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(partition)


class RmqPushdownReader(RmqBatchReader):
    """The batch reader with filter pushdown (Spark's ``spark.sql.python.filterPushdown.enabled``
    on): what :func:`rmq_source.pushdown.push_filters` takes is answered by the source."""

    def pushFilters(self, filters: list) -> Iterable:
        self.pushed, rejected = push_filters(filters)
        return rejected
