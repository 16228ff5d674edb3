"""``spark.read.format("rmq")``: the batch reader of the ``messages`` view.

``partitions()`` runs once in Spark's planner process: it (optionally) delivers due delayed
messages, resolves ``startingOffsets``/``startingTimestamp`` and ``endingOffsets``/
``endingTimestamp`` per queue, applies ``failOnDataLoss`` and cuts the ranges into partitions.
``read()`` runs in the executors and only decodes the ranges it is given.
"""

from __future__ import annotations

from typing import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .delivery import deliver_due_once
from .options import RmqOptions
from .partitions import QueueRange, RmqPartition, plan_partitions, read_partition
from .queues import (
    apply_data_loss,
    check_named_queues,
    queue_bounds,
    resolve_offsets,
    subscribed_queues,
)
from .stores import open_reader


class RmqBatchReader(DataSourceReader):
    """Batch reader: every subscribed queue from its start to its end offset.

    Parameters
    ----------
    options : RmqOptions
        Parsed with ``streaming=False``.
    """

    def __init__(self, options: RmqOptions) -> None:
        self.options = options

    def plan_ranges(self) -> list[QueueRange]:
        """The offset range of each subscribed queue (driver side; opens the store)."""
        opts = self.options
        if opts.deliver_due:
            deliver_due_once(opts.path)
        store = open_reader(opts.path)
        try:
            bounds = queue_bounds(store, subscribed_queues(store, opts, missing_topics="fail"))
            check_named_queues(opts.starting_offsets, "startingOffsets", bounds, store)
            check_named_queues(opts.ending_offsets, "endingOffsets", bounds, store)
            starts = resolve_offsets(store, bounds, opts.starting_offsets,
                                     opts.starting_timestamp_ms, "startingOffsets")
            ends = resolve_offsets(store, bounds, opts.ending_offsets,
                                   opts.ending_timestamp_ms, "endingOffsets")
        finally:
            store.close()
        starts = apply_data_loss(starts, bounds, opts.fail_on_data_loss)
        return [QueueRange(key[0], key[1], starts[key], max(starts[key], ends[key]))
                for key in sorted(bounds)]

    def partitions(self) -> list[RmqPartition]:
        opts = self.options
        return plan_partitions(opts.path, self.plan_ranges(), tags=opts.tags,
                               fail_on_data_loss=opts.fail_on_data_loss, columns=opts.columns,
                               verify_crc=opts.verify_crc)

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(partition)
