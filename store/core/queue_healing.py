"""A damaged ConsumeQueue found by a read is rebuilt from the CommitLog there and then.

The CommitLog is the truth; a queue is derived from it.  When a read meets an entry that does
not match its record (bits flipped inside a queue file, a zeroed range below its end), the
store compares the queue with the entries the CommitLog gives for it
(:func:`~store.core.recovery.scan_entries`, the walk recovery and ``rmq repair`` use):

* they differ: the queue file is what is damaged.  A writable store rebuilds that queue under
  its write lock: its files are set aside (renamed ``<name>.damaged-<n>`` by
  :func:`~store.files.fileio.move_aside`, never deleted), the entries are written anew, a
  warning names what was set aside.
  A read-only store (a Spark task, ``rmq stats``) writes nothing: it serves the entries the
  CommitLog gave from an in-memory :class:`RebuiltQueue` for as long as it is open, and the
  entries past them from the queue's files as they are then (reopened when a writable open
  replaced them): the writer goes on appending, and the reader must see the queue's end
  move (a copy of its own would freeze it there).  The read is then retried.
* they agree: the record is what is damaged (a header field outside the body CRC, a body
  failing its CRC); the read raises, or skips just that record with ``skip_corrupt``.

A queue is compared at most once per CommitLog end, so a damaged record read again and again
costs one scan, not one per read.  The scan reads the whole CommitLog (0.2-0.3 s per GiB on
the machine of docs/benchmarks.md): a repair, never a hot path.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import numpy as np

from ..files.consume_queue import ENTRY_DTYPE, ConsumeQueue
from ..files.fileio import move_aside
from .queue_dispatch import Dispatcher
from .recovery import scan_entries

log = logging.getLogger("store")

_NATIVE = ENTRY_DTYPE.newbyteorder("=")


def _files_stamp(directory: str) -> tuple:
    """What identifies the queue's segment files as they are (names and inodes)."""
    try:
        with os.scandir(directory) as it:
            return tuple(sorted((e.name, e.inode()) for e in it if e.name.isdigit()))
    except FileNotFoundError:
        return ()


class RebuiltQueue:
    """A queue's entries rebuilt in memory (the reading half of :class:`ConsumeQueue`); the
    entries past them are read from the queue's files (``reopen`` opens them as they are:
    reopened whenever their files change), so the queue's end keeps moving."""

    def __init__(self, topic: str, queue_id: int, directory: str, rows: np.ndarray,
                 reopen: Callable[[], ConsumeQueue] | None = None) -> None:
        self.topic, self.queue_id, self.directory = topic, queue_id, directory
        end = int(rows[:, 0].max()) + 1 if len(rows) else 0
        self._entries = np.zeros(end, dtype=_NATIVE)
        if len(rows):
            at = rows[:, 0]
            self._entries["offset"][at] = rows[:, 1]
            self._entries["size"][at] = rows[:, 2]
            self._entries["tags_code"][at] = rows[:, 3]
        self._reopen = reopen
        self._disk: ConsumeQueue | None = None
        self._disk_stamp: tuple | None = None

    def _on_disk(self) -> ConsumeQueue | None:
        """The queue's files as they are now (``None``: nothing to read past the rebuild)."""
        if self._reopen is None:
            return None
        stamp = _files_stamp(self.directory)
        if stamp != self._disk_stamp:  # (set aside and written anew by a writable open)
            if self._disk is not None:
                self._disk.close()
            self._disk, self._disk_stamp = self._reopen(), stamp
        return self._disk

    def max_offset(self, limit_phys: int | None = None) -> int:
        e = self._entries
        ok = e["size"] > 0
        if limit_phys is not None:
            ok &= e["offset"] + e["size"] <= limit_phys
        own = int(np.flatnonzero(ok)[-1]) + 1 if ok.any() else 0
        disk = self._on_disk()
        return max(own, disk.max_offset(limit_phys)) if disk is not None else own

    def first_index(self) -> int:
        return 0

    def min_offset(self, commitlog_min: int, limit_phys: int | None = None) -> int:
        maxo = self.max_offset(limit_phys)
        e = self._entries[:maxo]
        live = (e["size"] > 0) & (e["offset"] >= commitlog_min)
        # (none: the first entry past the rebuild, read from the files, is the first live)
        return int(np.argmax(live)) if live.any() else min(maxo, len(self._entries))

    def entries(self, start: int, end: int) -> np.ndarray:
        n = len(self._entries)
        head = self._entries[max(0, start):max(0, min(end, n))].copy()
        disk = self._on_disk() if end > n else None
        if disk is None:
            return head
        tail = disk.entries(max(start, n), end)
        return np.concatenate((head, tail)) if len(head) else tail

    def entry(self, index: int) -> tuple[int, int, int] | None:
        if index >= len(self._entries):
            disk = self._on_disk()
            return disk.entry(index) if disk is not None else None
        if index < 0:
            return None
        e = self._entries[index]
        return int(e["offset"]), int(e["size"]), int(e["tags_code"])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._disk is not None:
            self._disk.close()
            self._disk = None


