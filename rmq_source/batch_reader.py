"""``spark.read.format("rmq")``: the batch reader of the ``messages`` view.

``partitions()`` runs once in Spark's planner process: it (optionally) delivers due delayed
messages, resolves ``startingOffsets``/``startingTimestamp`` and ``endingOffsets``/
``endingTimestamp`` per queue, applies ``failOnDataLoss`` and cuts the ranges into partitions.
``read()`` runs in the executors and only decodes the ranges it is given.

The path may be one store or a store group (:class:`store.StoreGroup`): a group is planned
store by store (each partition reads one store) and its offsets options carry a store level.
"""

from __future__ import annotations

from typing import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .delivery import deliver_due_once
from .options import RmqOptions
from .partitions import QueueRange, RmqPartition, plan_member_partitions, read_partition
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

    def plan_ranges(self) -> list[tuple[str, list[QueueRange]]]:
        """``[(store directory, offset ranges of its subscribed queues)]`` (driver side)."""
        opts = self.options
        members = store_members(opts.path)
        names = tuple(name for name, _ in members)
        planned, known = [], set()
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
            finally:
                store.close()
            starts = apply_data_loss(starts, bounds, opts.fail_on_data_loss)
            planned.append((path, [QueueRange(k[0], k[1], starts[k], max(starts[k], ends[k]))
                                   for k in sorted(bounds)]))
        check_subscribed_exist(opts, sorted(known))
        return planned

    def partitions(self) -> list[RmqPartition]:
        opts = self.options
        return plan_member_partitions(self.plan_ranges(), tags=opts.tags,
                                      fail_on_data_loss=opts.fail_on_data_loss,
                                      columns=opts.columns, verify_crc=opts.verify_crc)

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(partition)
