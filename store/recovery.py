"""Recovery: make the CommitLog tail and the ConsumeQueues agree after a crash.

When it runs:

* at open, when this process is the only one with the store open and the ``abort`` marker is
  still there (the last process did not close cleanly): scan from ``flushed_phy_offset``;
* whenever a writer takes the append lock and finds ``write_in_progress`` set (a writer died
  mid-append, in this or another process): scan from ``confirm_phy_offset``.

The scan validates every record (magic, recomputed length, body CRC), re-dispatches the valid
ones (idempotent: entry ``n`` of a queue is rewritten with the same bytes), stops at the first
invalid record, zeroes the CommitLog from there and cuts every ConsumeQueue entry that points
at or past it.  A clean close does not rescan anything.

A scan without a limit (after a reboot, or on a clean open) may keep part of an append; the
transaction commit records it keeps are noted for :mod:`store.transaction.repair`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .codec import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK

if TYPE_CHECKING:  # pragma: no cover
    from .message_store import MessageStore


def recover_tail(store: "MessageStore", start_offset: int, *, limit: int | None = None) -> int:
    """Rescan the CommitLog from ``start_offset``; return the offset where the valid log ends.

    ``limit``: where an append that never completed began (``write_in_progress``); the log
    is cut there even if some of that append's records are whole, so an unacknowledged
    batch is dropped entirely rather than half kept.
    """
    log = store.commit_log
    log.files.refresh()
    start = max(start_offset, log.min_offset(), 0)
    if log.files.find(start) is None and start > log.min_offset():
        # the start lies in a segment that no longer (or never) existed: nothing to rescan
        start = max(log.min_offset(), min(start, _log_end_guess(store)))
    pending: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
    last_ts = None
    cut = None
    commits: list[int] = []  # COMMIT records kept (transaction end records)
    for offset, _size in log.scan(start):
        if limit is not None and offset >= limit:
            cut = limit
            break
        rec = log.read_record(offset)
        tx_type = rec.sys_flag & TRANSACTION_TYPE_MASK
        if tx_type in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            code = store._tags_code(rec.topic, rec.properties, rec.store_timestamp_ms)
            pending.setdefault((rec.topic, rec.queue_id), []).append(
                (rec.queue_offset, offset, rec.total_size, code))
            if store.topic_table.queue_count(rec.topic) is None:
                store._ensure_topic(rec.topic)
            if tx_type == TRANSACTION_COMMIT_TYPE:
                commits.append(offset)
        last_ts = rec.store_timestamp_ms
    if limit is None and commits:
        # Without a limit a torn append may be kept in part: a commit record without the op
        # message that went with it.  Note them (durably, before the checkpoint moves) for
        # the transaction service to repair.
        from .transaction.repair import note_kept_commits

        note_kept_commits(store, commits)
    end = log.scan_end if log.files.files else 0
    if cut is not None or (limit is not None and end > limit >= start):
        end = max(start, limit)
    for key, rows in pending.items():
        arr = np.array(rows, dtype=np.int64)
        # records of one queue carry consecutive queue offsets; write runs of them
        breaks = np.flatnonzero(np.diff(arr[:, 0]) != 1) + 1
        for chunk in np.split(arr, breaks):
            store.consume_queue(*key).put(int(chunk[0, 0]), chunk[:, 1], chunk[:, 2], chunk[:, 3])
    log.truncate(end)
    for topic, queue_id in store.all_consume_queues():
        store.consume_queue(topic, queue_id).truncate_physical(end)
    cp = store.checkpoint
    cp.set("confirm_phy_offset", end)
    if cp.get("last_append_offset") > end:
        cp.set("last_append_offset", start)
    if cp.get("flushed_phy_offset") > end:
        cp.set("flushed_phy_offset", end)
    if last_ts is not None:
        cp.set("physic_msg_timestamp", last_ts)
    cp.set("write_generation", cp.get("write_generation") + 1)
    cp.set("write_in_progress", -1)
    cp.flush()
    store._queue_next.clear()
    return end


def verify_tail(store: "MessageStore") -> bool:
    """Re-check, on a clean open, the records the last append wrote; repair when damaged.

    RocketMQ's normal recovery re-validates the CommitLog tail even after a clean shutdown.
    Here only the last append (from ``last_append_offset`` to ``confirm_phy_offset``) is
    re-checked: it is what a writer touched last.  Returns True when the tail had to be
    recovered (a damaged record, or valid records past the confirmed end).
    """
    cp = store.checkpoint
    log = store.commit_log
    confirm = cp.get("confirm_phy_offset")
    start = cp.get("last_append_offset")
    files = log.files.refresh()
    if not files:
        return False
    if not 0 <= start <= confirm:
        start = confirm
    if log.files.find(start, refresh=False) is None:
        # the append began with a blank in a segment retention has removed since
        start = min(start - start % log.file_size + log.file_size, confirm)
        if log.files.find(start, refresh=False) is None:
            return False
    for _ in log.scan(start):
        pass
    if log.scan_end == confirm:
        return False
    recover_tail(store, start)
    return True


def _log_end_guess(store: "MessageStore") -> int:
    last = store.commit_log.files.last_file()
    return last.start if last is not None else 0
