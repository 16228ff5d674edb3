"""The read side of the message-key index: its files as a process sees them, which of them a
query can trust, and the lookups (:class:`KeyLookup`, which
:class:`~store.core.key_index.KeyIndex` extends with the writing side).

The files.  ``index/`` holds RocketMQ's IndexFiles (:mod:`store.files.index_file`), named
by creation time; the directory is listed again only when it changed (its mtime), and a file
of the wrong size (one another process is creating) is opened again until it is sized.  The
builders' lock (this process's lock and an exclusive ``flock`` on the store's ``index.lock``)
serialises the builders of every process; a query takes it only to see the files quiet.

Which files a query trusts.  A process checks an index file the first time it uses it: its
size and header (:meth:`~store.files.index_file.IndexFile.problem`) and its slots and chains
(:meth:`~store.files.index_file.IndexFile.check_chains`, one compiled pass), unless a
writer's seal (:mod:`store.files.index_seal`: the CRC of each 64 KiB block of what a lookup
reads, recorded by a process that found the file sound) matches the file as it is: a reader
then checks the header's block at once and, at each lookup, the blocks that lookup read (a
lookup's answer depends on those bytes only), and a writer every block at once; the compiled
loop is not even loaded.  A block that does not match costs that file the full check there
and then (and, found damaged, the query walks what it held).  A file can fail
only because another process's builder is at work on it (a file being created, not yet
sized; a put half-published), so a failed file is opened and checked again holding the
builders' lock before it counts.  What that finds is the file's *verdict*, kept with the
file's identity (device, inode, size, modification time; :class:`DamageVerdicts`): a later
query whose file has the same identity takes the verdict as it stands, without the lock, a
directory listing, opening the file again or checking it again, and the damage is logged
once.  A file replaced (a repair's rename, a copy put back) or changed (written since, cut
again) has another identity and is checked again.  A writable open still sets a damaged index
aside and rebuilds it from the CommitLog.

Lookups (:meth:`KeyLookup.lookup`) read the trusted files newest first, as RocketMQ does, and
work on a read-only store too (the files mapped read-only).  A query must also see what was
acknowledged but is not indexed yet, and what a damaged file held: :meth:`KeyLookup.tail`
walks those CommitLog ranges (``index_phy_offset`` to the confirmed end, and the ranges of
:func:`trusted_and_gaps`) with the compiled walk of :mod:`store.kernels.key_walk` in the
querying process, writing nothing, and :meth:`KeyLookup.find` adds what it found.  So a query
never waits for the builder (which may be another process, or none) and never returns fewer
messages than were sent.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ..base.config import StoreConfig
from ..files.checkpoint import StoreCheckpoint
from ..files.commit_log import CommitLog
from ..files.index_file import HEADER_SIZE, UNCHECKED, IndexFile, is_index_name, java_hash_text
from ..files.index_seal import (
    SEAL_PATH,
    FileSeal,
    Records,
    blocks_hold,
    file_seal,
    read_seal,
    seal_holds,
)
from ..kernels.key_walk import MAX_ROWS_PER_RECORD, record_keys

#: (the message-key index's one logger, whichever side speaks)
log = logging.getLogger("store.core.key_index")

#: ``(st_dev, st_ino, st_size, st_mtime_ns)`` of a file: what a verdict holds for.
Identity = tuple[int, int, int, int]

#: A range's end past any CommitLog offset.
LOG_END = 1 << 62
#: The lock file of the builders (in the store directory).
LOCK_FILE = "index.lock"


def identity(path: str) -> Identity | None:
    """The identity of the file at ``path`` now (``None``: no file there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class _SealBroken(Exception):
    """A lookup read bytes of a sealed file that are not the sealed ones, and the file's
    check then failed: the files to trust and the ranges to walk are to be found again."""


class DamageVerdicts:
    """The verdicts of one process on the index files found damaged, by path, each with the
    identity of the file it was reached on (see the module docstring)."""

    def __init__(self) -> None:
        self._verdicts: dict[str, tuple[Identity, str]] = {}
        self._said: set[tuple[str, Identity]] = set()

    def settled(self, path: str) -> bool:
        """Whether a verdict holds for the file at ``path`` now (the same identity)."""
        kept = self._verdicts.get(path)
        return kept is not None and kept[0] == identity(path)

    def keep(self, f: IndexFile, problem: str) -> None:
        """Keep ``problem`` as the verdict on ``f`` (reached with no builder at work) and say
        it in the log, once for each identity."""
        now = identity(f.path)
        if now is None:
            return
        self._verdicts[f.path] = (now, problem)
        if (f.path, now) not in self._said:
            self._said.add((f.path, now))
            log.warning("index file %s is damaged (%s): a query walks the CommitLog records "
                        "it held instead (slower) until `rmq repair` or a writable open "
                        "rebuilds the index", f.path, problem)

    def forget(self) -> None:
        """Drop every verdict (this process set files aside or rewrote them)."""
        self._verdicts.clear()


def trusted_and_gaps(files: list[IndexFile], problems: dict[str, str]
                     ) -> tuple[list[IndexFile], list[tuple[int, int]]]:
    """The files (oldest first) a lookup can trust, and the CommitLog ranges the damaged
    ones (named in ``problems``) held: from the last record of the sound file before each
    (the log's start when none) to the first record of the sound file after it (the log's
    end, :data:`LOG_END`, when none), so a query walks them instead."""
    trusted: list[IndexFile] = []
    gaps: list[tuple[int, int]] = []
    open_gap = False
    for f in files:
        if f.name in problems:
            if not open_gap:
                ends = [g.end_phy_offset for g in trusted if g.end_phy_offset >= 0]
                gaps.append((ends[-1] if ends else 0, LOG_END))
            open_gap = True
        elif f.index_count > 1:
            trusted.append(f)
            if open_gap:
                gaps[-1] = (gaps[-1][0], f.header()[2])
            open_gap = False
    return trusted, gaps


class KeyLookup:
    """The files of one open store's ``index/`` directory and the lookups over them (see the
    module docstring).

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
        #: whether the store keeps an index (``message_index_enable``), read-only or not: a
        #: reader then finds what the writer's builder has not reached yet by the tail walk
        self.configured = bool(config.message_index_enable)
        self.read_only = read_only
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self._files: dict[str, IndexFile] = {}
        self._order: list[str] = []  # names, oldest first
        self._listed = -1.0
        #: one builder per process at a time (the ``flock`` serialises processes)
        self._thread_lock = threading.Lock()
        self._holder: int | None = None  # the thread holding it
        self._lock_fd: int | None = None
        #: the files found damaged, each verdict kept for the file's identity
        self._verdicts = DamageVerdicts()
        #: the seal's records, and the identity of the seal file they were read from
        self._seal_records: Records = {}
        self._seal_identity: Identity | None = None
        #: names whose record a lookup found not to hold (ignored until the seal changes)
        self._broken: set[str] = set()
        #: by name, the file and the bytes (a seal record) this process took it as sound by:
        #: a reader checks each lookup's blocks against them; a writer seals a file again
        #: without a check only while its bytes are still these (:meth:`KeyIndex._seal`)
        self._taken: dict[str, tuple[IndexFile, FileSeal]] = {}

    def seals(self) -> Records:
        """The records of the store's seal (:mod:`store.files.index_seal`), read again when
        the seal file changed; without those a lookup found not to hold."""
        now = identity(os.path.join(self.root, SEAL_PATH))
        if now != self._seal_identity:
            self._seal_identity = now
            self._seal_records = read_seal(self.root) if now is not None else {}
            self._broken.clear()
        if self._broken:
            return {n: r for n, r in self._seal_records.items() if n not in self._broken}
        return self._seal_records

    def taken(self, f: IndexFile) -> FileSeal | None:
        """The bytes this process took ``f`` (this very opened file) as sound by, if any."""
        kept = self._taken.get(f.name)
        return kept[1] if kept is not None and kept[0] is f else None

    def file_problem(self, f: IndexFile) -> str | None:
        """Why ``f`` cannot answer every key it holds (``None``: it can): its size and
        header and, once per opened file, its slots and chains (kept in
        ``f.chain_problem``), unless the store's seal (:mod:`store.files.index_seal`) says a
        writer found these very bytes sound (``f.first_use`` tells which: ``"sealed"`` or
        ``"checked"``).  A reader checks the header's block at once and the other blocks as
        its lookups read them (:meth:`lookup`); a writer, which puts into the file and seals
        it again, every block now."""
        problem = f.problem()
        if problem is None and f.chain_problem == UNCHECKED:
            record = self.seals().get(f.name)
            if (blocks_hold(f, record, [(0, HEADER_SIZE)]) if self.read_only
                    else seal_holds(f, record)):
                f.chain_problem, f.first_use = None, "sealed"
            else:
                f.chain_problem, f.first_use = f.check_chains(), "checked"
                # (a writer keeps what it checked, to seal it later without a check)
                record = None if self.read_only or f.chain_problem else file_seal(f)
            if record is not None:
                self._taken[f.name] = (f, record)
        return problem or f.chain_problem

    # -- the files --------------------------------------------------------------------------------
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
        self._files[name].close()  # (a writer's current file, if it was: closed, not used)
        f = self._files[name] = IndexFile(os.path.join(self.directory, name), self.slot_count,
                                          self.entry_count, read_only=self.read_only)
        return f

    # -- the builders' lock and progress ----------------------------------------------------------
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

    def indexed_to(self) -> int:
        """Every record below this CommitLog offset is indexed (``index_phy_offset``)."""
        return self.checkpoint.get("index_phy_offset")

    # -- the first-use check ----------------------------------------------------------------------
    def _problems(self) -> dict[str, str]:
        """The files found damaged, by name.  A file that fails its first-use check is looked
        at again, opened again, holding the builders' lock (another process's builder may be
        creating it or writing it) before it counts; that verdict is kept for the file's
        identity, so a later query pays neither the lock nor the listing for it until the
        file is replaced or changed."""
        self._refresh()
        found = {n: p for n in self._order
                 if (p := self.file_problem(self._files[n]))}
        again = [n for n in found if not self._verdicts.settled(self._files[n].path)]
        if again and self._holder != threading.get_ident():
            with self._quiet_builders():
                before = {n: self._files[n] for n in again}
                self._refresh(force=True)  # (a file of another size is opened again)
                for name, f in before.items():
                    if self._files.get(name) is f:
                        self._reopen(name)  # (it may have been replaced since it was opened)
                found = {n: p for n in self._order
                         if (p := self.file_problem(self._files[n]))}
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
        held (:func:`~trusted_and_gaps`), which a query walks
        instead (see :meth:`tail`)."""
        problems = self._problems()
        return trusted_and_gaps([self._files[n] for n in self._order], problems)

    # -- reading ----------------------------------------------------------------------------------
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

    def lookup(self, topic: str, key: str, max_results: int, begin_ms: int = 0,
               end_ms: int = (1 << 63) - 1) -> list[int]:
        """CommitLog offsets of the records indexed under ``topic#key`` (newest files first,
        at most ``max_results``), stored in ``[begin_ms, end_ms]``.  A 32-bit hash collision
        can add another key's record: callers check the records.  (The index alone: what
        damaged files held is :meth:`find`'s.)"""
        while True:
            try:
                return self._lookup(topic, key, max_results, begin_ms, end_ms)
            except _SealBroken:
                continue  # (that file is now checked: found damaged, it is left out)

    def _lookup(self, topic: str, key: str, max_results: int, begin_ms: int,
                end_ms: int) -> list[int]:
        """:meth:`lookup`; :class:`_SealBroken` when a file found damaged is to be left out.
        A file a reader took by its seal answers once the blocks its lookup read are the
        sealed ones; else it is checked whole now (the answer of a sound file stands)."""
        key_hash = java_hash_text(f"{topic}#{key}")
        found: list[int] = []
        for f in reversed(self._checked()[0]):
            if len(found) >= max_results:
                break
            record = self.taken(f) if self.read_only else None
            reads: list[tuple[int, int]] | None = None if record is None else [(0, HEADER_SIZE)]
            got = (f.lookup(key_hash, max_results - len(found), begin_ms, end_ms, reads)
                   if f.overlaps(begin_ms, end_ms) else [])
            if reads is not None and not blocks_hold(f, record, reads):
                self._broken.add(f.name)
                self._taken.pop(f.name, None)
                f.chain_problem, f.first_use = f.check_chains(), "checked"
                if f.chain_problem is not None:
                    raise _SealBroken(f.name)
                got = (f.lookup(key_hash, max_results - len(found), begin_ms, end_ms)
                       if f.overlaps(begin_ms, end_ms) else [])
            found.extend(got)
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
             end_ms: int = (1 << 63) - 1, *, log_end: int,
             tail: np.ndarray | None = None) -> list[int]:
        """:meth:`lookup` and the offsets of ``tail`` (:meth:`tail` to ``log_end``; given:
        the same, walked once for several finds) under ``topic#key`` stored in the time
        range (newest first, each once).  A file a lookup finds damaged has its records
        walked instead (the tail walked again)."""
        key_hash = java_hash_text(f"{topic}#{key}")
        while True:
            if tail is None:
                tail = self.tail(log_end)
            try:
                older = self._lookup(topic, key, max_results, begin_ms, end_ms)
                break
            except _SealBroken:
                tail = None
        hit = (tail[0] == key_hash) & (tail[2] >= begin_ms) & (tail[2] <= end_ms)
        recent = tail[1][hit][::-1].tolist()
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
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
