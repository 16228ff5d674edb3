"""Retention: delete CommitLog segments past ``file_reserved_time_hours`` and what pointed at them.

A segment may go when the first record of the *next* segment was stored at least the reserved
time ago (so every record of the segment is at least that old), and when no record the
services still need lies in it: the retention guards the services registered name the lowest
CommitLog offset they need (a delayed message not yet delivered, an open half message); a
segment reaching past that offset stays, however old, even with ``force``.  Deletion runs
from the oldest segment forward and stops at the first one that stays; the newest segment
always stays.  Then ConsumeQueue files (never a queue's last file) whose entries all point
below the new CommitLog minimum are deleted; queue minimum offsets follow from the CommitLog
minimum.  Last, the retention listeners the services registered are told the new CommitLog
minimum.

A replica set's follower deletes what its leader no longer keeps instead (``below``: the
leader's oldest CommitLog offset): every segment that ends at or below it goes, whatever its
age, as the leader's retention chose (its guards counted there, where the services run).
"""

from __future__ import annotations

import struct
from typing import Sequence

from ..formats.record_codec import FIELD_OFFSET, RecordCheck, check_record
from .ports import CoreParts, RetentionGuard, RetentionListener

_I64 = struct.Struct(">q")


def retention_floor(guards: Sequence[RetentionGuard]) -> int | None:
    """The lowest CommitLog offset any guard still needs (``None``: none needs anything)."""
    floors = [f for f in (guard() for guard in guards) if f is not None]
    return min(floors) if floors else None


def retention_plan(store: CoreParts, *, force: bool = False,
                   guards: Sequence[RetentionGuard] = (), below: int | None = None
                   ) -> list[dict]:
    """What retention would do now, oldest segment first, deleting nothing.

    One dict per segment: ``file``, ``start``, ``end``, ``newest_ms`` (store time of the
    next segment's first record: every record of this one is at most that new; ``None`` for
    the newest segment) and ``action``: ``"delete"``, or why it stays: ``"newest"``,
    ``"needed"`` (a pending delayed message or an open half message lies in it or before
    it), ``"young"`` (not yet ``file_reserved_time_hours`` old) or ``"after a kept
    segment"`` (deletion stops at the first segment that stays).  With ``below`` (a
    follower's plan): ``"kept by the leader"`` instead of the last three, for a segment
    ending past ``below``.
    """
    log = store.commit_log
    files = log.files.refresh()
    now = store.now_ms()
    reserved = store.config.file_reserved_time_ms
    floor = retention_floor(guards) if below is None else None
    plan, stopped = [], False
    for i, current in enumerate(files):
        nxt = files[i + 1] if i + 1 < len(files) else None
        newest = None
        if nxt is not None:
            buf = nxt.buffer()
            if check_record(buf, 0, nxt.size, check_crc=False) is not RecordCheck.INVALID:
                newest = _I64.unpack_from(buf, FIELD_OFFSET["store_timestamp"])[0]
        if stopped:
            action = "after a kept segment"
        elif nxt is None:
            action = "newest"
        elif below is not None:
            action = "delete" if current.end <= below else "kept by the leader"
        elif floor is not None and current.end > floor:
            action = "needed"
        elif not force and (newest is None or newest + reserved > now):
            action = "young"
        else:
            action = "delete"
        stopped = stopped or action != "delete"
        plan.append({"file": current.path, "start": current.start, "end": current.end,
                     "newest_ms": newest, "action": action})
    return plan


def delete_expired_segments(store: CoreParts, listeners: Sequence[RetentionListener] = (), *,
                            force: bool = False,
                            guards: Sequence[RetentionGuard] = (),
                            below: int | None = None) -> int:
    """Delete expired CommitLog segments (all but the newest when ``force``, and never one
    holding a record a guard needs; with ``below``, those ending at or below it); return
    how many.  See :func:`retention_plan`.

    The caller holds the write lock.
    """
    log = store.commit_log
    doomed = {p["start"] for p in retention_plan(store, force=force, guards=guards,
                                                 below=below)
              if p["action"] == "delete"}
    deleted = 0
    for f in list(log.files.files):
        if f.start in doomed:
            log.files.delete_file(f)
            deleted += 1
    if deleted:
        cl_min = log.min_offset()
        for topic, queue_id in store.all_consume_queues():
            store.consume_queue(topic, queue_id).delete_expired(cl_min)
        for listener in listeners:
            listener(cl_min)
    return deleted
