"""A former leader that follows: its tail the new leader's history does not hold is cut, and
set aside, never deleted.

When a follower first hears its leader's terms (``epochs``), it compares them with its own
epoch file (:func:`~store.files.epoch_file.divergence`, as Kafka's leader-epoch truncation
and RocketMQ 5's epoch comparison do).  When its log goes on past the offset where the
histories part (records it appended as a leader that no follower had copied when it lost the
lead: acknowledged only in asynchronous mode, or not acknowledged at all),
:func:`cut_diverged_tail`:

1. copies the bytes from that offset to its end into ``config/truncated/<epoch>-<offset>.bin``
   (``<epoch>``: its last term's, ``<offset>``: where the cut starts; the CommitLog's own
   bytes, segment blanks included) with a note beside it, ``<epoch>-<offset>.json``
   (``from``, ``to``, ``bytes``, ``records``, ``epoch``, ``leader``, ``cut_at_ms``), both
   synced before anything is cut; nothing ever deletes them;
2. cuts the log back through the store's recovery path
   (:meth:`~store.core.store_core.StoreCore.drop_tail`: the CommitLog and every ConsumeQueue
   truncated at the offset, the key index cut, the checkpoint moved back, the recovery
   listeners told);
3. sets the services' progress files aside (:func:`set_aside_service_progress`): they may
   name records past the cut; a leader rebuilds them from its log.

The follower then asks for the log from the cut, and holds exactly its leader's log.
"""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np

from ..files.epoch_file import divergence, read_epochs
from ..files.fileio import atomic_write, fsync_dir
from ..formats.record_codec import FIXED_SIZE
from ..kernels.segment_walk import walk_records
from ..schedule.schedule_book import recorded_book_files

log = logging.getLogger("store.replication")

TRUNCATED_DIR = os.path.join("config", "truncated")
#: The services' progress files a replica sets aside at a change of role: they are not
#: replicated, and a leader rebuilds them from its log (a lost file's path in each service).
PROGRESS_FILES = (os.path.join("config", "delayOffset.json"),
                  os.path.join("config", "delayOffset.json.bak"),
                  os.path.join("config", "timercheck"),
                  os.path.join("config", "transactionOffset.json"),
                  os.path.join("config", "transactionOffset.json.bak"),
                  # the delay-key table (store.timer.delay_keys): indexed to a timer-queue
                  # offset, which a cut or another leader's log gives other records
                  "timerkeys")
PROGRESS_ASIDE_DIR = os.path.join("config", "progress-aside")


def cut_diverged_tail(store, leader_terms, leader: str) -> dict | None:
    """Cut ``store``'s tail past where its history and ``leader_terms`` part (see the
    module docstring); returns the note of what was set aside, ``None`` when nothing was
    cut."""
    with store.write_lock():
        cut = divergence(read_epochs(store.root), leader_terms)
        end = store.confirmed_offset()
        if cut is None or cut >= end:
            return None
        mine = read_epochs(store.root)
        epoch = int(mine[-1][0]) if mine else 0
        data = _log_bytes(store, cut, end)
        base = os.path.join(store.root, TRUNCATED_DIR, f"{epoch}-{cut}")
        os.makedirs(os.path.dirname(base), exist_ok=True)
        note = {"from": cut, "to": end, "bytes": len(data), "records": _count(data, cut, store.commit_log.file_size),
                "epoch": epoch, "leader": leader, "cut_at_ms": int(time.time() * 1000)}
        atomic_write(base + ".bin", data)
        atomic_write(base + ".json", json.dumps(note, sort_keys=True).encode())
        fsync_dir(os.path.dirname(base))
        store.drop_tail(cut)
        set_aside_progress_of(store, f"a tail cut at {cut}")
    log.warning("cut this replica's CommitLog back from %d to %d, where its history and its "
                "leader %s's part: %d bytes (%d records) set aside in %s.bin", end, cut, leader,
                note["bytes"], note["records"], base)
    return note


def set_aside_progress_of(store, why: str) -> list[str]:
    """:func:`set_aside_service_progress` for an open store: with the recurring schedules'
    book once it was recorded in the log (taken from there again,
    :func:`~store.schedule.schedule_book.recorded_book_files`), whose parsed copy the store
    then forgets."""
    moved = set_aside_service_progress(store.root, why, recorded_book_files(store))
    store.recurring.forget()
    return moved


def set_aside_service_progress(root: str, why: str, more: tuple[str, ...] = ()) -> list[str]:
    """Move the services' progress files (:data:`PROGRESS_FILES`, and ``more``) into
    ``config/progress-aside/<ms>/``; each service, finding its file missing, rebuilds its
    progress from its queues with a mark, so that what its log shows delivered is not
    delivered again (see :mod:`store.delayed.delivery`).  Returns the files moved."""
    moved = []
    aside = os.path.join(root, PROGRESS_ASIDE_DIR, str(int(time.time() * 1000)))
    for name in PROGRESS_FILES + tuple(more):
        path = os.path.join(root, name)
        if os.path.exists(path):
            os.makedirs(aside, exist_ok=True)
            os.replace(path, os.path.join(aside, os.path.basename(name)))
            moved.append(name)
    if moved:
        with open(os.path.join(aside, "why"), "w", encoding="utf-8") as fh:
            fh.write(why + "\n")
        fsync_dir(os.path.join(root, "config"))
    return moved


def _log_bytes(store, start: int, end: int) -> bytes:
    """The CommitLog's bytes in ``[start, end)``, segments joined."""
    parts, at = [], start
    log_files = store.commit_log.files
    while at < end:
        f = log_files.find(at)
        if f is None:
            break
        stop = min(end, f.end)
        parts.append(bytes(f.buffer()[at - f.start:stop - f.start]))
        at = stop
    return b"".join(parts)


def _count(data: bytes, start: int, file_size: int) -> int:
    """Records in ``data`` (the log's bytes from offset ``start``), segment by segment."""
    raw = np.frombuffer(data, dtype=np.uint8)
    total, pos = 0, 0
    while pos < len(raw):
        limit = min(len(raw), pos + file_size - (start + pos) % file_size)
        found, _, _, _ = walk_records(raw, pos, limit, check_crc=False,
                                      max_records=(limit - pos) // FIXED_SIZE + 1)
        total += len(found)
        pos = limit
    return total