class _ReaderParts:
    """What :func:`scan_entries` needs of a read-only store: its files, and a dispatcher with
    no service rules (a reader runs no services; user topics' tagsCodes are their tags')."""

    def __init__(self, store) -> None:
        self.commit_log, self.topic_table = store.commit_log, store.topic_table
        self.dispatcher = Dispatcher(store.consume_queue)


def rows_from_log(store, topic: str, queue_id: int) -> np.ndarray:
    """The entries the CommitLog gives for one queue: rows of ``(queue offset, CommitLog
    offset, size, tagsCode)``."""
    parts = _ReaderParts(store) if store.read_only else store
    confirmed = store.confirmed_offset()
    found = scan_entries(parts, store.commit_log.min_offset(), limit=confirmed,
                         resync_until=confirmed)
    return found.rows.get((topic, queue_id), np.empty((0, 4), dtype=np.int64))


def heal_queue(store, topic: str, queue_id: int, healed: dict) -> bool:
    """Compare queue ``(topic, queue_id)`` with the CommitLog and, when the queue is what is
    damaged, rebuild it (see the module doc).  ``healed``: the store's record of queues
    compared, by CommitLog end.  Returns whether the queue was rebuilt (retry the read)."""
    key = (topic, queue_id)
    end = store.confirmed_offset()
    if healed.get(key) == end:
        return False
    healed[key] = end
    rows = rows_from_log(store, topic, queue_id)
    current = store.consume_queue(topic, queue_id)
    rebuilt = RebuiltQueue(topic, queue_id, current.directory, rows)
    n = rebuilt.max_offset(end)
    have = current.entries(0, n)
    want = rebuilt.entries(0, n)
    live = want["size"] > 0
    if len(have) == n and np.array_equal(have[live], want[live]):
        return False  # the queue says what the CommitLog says: the record is damaged
    if store.read_only:
        rebuilt = RebuiltQueue(topic, queue_id, current.directory, rows, lambda: ConsumeQueue(
            os.path.join(store.root, "consumequeue"), topic, queue_id,
            store.config.consume_queue_file_entries, read_only=True))
        log.warning("the ConsumeQueue of %s/%d does not match the CommitLog (damaged): "
                    "served from an in-memory rebuild (a writable open repairs the file)",
                    topic, queue_id)
        store._queues[key] = rebuilt
        return True
    with store.write_lock():
        set_aside = _set_aside(current)
        del store._queues[key]  # the next lookup opens the queue afresh
        store.dispatcher.forget(key)
        queue = store.consume_queue(topic, queue_id)
        if len(rows):
            order = np.argsort(rows[:, 0], kind="stable")
            store.dispatcher.dispatch_rows({key: rows[order]})
        queue.flush()
        store.appender.queue_next.pop(key, None)
    log.warning("the ConsumeQueue of %s/%d did not match the CommitLog (damaged): rebuilt "
                "from it (%d entries); the damaged file(s) set aside: %s", topic, queue_id,
                len(rows), ", ".join(set_aside) or "none")
    return True


def _set_aside(queue: ConsumeQueue) -> list[str]:
    """Move the queue's files aside (never deleted) after closing it; their new names."""
    queue.close()
    return [move_aside(os.path.join(queue.directory, name))
            for name in sorted(os.listdir(queue.directory)) if name.isdigit()]
