"""Where a recovery starts, and where it may cut, as the checkpoint says (see
:mod:`store.core.recovery` for the scan itself).

Four cases, one function each:

* a clean open re-checks the last append (:func:`verify_tail`);
* a writer that died mid-append left its mark, ``write_in_progress``: its unconfirmed append
  is cut whole, when the mark is genuine (:func:`dead_append_bounds`);
* after a crash, the scan starts at ``flushed_phy_offset`` and, on the same boot, cuts a
  marked append (:func:`crash_limit`);
* a checkpoint rmq did not write limits nothing (:func:`recover_without_checkpoint`).

A checkpoint field may be damaged (a flipped bit): whenever two fields contradict each
other, recovery walks from a segment start and keeps every valid record, never cutting at
an offset only the damaged field vouches for.
"""

from __future__ import annotations

from typing import Sequence

from .ports import CoreParts, RecoveryListener
from .recovery import recover_tail


def _segment_start(store: CoreParts, offset: int) -> int:
    """Start of the CommitLog segment holding ``offset`` (clamped to the log's first byte):
    a segment starts with a record, so a walk from there needs no trusted offset."""
    log = store.commit_log
    low = max(offset, log.min_offset(), 0)
    return low - low % log.file_size


def dead_append_bounds(store: CoreParts, marker: int) -> tuple[int, int | None]:
    """``(start, limit)`` of the recovery after a writer died with ``write_in_progress`` set
    to ``marker`` (see :func:`recover_tail`).

    A writer marks an append with the log end it starts from, which is then the confirmed
    end, so a genuine marker equals ``confirm_phy_offset``: the append is cut there whole.
    Any other marker means one of the two fields is damaged (a flipped bit), and a confirmed
    end moved back must not cut acknowledged records: recovery then walks from the start
    of the segment holding the lower one and keeps every valid record.
    """
    confirm = store.checkpoint.get("confirm_phy_offset")
    if marker == confirm:
        return confirm, confirm
    return _segment_start(store, min(marker, confirm)), None


def crash_limit(store: CoreParts, same_boot: bool) -> int | None:
    """The ``limit`` of the recovery after a crash (see :func:`recover_tail`): on the same
    boot (an exact checkpoint), the confirmed end when an append was in progress and marked
    there; otherwise none, every valid record is kept (no append was in progress, so no
    record past the confirmed end can be unconfirmed, or a field is damaged)."""
    cp = store.checkpoint
    confirm = cp.get("confirm_phy_offset")
    return confirm if same_boot and cp.get("write_in_progress") == confirm else None


def verify_tail(store: CoreParts, listeners: Sequence[RecoveryListener] = ()) -> bool:
    """Re-check, on a clean open, the records the last append wrote; repair when damaged.

    RocketMQ's normal recovery re-validates the CommitLog tail even after a clean shutdown.
    Here only the last append (from ``last_append_offset`` to ``confirm_phy_offset``) is
    re-checked: it is what a writer touched last; when the two contradict each other (the
    last append beginning past the confirmed end: one of them is damaged), from the start
    of the segment holding the lower one.  Returns True when the tail had to be recovered
    (a damaged record, or valid records past the confirmed end).
    """
    cp = store.checkpoint
    log = store.commit_log
    confirm = cp.get("confirm_phy_offset")
    start = cp.get("last_append_offset")
    files = log.files.refresh()
    if not files:
        return False
    if start > confirm:
        # A clean store's last append begins at or before its confirmed end, so one of the
        # two is damaged (a flipped bit), and a confirmed end moved back hides every record
        # past it from readers, maybe off any record boundary, where a walk would stop at
        # once.  Neither bounds the check: walk from the start of the segment holding the
        # lower one (a segment starts with a record); recovery then keeps every valid record.
        start = _segment_start(store, confirm)
    elif start < 0:
        start = confirm
    if log.files.find(start, refresh=False) is None:
        # the append began with a blank in a segment retention has removed since
        start = min(start - start % log.file_size + log.file_size, confirm)
        if log.files.find(start, refresh=False) is None:
            return False
    for _ in log.scan_batches(start):  # runs of records: no Python step per record
        pass
    if log.scan_end == confirm:
        return False
    recover_tail(store, start, listeners=listeners)
    return True


def recover_without_checkpoint(store: CoreParts, listeners: Sequence[RecoveryListener] = ()
                               ) -> bool:
    """Recover a store whose checkpoint rmq did not write (or that is damaged or missing).

    Nothing in such a file may limit recovery: every CommitLog record is validated, every
    one that passes the checks is kept and re-dispatched, and a trusted checkpoint is
    written for the result (see :mod:`store.files.checkpoint`).  Returns whether there were
    records to recover.
    """
    cp = store.checkpoint
    had_records = bool(store.commit_log.files.refresh())
    end = recover_tail(store, store.commit_log.min_offset(), limit=None, listeners=listeners)
    cp.set("last_append_offset", end)  # nothing left for a clean open to re-check
    cp.mark_trusted()
    cp.flush()
    return had_records
