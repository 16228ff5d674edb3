"""The message-key index of a store, its writing side: RocketMQ's IndexService over the
``index/`` files, built behind the sends, recovered, kept and repaired.  The files as a
process sees them, which of them a query trusts, and the lookups are
:mod:`store.core.key_lookup`'s (:class:`KeyIndex` extends its :class:`~store.core.key_lookup.KeyLookup`).

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
under the lock, and records below the newest file's last entry are skipped, and of that
record the keys the files hold already (a builder that died after writing entries but before
moving ``index_phy_offset``, perhaps when a file filled between a record's keys).  A clean close
builds to the end.

At a writable open (:meth:`KeyIndex.open_check`): a file that cannot be this index's (a wrong
size for the configured slots and entries, a header no writer leaves) is set aside
(``<name>.damaged-<n>``) with the rest of the index, which is rebuilt from the CommitLog;
after a crash, or when recovery cut the log, the files holding entries at or past the log end
are rechained without them and ``index_phy_offset`` is brought back to the index's last
record; then whatever the log holds past it is indexed (a crash between an append and its
index, or an index turned on late).  A RocketMQ-written store's files are used as they are,
and appended to while they have room.

The seal (:mod:`store.files.index_seal`, :meth:`KeyIndex._seal`): holding the builders'
lock, a writing process records each file it found sound with the CRCs of the bytes a lookup
reads, when a file fills, at a writable open and at a clean close, so that another
process's first use takes it by those CRCs instead of the chain check.  It seals a file
only as it checked it: a file whose bytes changed since its check (its puts, or damage in
its life) is checked again first.

A query (:mod:`store.core.key_lookup`) never waits for the builder: it walks, with the same
kernel and without writing, what the builder has not reached yet (some tens of ms of sends
while a writer runs) and what a damaged file held.

Retention (:meth:`KeyIndex.delete_expired`): a file, the newest excepted, whose last entry
lies below the oldest CommitLog segment kept is deleted with the segments.  ``rmq repair``
(:meth:`KeyIndex.rebuild`) checks every file's header, slots and entries
(:meth:`~store.files.index_file.IndexFile.verify`) and rebuilds the whole index from the
CommitLog when one fails or the index is missing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

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
    key_hash_of_unsigned,
)
from ..files.index_seal import FileSeal, file_seal, write_seal
from ..kernels.key_walk import MAX_ROWS_PER_RECORD
from .key_lookup import KeyLookup

log = logging.getLogger("store.core.key_index")

#: Rows of key hashes one walk of the CommitLog gathers before they go into the files.
_ROWS = 1 << 16
#: The newest entries a pass reads first for the rows of the last record indexed (all
#: :data:`~store.kernels.key_walk.MAX_ROWS_PER_RECORD` only when these are all that record's).
_RECENT_ROWS = 64
#: The builder thread looks for new records this often (RocketMQ's reput thread: 1 ms; a pass
#: here has a fixed cost of a few hundred µs of Python, so a few passes a second less).
BUILD_INTERVAL_S = 0.02
#: CommitLog bytes one pass of the builder thread indexes at most (then the locks are let go).
BUILD_STEP_BYTES = 64 << 20


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


class KeyIndex(KeyLookup):
    """The message-key index of one open store: the lookups of
    :class:`~store.core.key_lookup.KeyLookup` and the writing side, building, recovery,
    retention and repair (see the module docstring).  Parameters as
    :class:`~store.core.key_lookup.KeyLookup`'s; ``message_index_enable`` on a writable
    store has appends indexed.
    """

    def __init__(self, root: str, config: StoreConfig, commit_log: CommitLog,
                 checkpoint: StoreCheckpoint, *, read_only: bool) -> None:
        super().__init__(root, config, commit_log, checkpoint, read_only=read_only)
        #: whether appends are indexed (``message_index_enable`` on a writable store)
        self.enabled = bool(config.message_index_enable) and not read_only
        self._current: IndexFile | None = None  # the file entries go to
        self._rows = np.empty((3, max(_ROWS, 2 * MAX_ROWS_PER_RECORD)), dtype=np.int64)
        #: ``() -> str | None``: what happened to the store directory since this process
        #: opened it (removed, replaced), set by the writing core; a builder writes nothing
        #: into whatever is at the path then (index files and ``index.lock`` go by path)
        self.identity_problem: Callable[[], str | None] | None = None

    # -- the files written ------------------------------------------------------------------------
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

    def _set_indexed_to(self, offset: int) -> None:
        self.checkpoint.set("index_phy_offset", offset)

    # -- writing ----------------------------------------------------------------------------------
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

    def _index_range(self, begin: int, end: int) -> int:
        newest = self._writable_newest()
        skip = newest.end_phy_offset
        if skip < 0 and len(self._order) > 1:
            skip = self._files[self._order[-2]].end_phy_offset
        # the record at ``skip`` may have only its first rows indexed (a file filled between
        # its keys, the builder killed before the next file got the rest): those are skipped
        done = [self._rows_indexed_at(skip)] if skip >= 0 else [0]

        def put(hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
            keep = phys > skip
            at = np.flatnonzero(phys == skip)
            if len(at):  # (the record's rows come in the walk's order, the held ones first)
                held = min(done[0], len(at))
                done[0] -= held
                keep[at[held:]] = True
            if not keep.all():
                hashes, phys, stamps = hashes[keep], phys[keep], stamps[keep]
            self._put(hashes, phys, stamps)
        return self._walk(begin, end, put, self._rows)

    def _rows_indexed_at(self, offset: int) -> int:
        """How many entries the files hold for the record at ``offset``, the last one indexed
        (its rows are the newest entries, perhaps over the end of one file and the start of
        the next; a record has at most ``MAX_ROWS_PER_RECORD``)."""
        held = 0
        for name in reversed(self._order):
            f = self._files[name]
            phys = (f.entries()["phy_offset"][-MAX_ROWS_PER_RECORD:] if f.problem() is None
                    else ())
            if not len(phys):
                continue
            recent = phys[-_RECENT_ROWS:]  # (a record has a few keys: its rows end in these)
            if len(recent) < len(phys) and (recent != offset).any():
                phys = recent  # (the same count: a row of another record is among them)
            other = np.flatnonzero(phys != offset)
            held += len(phys) - (int(other[-1]) + 1 if len(other) else 0)
            if len(other) or len(phys) == MAX_ROWS_PER_RECORD:
                break
        return held

    def _put(self, hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> None:
        done = 0
        while done < len(hashes):
            f = self._writable_newest()
            done += f.put(hashes[done:], phys[done:], stamps[done:])
            if f.is_full():  # puts never change it again: sealed for the other processes
                self._seal([f])

    # -- the seal ---------------------------------------------------------------------------------
    def seal(self) -> None:
        """Seal every file of the index as it is (a clean close's step, after its last
        build): see :meth:`_seal`."""
        if self.read_only or not self.enabled:
            return
        with self._building():
            self._seal(self._refresh(force=True), keep_full=True)

    def _seal(self, files: list[IndexFile], *, keep_full: bool = False) -> None:
        """Record in the store's seal (:mod:`store.files.index_seal`; the builders' lock
        held: no put under way) each of ``files`` that is sound, with the CRCs of its bytes,
        unless its record still holds.  Sound: a file whose bytes are still those this
        process checked, or took by a seal it checked whole (:meth:`taken`); any other
        (written since, or changed by damage in this process's life)
        :meth:`~store.files.index_file.IndexFile.check_chains` checks now.  ``keep_full``:
        the record of a full file is kept as it is unless this process found it wrong (a
        full file changes only by a cut or damage, which the next reader's CRCs find).
        Records of files gone are dropped.  A file found damaged here is not sealed, and
        this process's queries walk the CommitLog records it holds instead."""
        if self.read_only:
            return
        records = dict(self.seals())
        changed = False
        for f in files:
            record = records.get(f.name)
            if f.problem() is not None or (keep_full and f.is_full() and record is not None
                                           and f.first_use != "checked"):
                continue
            now = file_seal(f)
            if _same(now, record):
                continue
            known = f.chain_problem is None and _same(now, self.taken(f))
            problem = None if known else f.check_chains()
            if problem is not None:
                f.chain_problem = problem
                log.warning("index file %s is damaged (%s): not sealed; a writable open sets "
                            "the index aside and rebuilds it", f.path, problem)
                continue
            if not known:  # (what was checked: the CRCs again, after the check)
                now = file_seal(f)
            records[f.name] = now
            self._taken[f.name] = (f, now)
            f.chain_problem, f.first_use = None, "sealed"
            changed = True
        try:
            present = {n for n in os.listdir(self.directory) if is_index_name(n)}
        except FileNotFoundError:
            present = set()
        gone = [name for name in records if name not in present]
        for name in gone:
            del records[name]
        if changed or gone:
            try:
                write_seal(self.root, records)
            except OSError as exc:  # (a seal saves work; without it the next process checks)
                log.warning("the message-key index's seal was not written: %s", exc)

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
                       if (p := self.file_problem(self._files[n])) is not None]
            if damaged:
                for name, problem in damaged:
                    log.warning("index file %s is damaged (%s): the index is set aside and "
                                "rebuilt from the CommitLog", self._files[name].path, problem)
                self._set_aside()
            self._cut(log_end, rechain_newest=crashed)
            self._seal([f for f in self._refresh() if f.is_full()], keep_full=True)
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

    # -- retention and repair ---------------------------------------------------------------------
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


def _same(a: FileSeal | None, b: FileSeal | None) -> bool:
    """Whether two seal records name the same bytes."""
    return (a is not None and b is not None and a.size == b.size and a.covered == b.covered
            and np.array_equal(a.crcs, b.crcs))


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
