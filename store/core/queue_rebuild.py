"""Rebuilding the derived files from the CommitLog: ``rmq repair`` / ``store.rebuild_queues()``.

The CommitLog is the only truth; every ConsumeQueue and the topic table are derived from it.
A queue file that was deleted, truncated, zeroed or overwritten hides messages the CommitLog
still holds, and RocketMQ's answer is the same as ours: rebuild it.  The rebuild:

1. sets aside every ConsumeQueue file whose length is not the configured one (it cannot be
   mapped as a queue file): renamed to ``<name>.damaged-<n>`` (the first free ``n``, so a
   second repair never overwrites what a first one set aside), never deleted;
2. zeroes every remaining queue file (files are zeroed, not deleted: a reader in another
   process may have one mapped);
3. scans the whole CommitLog from its first segment, validating every record (magic, size,
   CRC) as recovery does, and writes the queue entry of every indexed record at the queue
   offset its header records; damage before the confirmed end is skipped (the scan goes on
   at the next valid record), the scan stops at the torn tail, and nothing is cut (a repair
   never removes a record: recovery at the next crash open decides);
4. raises the queue count of every topic to cover the queues its records name (the topic
   table may have been lost).

The caller holds the write lock.  Progress files of the services (delivery, check loop)
hold queue offsets, which the rebuild keeps exactly as the records' headers say.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..files.consume_queue import ENTRY_SIZE
from ..files.fileio import move_aside
from ..files.mapped_file import zero_tail
from .ports import CoreParts
from .recovery import scan_entries


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """What :func:`rebuild_queues` did."""

    records: int           # records scanned (valid)
    entries: int           # queue entries written
    queues: int            # queues rebuilt
    set_aside: tuple[str, ...]  # where damaged queue files went (<name>.damaged-<n>)
    topics_widened: tuple[str, ...]
    end_offset: int        # where the valid log ends
    stopped_early: bool    # an invalid record before the confirmed end (left in place)


def rebuild_queues(store: CoreParts, progress=None) -> RebuildResult:
    """Rebuild every ConsumeQueue (and widen the topic table) from the CommitLog;
    ``progress(bytes scanned, bytes to scan)`` after each run of records, when given."""
    root = os.path.join(store.root, "consumequeue")
    file_bytes = store.config.consume_queue_file_entries * ENTRY_SIZE
    set_aside = []
    for topic, queue_id in store.all_consume_queues():
        qdir = os.path.join(root, topic, str(queue_id))
        for name in sorted(os.listdir(qdir)):
            path = os.path.join(qdir, name)
            if name.isdigit() and os.path.getsize(path) != file_bytes:
                moved = move_aside(path)
                set_aside.append(os.path.relpath(moved, store.root))
    queues = store.all_consume_queues()
    for topic, queue_id in queues:
        q = store.consume_queue(topic, queue_id)
        for f in q.files.refresh():
            zero_tail(f, 0)  # every entry of every file, whatever it held
    log = store.commit_log
    log.files.refresh()
    first = log.min_offset()
    last = max(first, log.files.files[-1].end if log.files.files else first)
    found = scan_entries(store, first, resync_until=store.checkpoint.get("confirm_phy_offset"),
                         progress=None if progress is None
                         else lambda at: progress(at - first, last - first))
    rows = found.rows
    records = len(found.offsets)
    entries = sum(len(r) for r in rows.values())
    end = log.scan_end if records else log.min_offset()
    counts: dict[str, int] = {}
    for topic, queue_id in rows:
        counts[topic] = max(counts.get(topic, 0), queue_id + 1)
    for topic, count in counts.items():
        if store.topic_table.queue_count(topic) is None:
            store.ensure_topic(topic)
    widened = store.topic_table.widen(counts, store.now_ms())
    store.dispatcher.dispatch_rows(rows)
    for q in list(rows):
        store.consume_queue(*q).flush()
    store.appender.queue_next.clear()
    confirmed = store.checkpoint.get("confirm_phy_offset")
    return RebuildResult(records=records, entries=entries,
                         queues=len(set(rows) | set(queues)), set_aside=tuple(set_aside),
                         topics_widened=tuple(widened), end_offset=end,
                         stopped_early=end < confirmed)


__all__ = ["RebuildResult", "rebuild_queues"]
