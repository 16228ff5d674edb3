"""The message-key index of a store: RocketMQ's IndexService over the ``index/`` files.

The index is derived from the CommitLog like the ConsumeQueues, but behind the sends rather
than inside them (RocketMQ feeds its IndexService from the reput thread, not the put path):
an append writes its records and their ConsumeQueue entries and returns; the key index
catches up in batches.  :meth:`KeyIndex.build` indexes the records between the persisted
``index_phy_offset`` of the checkpoint (everything below it is indexed) and the confirmed
CommitLog end, then moves that offset.  The compiled walk of
:mod:`store.kernels.key_walk` reads each record's ``UNIQ_KEY`` and ``KEYS`` and their
keyHashes, and :meth:`~store.files.index_file.IndexFile.put` chains the whole batch into
the newest file with NumPy (a new file, named by the time, when it fills).

Who builds: every writing process runs a :class:`KeyIndexService` thread that calls
:meth:`KeyIndex.build` every 20 ms; a build holds this process's build lock and
an exclusive ``flock`` on the store's ``index.lock``, so one process at a time indexes, and
it indexes every process's appends.  Nothing is indexed twice or skipped: the start is read
under the lock, and records at or below the newest file's last entry are skipped (a builder
that died after writing entries but before moving ``index_phy_offset``).  A clean close
builds to the end.

At a writable open (:meth:`KeyIndex.open_check`): a file that cannot be this index's (a wrong
size for the configured slots and entries, a header no writer leaves) is set aside
(``<name>.damaged-<n>``) with the rest of the index, which is rebuilt from the CommitLog;
after a crash, or when recovery cut the log, the files holding entries at or past the log end
are rechained without them and ``index_phy_offset`` is brought back to the index's last
record; then whatever the log holds past it is indexed (a crash between an append and its
index, or an index turned on late).  A RocketMQ-written store's files are used as they are,
and appended to while they have room.

Lookups (:meth:`KeyIndex.lookup`) read the files newest first, as RocketMQ does, and work on
a read-only store too (the files mapped read-only; a damaged one is skipped).  A query must
also see what was acknowledged but is not indexed yet: :meth:`KeyIndex.find` adds the
records of the not yet indexed tail (``index_phy_offset`` to the confirmed end), walked by
the same kernel in the querying process without writing anything.  So a query never waits
for the builder (which may be another process, or none: a reader of a store whose writers
stopped), and the tail it walks is what the builder has not reached, some tens of ms of
sends while a writer runs.

Retention (:meth:`KeyIndex.delete_expired`): a file, the newest excepted, whose last entry
lies below the oldest CommitLog segment kept is deleted with the segments.  ``rmq repair``
(:meth:`KeyIndex.rebuild`) checks every file's header, slots and entries
(:meth:`~store.files.index_file.IndexFile.verify`) and rebuilds the whole index from the
CommitLog when one fails or the index is missing.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ..base.config import StoreConfig
from ..base.errors import DiskFullError
from ..files.checkpoint import StoreCheckpoint
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
from .key_index_check import DamageVerdicts, file_problem, trusted_and_gaps

log = logging.getLogger("store.core.key_index")

#: Rows of key hashes one walk of the CommitLog gathers before they go into the files.
_ROWS = 1 << 16
#: The builder thread looks for new records this often (RocketMQ's reput thread: 1 ms; a pass
#: here has a fixed cost of a few hundred µs of Python, so a few passes a second less).
BUILD_INTERVAL_S = 0.02
#: CommitLog bytes one pass of the builder thread indexes at most (then the locks are let go).
BUILD_STEP_BYTES = 64 << 20
#: The lock file of the builders (in the store directory).
LOCK_FILE = "index.lock"


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
    checkpoint : StoreCheckpoint
        Where ``index_phy_offset`` is kept (shared by every process).
    read_only : bool
        Only look up (a :class:`~store.StoreReader`).
    """

    def __init__(self, root: str, config: StoreConfig, commit_log: CommitLog,
                 checkpoint: StoreCheckpoint, *, read_only: bool) -> None:
        self.root = root
        self.directory = os.path.join(root, "index")
        self.slot_count = config.max_hash_slot_num
        self.entry_count = config.max_index_num
        #: whether appends are indexed (``message_index_enable`` on a writable store)
        self.enabled = bool(config.message_index_enable) and not read_only
        #: whether the store keeps an index (``message_index_enable``), read-only or not: a
        #: reader then finds what the writer's builder has not reached yet by the tail walk
        self.configured = bool(config.message_index_enable)
        self.read_only = read_only
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self._files: dict[str, IndexFile] = {}
        self._order: list[str] = []  # names, oldest first
        self._listed = -1.0
        self._current: IndexFile | None = None
        self._rows = np.empty((3, max(_ROWS, 2 * MAX_ROWS_PER_RECORD)), dtype=np.int64)
        #: one builder per process at a time (the ``flock`` serialises processes)
        self._thread_lock = threading.Lock()
        self._holder: int | None = None  # the thread holding it
        #: the files found damaged, each verdict kept for the file's identity
        self._verdicts = DamageVerdicts()
        self._lock_fd: int | None = None
        #: ``() -> str | None``: what happened to the store directory since this process
        #: opened it (removed, replaced), set by the writing core; a builder writes nothing
        #: into whatever is at the path then (index files and ``index.lock`` go by path)
        self.identity_problem: Callable[[], str | None] | None = None

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
            f = self._files[name]
            if f.actual_size != f.size and not self._verdicts.settled(f.path):
                # a file another process is creating (not yet sized), or of the wrong size
                self._reopen(name)
        return [f for n in self._order if (f := self._files[n]).problem() is None]

    def _reopen(self, name: str) -> IndexFile:
        self._files[name].close()
        if self._current is self._files[name]:
            self._current = None
        f = self._files[name] = IndexFile(os.path.join(self.directory, name), self.slot_count,
                                          self.entry_count, read_only=self.read_only)
        return f

    def _new_file(self) -> IndexFile:
        os.makedirs(self.directory, exist_ok=True)
        now = int(time.time() * 1000)
        last = self._order[-1] if self._order else ""
        while (name := file_name(now)) <= last or os.path.exists(
                os.path.join(self.directory, name)):
            now += 1  # names must grow: a lookup reads the newest first
        f = IndexFile(os.path.join(self.directory, name), self.slot_count, self.entry_count,
                      create=True)
        f.chain_problem = None  # this process's own: nothing to check
        self._files[name] = f
        self._order.append(name)
        return f

    def _writable_newest(self) -> IndexFile:
        """The file entries go to: kept between builds (another process's builder only ever
        starts a new file when this one is full, so the directory is listed again only
        then)."""
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

    def _last_entry(self) -> int:
        """CommitLog offset of the newest entry's record (-1: no entry)."""
        files = self._refresh()
        ends = [f.end_phy_offset for f in files if f.end_phy_offset >= 0]
        return ends[-1] if ends else -1

    # -- progress and the builders' lock -------------------------------------------------------
    def indexed_to(self) -> int:
        """Every record below this CommitLog offset is indexed (``index_phy_offset``)."""
        return self.checkpoint.get("index_phy_offset")

    def _set_indexed_to(self, offset: int) -> None:
        self.checkpoint.set("index_phy_offset", offset)

    @contextmanager
    def _building(self, wait: bool = True) -> Iterator[bool]:
        """Hold the build lock of this process and the ``flock`` of the store's builders;
        yields False (holding nothing) when ``wait`` is False and another builder has it."""
        if not self._thread_lock.acquire(blocking=wait):
            yield False
            return
        self._holder = threading.get_ident()
        try:
            if self._lock_fd is None:
                self._lock_fd = os.open(os.path.join(self.root, LOCK_FILE),
                                        os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                held = True
            except BlockingIOError:
                held = False
            try:
                yield held
            finally:
                if held:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._holder = None
            self._thread_lock.release()

    # -- writing -------------------------------------------------------------------------------
    def build(self, end: int, *, wait: bool = True, max_bytes: int | None = None) -> bool:
        """Index the records from ``index_phy_offset`` to ``end`` (at most ``max_bytes`` of
        the CommitLog) and move ``index_phy_offset``; returns whether it reached ``end``.
        ``wait``: wait for another builder (else return False at once).  Stops at an invalid
        record (recovery decides about those)."""
        if not self.enabled or self.read_only:
            return True
        if self.indexed_to() >= end:
            return True
        if self._directory_gone():
            return False
        with self._building(wait) as held:
            if not held:
                return False
            if self._directory_gone():  # (removed or replaced while this one waited)
                return False
            start = max(self.indexed_to(), self.commit_log.min_offset())
            stop = end if max_bytes is None else min(end, start + max_bytes)
            if start >= stop:
                return start >= end
            try:
                reached = self._index_range(start, stop)
            except DiskFullError as exc:
                # the records are written: a send never fails for its index.  This process
                # stops indexing; a query walks what the index misses, and the next
                # writable open indexes it.
                log.warning("the message-key index stops in this process: %s", exc)
                self.enabled = False
                return False
            if reached > self.indexed_to():
                self._set_indexed_to(reached)
            return reached >= end

    def _directory_gone(self) -> bool:
        """Whether the store was removed or replaced under this process (one ``stat``); the
        index then stops in this process for good, as its appends do."""
        problem = self.identity_problem() if self.identity_problem is not None else None
        if problem is not None:
            log.warning("the message-key index stops in this process: the store %s %s",
                        self.root, problem)
            self.enabled = False
        return problem is not None

    def index_range(self, begin: int, end: int) -> int:
        """Index the records of the CommitLog from ``begin`` (a record's start) to ``end``
        without the progress offset (records at or below the index's last one are skipped,
        so indexing again is harmless); returns where it stopped."""
        with self._building():
            return self._index_range(begin, end)

    def _walk(self, begin: int, end: int, sink: Callable[[np.ndarray, np.ndarray, np.ndarray],
                                                           None], rows: np.ndarray) -> int:
        """Hand ``sink(key hashes, record offsets, store times)`` the key rows of the records
        from ``begin`` (a record's start) to ``end``, in batches gathered in ``rows`` (see
        :func:`~store.kernels.key_walk.record_keys`); returns the offset the walk reached
        (``end``, or an invalid record's)."""
        offset = begin
        while offset < end:
            segment = self.commit_log.files.find(offset)
            try:
                buf = None if segment is None else np.frombuffer(segment.buffer(),
                                                                 dtype=np.uint8)
            except FileNotFoundError:  # being deleted by retention in another thread
                self.commit_log.files.refresh()
                buf = None
            if buf is None:
                low = self.commit_log.min_offset()
                if low > offset:  # retention deleted it meanwhile: nothing there to index
                    offset = low
                    continue
                return offset
            pos, limit = offset - segment.start, min(end, segment.end) - segment.start
            while True:
                got, pos, stop = record_keys(buf, pos, limit, rows)
                if got.shape[1]:
                    sink(got[0], got[1] + segment.start, got[2])
                if stop != 2 or pos >= limit:
                    break
            if stop == 0:
                return segment.start + pos
            offset = segment.end if stop == 1 else segment.start + pos
        return offset

    def _index_range(self, begin: int, end: int) -> int:
        skip = self._writable_newest().end_phy_offset
        if skip < 0 and len(self._order) > 1:
            skip = self._files[self._order[-2]].end_phy_offset

        def put(hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
            keep = phys > skip
            if not keep.all():
                hashes, phys, stamps = hashes[keep], phys[keep], stamps[keep]
            self._put(hashes, phys, stamps)
        return self._walk(begin, end, put, self._rows)

    def _put(self, hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
        done = 0
        while done < len(hashes):
            done += self._writable_newest().put(hashes[done:], phys[done:], stamps[done:])

    def open_check(self, log_end: int, *, crashed: bool) -> None:
        """The writable open's steps (see the module docstring): set a damaged index aside
        and rebuild it, drop entries past ``log_end`` (``crashed``: rechain the newest file
        whatever its end, a torn write may have left slot heads behind, and index again
        from its last record), index what the log holds past the index."""
        if self.read_only:
            return
        with self._building():
            self._refresh(force=True)
            damaged = [(n, p) for n in self._order
                       if (p := file_problem(self._files[n])) is not None]
            if damaged:
                for name, problem in damaged:
                    log.warning("index file %s is damaged (%s): the index is set aside and "
                                "rebuilt from the CommitLog", self._files[name].path, problem)
                self._set_aside()
            self._cut(log_end, rechain_newest=crashed)
            last = self._last_entry()
            if self.enabled and (crashed or last < 0):
                # the files may hold less than the offset says (a reboot), or be gone
                self._set_indexed_to(min(self.indexed_to(), max(last, 0)))
        if self.enabled:
            self.build(log_end)

    def set_aside(self) -> list[str]:
        """Move every index file aside (``<name>.damaged-<n>``, never deleted); returns the
        new names.  The index starts again empty (:meth:`build` rebuilds it)."""
        with self._building():
            return self._set_aside()

    def _set_aside(self) -> list[str]:
        moved = []
        for name in list(self._order):
            f = self._files.pop(name)
            f.close()
            moved.append(move_aside(f.path))
        self._order = []
        self._current = None
        self._verdicts.forget()
        self._refresh(force=True)
        self._set_indexed_to(0)
        return moved

    def cut(self, log_end: int, *, rechain_newest: bool = False) -> int:
        """Drop the entries whose record starts at or past ``log_end`` (a cut tail);
        ``rechain_newest``: rebuild the newest file's chains even when none is dropped.
        Returns the entries dropped."""
        with self._building():
            return self._cut(log_end, rechain_newest=rechain_newest)

    def _cut(self, log_end: int, *, rechain_newest: bool = False) -> int:
        dropped = 0
        files = self._refresh()
        for i, f in enumerate(files):
            if f.end_phy_offset >= log_end or (rechain_newest and i == len(files) - 1):
                dropped += f.rechain(log_end)
                self._verdicts.forget()
        if not self.read_only and self.indexed_to() > log_end:
            self._set_indexed_to(log_end)
        return dropped

    # -- retention and repair ------------------------------------------------------------------
    def delete_expired(self, commitlog_min: int) -> list[str]:
        """Delete the files (never the newest) whose last entry's record lies below
        ``commitlog_min``, the oldest CommitLog offset kept (retention's listener); returns
        their names."""
        if self.read_only:
            return []
        deleted = []
        with self._building():
            self._refresh(force=True)
            for name in self._order[:-1]:
                f = self._files[name]
                if f.problem() is None and f.end_phy_offset < commitlog_min:
                    self._files.pop(name).close()
                    try:
                        os.unlink(f.path)
                    except FileNotFoundError:
                        pass
                    deleted.append(name)
            if deleted:
                self._current = None
                self._refresh(force=True)
        return deleted

    def rebuild(self, log_end: int) -> tuple[list[str], bool]:
        """``rmq repair``'s step: check every file (:meth:`IndexFile.verify`); when one fails,
        or the log holds records but the index (on, or built once) has no file, set the
        index aside and build it again from the CommitLog; otherwise index what it misses.  Returns the names set
        aside and whether the index was rebuilt."""
        with self._building():
            self._refresh(force=True)
            problems = [(n, p) for n in self._order
                        if (p := self._files[n].problem() or self._files[n].verify(log_end))]
            for name, problem in problems:
                log.warning("index file %s is damaged (%s): rebuilt from the CommitLog",
                            self._files[name].path, problem)
            # (missing: the index is on, or was built once, and has no file)
            missing = ((self.enabled or self.indexed_to() > 0) and not self._order
                       and log_end > self.commit_log.min_offset())
            moved = self._set_aside() if problems else []
            if missing:
                self._set_indexed_to(0)
        enabled, self.enabled = self.enabled, True
        try:
            self.build(log_end)
        finally:
            self.enabled = enabled
        return moved, bool(problems or missing)

    # -- the first-use check (store.core.key_index_check) -------------------------------------
    def _problems(self) -> dict[str, str]:
        """The files found damaged, by name.  A file that fails its first-use check is looked
        at again, opened again, holding the builders' lock (another process's builder may be
        creating it or writing it) before it counts; that verdict is kept for the file's
        identity, so a later query pays neither the lock nor the listing for it until the
        file is replaced or changed."""
        self._refresh()
        found = {n: p for n in self._order if (p := file_problem(self._files[n]))}
        again = [n for n in found if not self._verdicts.settled(self._files[n].path)]
        if again and self._holder != threading.get_ident():
            with self._quiet_builders():
                before = {n: self._files[n] for n in again}
                self._refresh(force=True)  # (a file of another size is opened again)
                for name, f in before.items():
                    if self._files.get(name) is f:
                        self._reopen(name)  # (it may have been replaced since it was opened)
                found = {n: p for n in self._order if (p := file_problem(self._files[n]))}
                for name, problem in found.items():
                    self._verdicts.keep(self._files[name], problem)
        elif again:  # the builders' lock is this thread's: no builder is at work
            for name in again:
                self._verdicts.keep(self._files[name], found[name])
        return found

    @contextmanager
    def _quiet_builders(self) -> Iterator[None]:
        """No builder writes while this is held: the builders' lock (a reader takes it
        shared, without creating ``index.lock``; none there: no builder ever ran)."""
        if not self.read_only:
            with self._building():
                yield
            return
        try:
            fd = os.open(os.path.join(self.root, LOCK_FILE), os.O_RDONLY)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # (lets the lock go)

    def _checked(self) -> tuple[list[IndexFile], list[tuple[int, int]]]:
        """The files a lookup can trust, oldest first, and the CommitLog ranges the others
        held (:func:`~store.core.key_index_check.trusted_and_gaps`), which a query walks
        instead (see :meth:`tail`)."""
        problems = self._problems()
        return trusted_and_gaps([self._files[n] for n in self._order], problems)

    # -- reading -------------------------------------------------------------------------------
    def lookup(self, topic: str, key: str, max_results: int, begin_ms: int = 0,
               end_ms: int = (1 << 63) - 1) -> list[int]:
        """CommitLog offsets of the records indexed under ``topic#key`` (newest files first,
        at most ``max_results``), stored in ``[begin_ms, end_ms]``.  A 32-bit hash collision
        can add another key's record: callers check the records."""
        key_hash = java_hash_text(f"{topic}#{key}")
        found: list[int] = []
        for f in reversed(self._checked()[0]):
            if len(found) >= max_results:
                break
            if f.overlaps(begin_ms, end_ms):
                found.extend(f.lookup(key_hash, max_results - len(found), begin_ms, end_ms))
        return found

    def tail(self, end: int) -> np.ndarray:
        """Key rows (keyHash, record offset, store time; shape ``(3, n)``) of the records
        not indexed yet, from ``index_phy_offset`` to ``end``, walked without writing.  A
        checkpoint rmq did not write (a RocketMQ broker's store, read as it is) has no such
        offset: its index is taken to reach its newest entry's record."""
        files, gaps = self._checked()
        ends = [f.end_phy_offset for f in files if f.end_phy_offset >= 0]
        reached = (self.indexed_to() if self.checkpoint.trusted
                   else max(ends[-1] if ends else -1, 0))
        low = self.commit_log.min_offset()
        parts: list[np.ndarray] = []
        rows = np.empty((3, max(1 << 12, 2 * MAX_ROWS_PER_RECORD)), dtype=np.int64)

        def keep(hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
            parts.append(np.stack([hashes, phys, stamps]))
        walked = -1
        # what damaged files held (their gaps between sound files), then the unindexed tail;
        # each range starts at a record (a file's first or last record, a segment's start)
        for begin, stop in sorted([*gaps, (reached, end)]):
            begin, stop = max(begin, low, walked), min(stop, end)
            if begin < stop:  # (own rows: the builder thread may be using the index's)
                walked = max(walked, self._walk(begin, stop, keep, rows))
        return np.concatenate(parts, axis=1) if parts else np.empty((3, 0), dtype=np.int64)

    def find(self, topic: str, key: str, max_results: int, begin_ms: int = 0,
             end_ms: int = (1 << 63) - 1, *, tail: np.ndarray) -> list[int]:
        """:meth:`lookup` and the offsets of ``tail`` (:meth:`tail`) under ``topic#key``
        stored in the time range (newest first, each once)."""
        key_hash = java_hash_text(f"{topic}#{key}")
        hit = (tail[0] == key_hash) & (tail[2] >= begin_ms) & (tail[2] <= end_ms)
        recent = tail[1][hit][::-1].tolist()
        older = self.lookup(topic, key, max_results, begin_ms, end_ms)
        return list(dict.fromkeys(recent + older))

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
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


class KeyIndexService:
    """The builder thread of a writing process (RocketMQ's reput thread, for the index):
    every :data:`BUILD_INTERVAL_S` it indexes what was confirmed since, in passes of at most
    :data:`BUILD_STEP_BYTES`, skipping a round when another process's builder is at work.

    Parameters
    ----------
    index : KeyIndex
        The index built.
    confirmed : callable
        ``confirmed() -> int``: the CommitLog end appends confirmed (every process's).
    """

    def __init__(self, index: KeyIndex, confirmed: Callable[[], int],
                 interval_s: float = BUILD_INTERVAL_S) -> None:
        self.index = index
        self.confirmed = confirmed
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and self.index.enabled:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rmq-key-index",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        failed = False
        index = self.index
        while not self._stop.wait(self.interval_s):
            try:
                while not self._stop.is_set() and index.enabled:
                    before = index.indexed_to()
                    if index.build(self.confirmed(), wait=False, max_bytes=BUILD_STEP_BYTES) \
                            or index.indexed_to() == before:
                        break  # at the end; or another builder is at work, or a bad record
                failed = False
            except Exception:  # the thread must live; the next open heals
                if not failed:
                    log.exception("building the message-key index failed; retrying")
                failed = True

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
