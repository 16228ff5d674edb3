"""A table of schedule definitions (``producer.schedule_table``, the Spark sink's
``schedule_key`` rows): each row adds, replaces or removes one schedule.

Columns: ``key`` (the schedule's key, a string in every row), ``topic`` (or ``topic=``),
``body``, ``tags``, ``keys``, ``properties`` (the message each fire copies), ``cron`` or
``every_ms`` (exactly one per adding row), ``tz``, ``start_at_ms``, ``end_at_ms``,
``max_fires``, ``catch_up`` (null: ``"latest_once"``), ``catch_up_window_ms``.  A row with
neither ``cron`` nor ``every_ms`` removes the schedule of its key (its other columns may be
null).  Rows are checked as :meth:`Producer.schedule` checks its
arguments, all before the book changes; the book is then written once for the whole table.
Schedules are definitions, not messages: a table holds a few thousand of them at most, and
each row is read as Python values.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from ..base.errors import InvalidScheduleError
from ..formats.message import Message

COLUMNS = ("key", "topic", "body", "tags", "keys", "properties", "cron", "every_ms", "tz",
           "start_at_ms", "end_at_ms", "max_fires", "catch_up", "catch_up_window_ms")


@dataclass(frozen=True)
class ScheduleTableResult:
    """What :meth:`Producer.schedule_table` did: schedules added or replaced, rows that
    matched their schedule already (nothing changed), schedules removed."""

    changed: int
    unchanged: int
    removed: int


def schedule_rows(table: pa.Table, topic: str | None) -> tuple[list[dict], list[str]]:
    """``(adds, removes)``: each adding row as ``Producer.schedule``'s arguments plus its
    ``message``; each removing row's key.  :class:`InvalidScheduleError` names the first bad
    row and what is allowed."""
    names = table.column_names
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise InvalidScheduleError(f"unknown column(s) {unknown}; allowed: {', '.join(COLUMNS)}")
    if "key" not in names:
        raise InvalidScheduleError("no key column; allowed: a string column key naming each "
                                   "row's schedule")
    if topic is not None and "topic" in names:
        raise InvalidScheduleError("both a topic column and topic=... were given; give one")
    rows = table.to_pylist()
    adds, removes = [], []
    for i, row in enumerate(rows):
        key = row.get("key")
        if not isinstance(key, str) or not key:
            raise InvalidScheduleError(f"row {i}: key={key!r}; allowed: a non-empty str")
        if row.get("cron") is None and row.get("every_ms") is None:
            removes.append(key)
            continue
        body = row.get("body")
        if body is None:
            raise InvalidScheduleError(f"row {i} (schedule {key!r}): no body; allowed: the "
                                       "body each fire copies (or no cron and no every_ms, "
                                       "which removes the schedule)")
        if isinstance(body, str):
            body = body.encode("utf-8")
        if (row.get("topic") or topic) is None:
            raise InvalidScheduleError(f"row {i} (schedule {key!r}): no topic; allowed: a "
                                       "topic column or topic=...")
        props = row.get("properties")
        message = Message(row.get("topic") or topic, body, tags=row.get("tags"),
                          keys=row.get("keys"), properties=dict(props) if props else {})
        adds.append({"message": message, "key": key, "cron": row.get("cron"),
                     "every_ms": row.get("every_ms"), "tz": row.get("tz") or "UTC",
                     "start_at_ms": row.get("start_at_ms"), "end_at_ms": row.get("end_at_ms"),
                     "max_fires": row.get("max_fires"),
                     "catch_up": row.get("catch_up") or "latest_once",
                     "catch_up_window_ms": row.get("catch_up_window_ms")})
    return adds, removes
