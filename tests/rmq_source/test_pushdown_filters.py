"""Which of Spark's filters ``rmq_source.pushdown`` takes, and how it narrows and reads ranges
(no Spark session: the filters are built directly)."""

from __future__ import annotations

import datetime as dt

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from rmq_source.partitions import QueueRange
from rmq_source.pushdown import narrow_ranges, push_filters, read_checked
from store import Message

UTC = dt.timezone.utc


def test_taken_filters_combine_and_the_rest_go_back_to_spark():
    like = StringStartsWith(("tags",), "r")
    negated = Not(EqualTo(("tags",), "red"))
    naive = GreaterThan(("store_timestamp",), dt.datetime(2024, 1, 1))
    is_null = IsNull(("tags",))
    null_safe = EqualNullSafe(("tags",), None)
    other_type = EqualTo(("queue_id",), "1")
    nested = EqualTo(("properties", "a"), "x")
    open_tags = IsNotNull(("transaction_id",))
    rejected = [like, negated, naive, is_null, null_safe, other_type, nested, open_tags]
    filters = [In(("tags",), ("red", "blue", None)), EqualTo(("tags",), "red"),
               GreaterThan(("queue_offset",), 4), LessThan(("queue_offset",), 10),
               LessThanOrEqual(("queue_offset",), 8), IsNotNull(("queue_offset",)),
               IsNotNull(("tags",)),
               GreaterThan(("store_timestamp",), dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
               *rejected]
    pushed, back = push_filters(filters)
    assert back == rejected
    assert pushed.values("tags") == ("red",)
    assert pushed.bounds("queue_offset") == (5, 8)
    assert pushed.bounds("store_timestamp")[0] == 1_000_001
    assert pushed.checked_columns == ("store_timestamp",)
    assert not pushed.nothing
    assert push_filters([EqualTo(("topic",), None)])[0].nothing  # "= NULL" holds for no row
    assert push_filters([GreaterThan(("queue_id",), True)])[1]  # a bool is not an offset


def test_ranges_are_cut_by_queue_store_time_and_commitlog_offset(store, clock):
    producer = store.producer("cut")
    sent = []
    for i in range(40):
        sent.append(producer.send(Message("cut", b"%d" % i, tags=("a", "b")[i % 2]),
                                  queue_id=0))
        clock.advance(1_000)
    views = store.pull("cut", 0, 0, 40)
    times = [v.store_timestamp_ms for v in views]
    whole = [QueueRange("cut", 0, 0, 40), QueueRange("cut", 1, 0, 0)]
    at = times[10] * 1000
    pushed, _ = push_filters([
        EqualTo(("topic",), "cut"), In(("queue_id",), (0,)),
        GreaterThan(("store_timestamp",), dt.datetime.fromtimestamp(at / 1e6, UTC)),
        LessThan(("commitlog_offset",), sent[30].commitlog_offset)])
    (cut,) = narrow_ranges(store, whole, pushed)
    assert (cut.start, cut.end) == (11, 30)  # store times 1 s apart: offset 10 is at `at`

    def read(start, end, columns):
        return store.read_arrow("cut", 0, start, end, columns=columns)

    rows = [b for batch in read_checked(read, cut.start, cut.end, pushed, ("body",))
            for b in batch.column("body").to_pylist()]
    assert rows == [v.body for v in views if v.store_timestamp_ms * 1000 > at
                    and v.commitlog_offset < sent[30].commitlog_offset]
    none, _ = push_filters([EqualTo(("topic",), "other")])
    assert narrow_ranges(store, whole, none) == []


def test_a_selective_row_check_reads_only_the_runs_that_pass(store, clock):
    producer = store.producer("ids")
    for i in range(64):
        producer.send(Message("ids", b"%d" % i), queue_id=0)
    views = store.pull("ids", 0, 0, 64)
    wanted = (views[3].msg_id, views[4].msg_id, views[40].msg_id)
    pushed, _ = push_filters([In(("msg_id",), wanted)])
    calls = []

    def read(start, end, columns):
        calls.append((start, end, columns))
        return store.read_arrow("ids", 0, start, end, columns=columns)

    batches = read_checked(read, 0, 64, pushed, ("body", "queue_offset"))
    assert [o for b in batches for o in b.column("queue_offset").to_pylist()] == [3, 4, 40]
    assert calls[1:] == [(3, 5, ("body", "queue_offset")), (40, 41, ("body", "queue_offset"))]
    assert "body" not in calls[0][2]  # the probe decodes no body


def test_a_selective_tag_is_read_in_steps_of_about_a_batch_of_rows(store, store_path,
                                                                  monkeypatch):
    """One message in ten has the tag: the read steps grow so that each yields about a full
    batch (here of 8 rows), never more, and the rows are those of the plain read."""
    from rmq_source import partitions
    from rmq_source.partitions import RmqPartition, read_partition

    monkeypatch.setattr(partitions, "BATCH_ROWS", 8)
    monkeypatch.setattr(partitions, "MAX_STEP_OFFSETS", 128)
    producer = store.producer("tagged")
    producer.send_batch([Message("tagged", b"%d" % i, tags="rare" if i % 10 == 3 else "common")
                         for i in range(600)], queue_id=0)
    store.flush()
    from store.core.reading import ReadableStore

    calls = []
    real = ReadableStore.read_arrow

    def counted(self, topic, queue_id, start, end, **kw):
        calls.append(end - start)
        return real(self, topic, queue_id, start, end, **kw)

    monkeypatch.setattr(ReadableStore, "read_arrow", counted)
    part = RmqPartition(store_path, (QueueRange("tagged", 0, 0, 600),), tags=("rare",))
    batches = list(read_partition(part))
    assert [o for b in batches for o in b.column("queue_offset").to_pylist()] == list(
        range(3, 600, 10))
    assert max(b.num_rows for b in batches) <= 8
    assert calls[:3] == [8, 64, 85] and len(calls) <= 12  # not 75 steps of 8 offsets
