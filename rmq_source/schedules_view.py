"""``spark.read.format("rmq").option("view", "schedules")``: a store's recurring schedules as
rows (what ``store.schedules()`` and ``rmq schedules`` list)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from store import MessageStore

from .options import RmqOptions

SCHEDULES_DDL = ("key string, topic string, state string, cron string, every_ms long, "
                 "tz string, next_fire_timestamp timestamp, fires long, "
                 "last_fire_timestamp timestamp, start_at_timestamp timestamp, "
                 "end_at_timestamp timestamp, max_fires long")

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_SCHEMA = pa.schema([
    ("key", pa.string()), ("topic", pa.string()), ("state", pa.string()),
    ("cron", pa.string()), ("every_ms", pa.int64()), ("tz", pa.string()),
    ("next_fire_timestamp", _TIMESTAMP), ("fires", pa.int64()),
    ("last_fire_timestamp", _TIMESTAMP), ("start_at_timestamp", _TIMESTAMP),
    ("end_at_timestamp", _TIMESTAMP), ("max_fires", pa.int64()),
])


class _Whole(InputPartition):
    def __init__(self, path: str) -> None:
        self.path = path


def _us(ms):
    return None if ms is None else ms * 1000


class SchedulesReader(DataSourceReader):
    """One partition: the schedules of the store at ``path``, by key."""

    def __init__(self, options: RmqOptions) -> None:
        self.path = options.path

    def partitions(self) -> list[InputPartition]:
        return [_Whole(self.path)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        with MessageStore.open(partition.path) as store:
            listed = store.schedules()
        columns = {
            "key": [s.key for s in listed], "topic": [s.topic for s in listed],
            "state": [s.state for s in listed], "cron": [s.cron for s in listed],
            "every_ms": [s.every_ms for s in listed], "tz": [s.tz for s in listed],
            "next_fire_timestamp": [_us(s.next_fire_ms) for s in listed],
            "fires": [s.fires for s in listed],
            "last_fire_timestamp": [_us(s.last_fire_ms) for s in listed],
            "start_at_timestamp": [_us(s.start_at_ms) for s in listed],
            "end_at_timestamp": [_us(s.end_at_ms) for s in listed],
            "max_fires": [s.max_fires for s in listed],
        }
        yield pa.RecordBatch.from_arrays(
            [pa.array(columns[f.name], f.type) for f in _SCHEMA], schema=_SCHEMA)
