"""The message-key index of a store: RocketMQ's IndexService over the ``index/`` files.

The index is derived from the CommitLog like the ConsumeQueues.  The dispatcher hands it the
CommitLog range every append wrote (:meth:`KeyIndex.index_range`); the compiled walk of
:mod:`store.kernels.key_walk` reads each record's ``UNIQ_KEY`` and ``KEYS`` and their
keyHashes, and :meth:`~store.files.index_file.IndexFile.put` chains the whole batch into
the newest file with NumPy (a new file, named by the time, when it fills).

At a writable open (:meth:`KeyIndex.open_check`): a file that cannot be this index's (a wrong
size for the configured slots and entries, a header no writer leaves) is set aside
(``<name>.damaged-<n>``) with the rest of the index, which is rebuilt from the CommitLog;
after a crash, or when recovery cut the log, the files holding entries at or past the log end
are rechained without them; then whatever the log holds past the index's last record is
indexed (a crash between an append and its index, or an index turned on late).  A
RocketMQ-written store's files are used as they are, and appended to while they have room.

Lookups (:meth:`KeyIndex.lookup`) read the files newest first, as RocketMQ does, and work on
a read-only store too (the files mapped read-only; a damaged one is skipped).
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from ..base.config import StoreConfig
from ..base.errors import DiskFullError
from ..files.commit_log import CommitLog
from ..files.fileio import move_aside
from ..files.index_file import (
    IndexFile,
    file_name,
    is_index_name,
    java_hash_continue,
    java_hash_text,
    key_hash_of_unsigned,
)
from ..kernels.key_walk import MAX_ROWS_PER_RECORD, record_keys

log = logging.getLogger("store.core.key_index")

#: Rows of key hashes one walk of the CommitLog gathers before they go into the files.
_ROWS = 1 << 16


def record_key_hashes(topic: str, properties: bytes) -> list[int]:
    """The keyHashes a record of ``topic`` with these encoded properties is indexed under,
    in the kernel's order (:mod:`store.kernels.key_walk`): ``UNIQ_KEY``, then each
    non-empty part of ``KEYS`` (the last non-empty value of each name counts)."""
    uniq = keys = b""
    for pair in properties.split(b"\x02"):
        name, sep, value = pair.partition(b"\x01")
        if sep and value:
            if name == b"UNIQ_KEY":
                uniq = value
            elif name == b"KEYS":
                keys = value
    prefix = _PREFIX_HASHES.get(topic)
    if prefix is None:
        prefix = java_hash_continue(0, topic + "#")
        if len(_PREFIX_HASHES) < 4096:
            _PREFIX_HASHES[topic] = prefix
    hashes = [key_hash_of_unsigned(java_hash_continue(prefix, uniq.decode("utf-8", "replace")))
              ] if uniq else []
    for part in keys.split(b" ") if keys else ():
        if part:
            hashes.append(key_hash_of_unsigned(
                java_hash_continue(prefix, part.decode("utf-8", "replace"))))
    return hashes


#: ``topic -> hash state of "topic#"`` (bounded)
_PREFIX_HASHES: dict[str, int] = {}


class KeyIndex:
    """The ``index/`` directory of one open store (see the module docstring).

    Parameters
    ----------
    root : str
        The store directory.
    config : StoreConfig
        ``message_index_enable``, ``max_hash_slot_num``, ``max_index_num``.
    commit_log : CommitLog
        The records indexed.
    read_only : bool
        Only look up (a :class:`~store.StoreReader`).
    """

    def __init__(self, root: str, config: StoreConfig, commit_log: CommitLog, *,
                 read_only: bool) -> None:
        self.directory = os.path.join(root, "index")
        self.slot_count = config.max_hash_slot_num
        self.entry_count = config.max_index_num
        #: whether appends are indexed (``message_index_enable`` on a writable store)
        self.enabled = bool(config.message_index_enable) and not read_only
        self.read_only = read_only
        self.commit_log = commit_log
        self._files: dict[str, IndexFile] = {}
        self._order: list[str] = []  # names, oldest first
        self._listed = -1.0
        self._current: IndexFile | None = None
        self._rows = np.empty((3, max(_ROWS, 2 * MAX_ROWS_PER_RECORD)), dtype=np.int64)

    # -- the files -----------------------------------------------------------------------------
    def _refresh(self, force: bool = False) -> list[IndexFile]:
        """The usable files, oldest first (the directory listed again when it changed)."""
        try:
            stamp = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            stamp = 0
        if force or stamp != self._listed:
            self._listed = stamp
            names = sorted(n for n in (os.listdir(self.directory) if stamp else ())
                           if is_index_name(n))
            for gone in set(self._files) - set(names):
                self._files.pop(gone).close()
                self._current = None
            for name in names:
                if name not in self._files:
                    self._files[name] = IndexFile(os.path.join(self.directory, name),
                                                  self.slot_count, self.entry_count,
                                                  read_only=self.read_only)
            self._order = names
        for name in self._order:
            if self._files[name].actual_size != self._files[name].size:
                # a file another process is creating (not yet sized), or of the wrong size
                self._files[name].close()
                self._files[name] = IndexFile(os.path.join(self.directory, name),
                                              self.slot_count, self.entry_count,
                                              read_only=self.read_only)
        return [f for n in self._order if (f := self._files[n]).problem() is None]

    def _new_file(self) -> IndexFile:
        os.makedirs(self.directory, exist_ok=True)
        now = int(time.time() * 1000)
        last = self._order[-1] if self._order else ""
        while (name := file_name(now)) <= last or os.path.exists(
                os.path.join(self.directory, name)):
            now += 1  # names must grow: a lookup reads the newest first
        f = IndexFile(os.path.join(self.directory, name), self.slot_count, self.entry_count,
                      create=True)
        self._files[name] = f
        self._order.append(name)
        return f

    def _writable_newest(self) -> IndexFile:
        """The file appends go to: kept between appends (other writers only ever start a
        new file when this one is full, so the directory is listed again only then)."""
        current = self._current
        if current is not None and current._mm is not None and not current.is_full():
            return current
        files = self._refresh()
        if files and not files[-1].is_full() and files[-1].name == self._order[-1]:
            current = files[-1]
        else:
            current = self._new_file()
        self._current = current
        return current

    # -- writing -------------------------------------------------------------------------------
    def index_range(self, begin: int, end: int) -> None:
        """Index the records of the CommitLog from ``begin`` (a record's start) to ``end``;
        records at or below the index's last one are skipped (so indexing again is harmless).
        Stops at an invalid record (recovery decides about those)."""
        if not self.enabled or end <= begin:
            return
        try:
            self._index_range(begin, end)
        except DiskFullError as exc:
            # the records are written: a send must not fail for its index.  This process
            # stops indexing; the next writable open indexes what the index misses.
            log.warning("the message-key index stops in this process: %s", exc)
            self.enabled = False

    def _index_range(self, begin: int, end: int) -> None:
        newest = self._writable_newest()
        skip = newest.end_phy_offset
        if skip < 0 and len(self._order) > 1:
            older = self._files[self._order[-2]]
            skip = older.end_phy_offset
        offset = begin
        while offset < end:
            segment = self.commit_log.files.find(offset)
            if segment is None:
                return
            buf = np.frombuffer(segment.buffer(), dtype=np.uint8)
            pos, limit = offset - segment.start, min(end, segment.end) - segment.start
            while True:
                rows, pos, stop = record_keys(buf, pos, limit, self._rows)
                if rows.shape[1]:
                    phys = rows[1] + segment.start
                    keep = phys > skip
                    if not keep.all():
                        rows, phys = rows[:, keep], phys[keep]
                    self._put(rows[0], phys, rows[2])
                if stop != 2 or pos >= limit:
                    break
            if stop == 0:
                return
            offset = segment.end

    def index_one(self, topic: str, properties: bytes, offset: int, store_timestamp_ms: int
                  ) -> None:
        """Index one plain record just written at ``offset`` (a single send's way: its
        properties parsed and its keys hashed in Python, a few ``struct`` writes; the same
        entries :meth:`index_range` makes)."""
        if not self.enabled:
            return
        hashes = record_key_hashes(topic, properties)
        if not hashes:
            return
        try:
            newest = self._writable_newest()
            if offset > newest.end_phy_offset:
                self._put(hashes, [offset] * len(hashes), [store_timestamp_ms] * len(hashes))
        except DiskFullError as exc:
            log.warning("the message-key index stops in this process: %s", exc)
            self.enabled = False

    def _put(self, hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
        done = 0
        while done < len(hashes):
            done += self._writable_newest().put(hashes[done:], phys[done:], stamps[done:])

    def open_check(self, log_end: int, *, crashed: bool) -> None:
        """The writable open's steps (see the module docstring): set a damaged index aside
        and rebuild it, drop entries past ``log_end`` (``crashed``: rechain the newest file
        whatever its end, a torn write may have left slot heads behind), index what the log
        holds past the index."""
        if self.read_only:
            return
        self._refresh(force=True)
        damaged = [(n, p) for n in self._order if (p := self._files[n].problem()) is not None]
        if damaged:
            for name, problem in damaged:
                log.warning("index file %s is damaged (%s): the index is set aside and "
                            "rebuilt from the CommitLog", self._files[name].path, problem)
            self.set_aside()
        self.cut(log_end, rechain_newest=crashed)
        if self.enabled:
            self.catch_up(log_end)

    def set_aside(self) -> list[str]:
        """Move every index file aside (``<name>.damaged-<n>``, never deleted); returns the
        new names.  The index starts again empty (:meth:`catch_up` rebuilds it)."""
        moved = []
        for name in list(self._order):
            f = self._files.pop(name)
            f.close()
            moved.append(move_aside(f.path))
        self._order = []
        self._current = None
        self._refresh(force=True)
        return moved

    def cut(self, log_end: int, *, rechain_newest: bool = False) -> int:
        """Drop the entries whose record starts at or past ``log_end`` (a cut tail);
        ``rechain_newest``: rebuild the newest file's chains even when none is dropped.
        Returns the entries dropped."""
        dropped = 0
        files = self._refresh()
        for i, f in enumerate(files):
            if f.end_phy_offset >= log_end or (rechain_newest and i == len(files) - 1):
                dropped += f.rechain(log_end)
        return dropped

    def catch_up(self, log_end: int) -> None:
        """Index the records between the index's last one and ``log_end``."""
        files = self._refresh()
        ends = [f.end_phy_offset for f in files if f.end_phy_offset >= 0]
        start = max(ends[-1] if ends else 0, self.commit_log.min_offset())
        if start < log_end:
            self.index_range(start, log_end)

    # -- reading -------------------------------------------------------------------------------
    def lookup(self, topic: str, key: str, max_results: int, begin_ms: int = 0,
               end_ms: int = (1 << 63) - 1) -> list[int]:
        """CommitLog offsets of the records indexed under ``topic#key`` (newest files first,
        at most ``max_results``), stored in ``[begin_ms, end_ms]``.  A 32-bit hash collision
        can add another key's record: callers check the records."""
        key_hash = java_hash_text(f"{topic}#{key}")
        found: list[int] = []
        for f in reversed(self._refresh()):
            if len(found) >= max_results:
                break
            if f.overlaps(begin_ms, end_ms):
                found.extend(f.lookup(key_hash, max_results - len(found), begin_ms, end_ms))
        return found

    def has_files(self) -> bool:
        """Whether the store has index files (written by rmq or RocketMQ)."""
        return bool(self._refresh())

    def flush(self) -> None:
        for f in list(self._files.values()):
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self._order = []
        self._current = None
