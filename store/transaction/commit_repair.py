"""Commit records whose op message a reboot lost, and the op messages that repair them.

:meth:`~store.transaction.transaction_service.TransactionService.end_transactions` writes a commit record
and its op message in one append, so after a plain crash both are kept or both are dropped.
After a machine *reboot* recovery keeps every valid record past the last durable point
(:mod:`store.recovery`), so an append torn between the commit record and its op keeps the
commit, loses the op, and the op queue (the one source of truth of "ended") would show the
transaction open: a later commit or check would put a second copy in the real topic.

Only such a recovery (no limit at the confirmed offset) can keep part of an append, and only
among the records it scanned.  It notes the CommitLog offsets of the COMMIT-type records it
kept (it decodes every record anyway), *before* it moves the checkpoint, in::

    config/transactionRepair.json   {"commitOffsets": [<CommitLog offset>, ...]}

(JSON written atomically, merged with a note not yet repaired).  The transaction service of
the next process that opens the store repairs under the store's write lock: for each noted
record that is still a COMMIT record whose prepared offset holds a half of the same
transaction, and whose transaction the op queue does not show ended, it appends the missing
op message (naming the transaction's newest half offset, as ``end_transactions`` does),
flushes, then removes the note.  A crash before the removal repeats the repair, which then
finds every transaction ended: it is idempotent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..formats.record_codec import TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK
from ..core.ports import RecoveryScan, StorePort
from ..base.errors import StoreError
from ..files.fileio import read_json, write_json_atomic
from ..formats.message import TRANS_HALF_TOPIC
from .half import HALF_QUEUE_ID, transaction_id_of
from .transaction_index import TransactionIndex
from .op import op_specs

FILE_NAME = "transactionRepair.json"
KEY = "commitOffsets"


def repair_path(store: StorePort) -> str:
    """Where the note of kept commit records lives."""
    return os.path.join(store.root, "config", FILE_NAME)


def noted_offsets(store: StorePort) -> list[int]:
    """CommitLog offsets of the noted commit records (``[]`` when there is no note)."""
    data = read_json(repair_path(store))
    values = data.get(KEY, []) if isinstance(data, dict) else []
    if not isinstance(values, list):
        return []
    return sorted({v for v in values if isinstance(v, int) and v >= 0})


def note_kept_commits(store: StorePort, offsets: Iterable[int]) -> None:
    """Record (durably, merged with an earlier note) commit records recovery kept.

    Called (through :func:`note_kept_commits_after_recovery`) by recovery before it
    publishes the recovered end, so a crash right after still leaves the note.
    """
    new = {int(o) for o in offsets}
    if not new:
        return
    merged = sorted(new.union(noted_offsets(store)))
    os.makedirs(os.path.dirname(repair_path(store)), exist_ok=True)
    write_json_atomic(repair_path(store), {KEY: merged})


def note_kept_commits_after_recovery(store: StorePort, scan: RecoveryScan) -> None:
    """Recovery listener: note the COMMIT records a scan without a limit kept.

    Without a limit (after a reboot, or a damaged tail on a clean open) a torn append may be
    kept in part: a commit record without the op message that went with it.
    """
    if scan.limited:
        return
    commits = scan.offsets[(scan.sys_flags & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE]
    if len(commits):
        note_kept_commits(store, commits.tolist())


def register_transaction_recovery(port: StorePort) -> None:
    """Make the transaction repair known to the core's recovery (a recovery listener)."""
    port.add_recovery_listener(note_kept_commits_after_recovery)


def has_note(store: StorePort) -> bool:
    path = repair_path(store)
    return os.path.exists(path) or os.path.exists(path + ".bak")


def _remove_note(store: StorePort) -> None:
    path = repair_path(store)
    for name in (path, path + ".bak"):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def repair_noted_commits(store: StorePort, index: TransactionIndex) -> int:
    """Append the op messages the noted commit records lack; return how many transactions.

    The caller holds the store's write lock.  A noted offset is skipped when it no longer
    holds a COMMIT record (a later recovery cut it, retention removed it), when the record's
    prepared offset does not hold a half of the same transaction, or when the transaction
    has ended already.
    """
    offsets = noted_offsets(store)
    repaired = 0
    if offsets:
        index.refresh()
        confirmed = store.confirmed_offset()
        rows: list[int] = []
        halves: list[int] = []
        for offset in offsets:
            if offset >= confirmed:
                continue
            try:
                record = store.read_record(offset)
                if (record.sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_COMMIT_TYPE
                        or record.prepared_transaction_offset < 0):
                    continue
                tx = transaction_id_of(record)
                half = store.read_record(record.prepared_transaction_offset)
            except StoreError:
                continue
            if not tx or half.topic != TRANS_HALF_TOPIC or transaction_id_of(half) != tx:
                continue
            row = index.row_of(tx)
            if row < 0 or index.ended(row) or row in rows:
                continue
            rows.append(row)
            halves.append(int(index.latest_half_offsets(row)))
        if halves:
            store.append(op_specs(halves, store.now_ms(), HALF_QUEUE_ID), batch=True)
            index.mark_ended(rows)
            store.flush()  # the ops are durable before the note goes
            repaired = len(rows)
    _remove_note(store)
    return repaired


__all__ = ["FILE_NAME", "has_note", "note_kept_commits", "note_kept_commits_after_recovery",
           "noted_offsets", "register_transaction_recovery", "repair_noted_commits",
           "repair_path"]
