"""Retention: delete CommitLog segments past ``file_reserved_time_hours`` and what pointed at them.

A segment may go when the first record of the *next* segment was stored at least the reserved
time ago (so every record of the segment is at least that old).  Deletion runs from the oldest
segment forward and stops at the first one that stays; the newest segment always stays.  Then
ConsumeQueue files (never a queue's last file) whose entries all point below the new CommitLog
minimum are deleted; queue minimum offsets follow from the CommitLog minimum.  Last, the
retention listeners the services registered are told the new CommitLog minimum.
"""

from __future__ import annotations

import struct
from typing import Sequence

from ..codec import FIELD_OFFSET, RecordCheck, check_record
from .ports import CoreParts, RetentionListener

_I64 = struct.Struct(">q")


def delete_expired_segments(store: CoreParts, listeners: Sequence[RetentionListener] = (), *,
                            force: bool = False) -> int:
    """Delete expired CommitLog segments (all but the newest when ``force``); return how many.

    The caller holds the write lock.
    """
    deleted = 0
    log = store.commit_log
    files = log.files.refresh()
    now = store.now_ms()
    reserved = store.config.file_reserved_time_ms
    for current, nxt in zip(files, files[1:]):
        if not force:
            buf = nxt.buffer()
            if check_record(buf, 0, nxt.size, check_crc=False) in (RecordCheck.INVALID,):
                break
            first_ts = _I64.unpack_from(buf, FIELD_OFFSET["store_timestamp"])[0]
            if first_ts + reserved > now:
                break
        log.files.delete_file(current)
        deleted += 1
    if deleted:
        cl_min = log.min_offset()
        for topic, queue_id in store.all_consume_queues():
            store.consume_queue(topic, queue_id).delete_expired(cl_min)
        for listener in listeners:
            listener(cl_min)
    return deleted
