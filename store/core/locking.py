"""The append lock of a writable store: one thread lock, one ``flock``, catch-up on entry.

Appends are serialised across threads (a re-entrant thread lock) and across processes (a
``flock`` on the store's ``lock`` file).  Only the outermost holder takes and releases the
file lock: an inner release would let another process append inside the outer section.

On taking the lock a writer looks at two checkpoint fields at once
(:meth:`~store.files.checkpoint.StoreCheckpoint.writer_state`): ``write_in_progress`` left behind
means the previous holder died mid-append (its unconfirmed append is dropped whole, as recovery
does), and a changed ``write_generation`` means another process appended since this one last
did (the appender takes over the new log end and forgets its queue ends).  Both are one
unpack of the shared mapping.

A process that sends single records often keeps the ``flock`` between them for a short
lease (:mod:`store.core.lock_lease`): while it holds one, an outermost append takes only the thread
lock, and no other process can have appended, so the checkpoint check finds nothing to catch
up.  The check still runs: an append of this process that failed half-way left
``write_in_progress`` behind, and the next one drops it.

:meth:`AppendLocking._lock` / :meth:`AppendLocking._unlock` are the pair the single-message
path uses (no context-manager frame); :meth:`AppendLocking._write_locked` wraps them for
everything else.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator

from ..base.errors import FlushError
from .index_commit import finish_pending_commit
from .placement_chain import PlacementChain
from .recovery import recover_tail
from .recovery_start import dead_append_bounds

if TYPE_CHECKING:  # pragma: no cover
    from ..base.errors import StoreReplacedError
    from ..files.checkpoint import StoreCheckpoint
    from ..files.commit_log import CommitLog
    from ..files.topics import TopicTable
    from .appender import Appender
    from .identity import DirectoryIdentity
    from .flushing import FlushService
    from .lock_lease import LockLease
    from .ports import ReplicaAcks


class AppendLocking:
    """Mixin of :class:`~store.core.store_core.StoreCore`: its append lock and catch-up."""

    root: str
    recovered: bool
    checkpoint: StoreCheckpoint
    commit_log: CommitLog
    topic_table: TopicTable
    appender: Appender
    flusher: FlushService
    _thread_lock: threading.RLock
    _lock_depth: int
    _lease: LockLease
    _recovery_listeners: list
    identity: DirectoryIdentity
    replaced: str | None
    replica_acks: ReplicaAcks | None
    _replica_wait: threading.local

    if TYPE_CHECKING:  # pragma: no cover - provided by ReadableStore and StoreCore
        def _check_open(self) -> None: ...

        def replaced_error(self, problem: str) -> StoreReplacedError: ...

    # ------------------------------------------------------------------ the lock
    def _lock(self, catch_up: bool = True, lease: bool = False) -> bool:
        """Take the append lock; return whether this call is the outermost holder.

        ``lease``: the append is a small one (a single record), worth keeping the ``flock``
        for the next (:mod:`~store.core.lock_lease`); a large append gains nothing from it.
        Every call must be paired with :meth:`_unlock` (given what this returned), also when
        this raises after the lock was taken (it releases what it took before raising).
        """
        self._thread_lock.acquire()
        outermost = self._lock_depth == 0
        if outermost and not self._lease.held:
            try:
                if self.replaced is not None:
                    raise self.replaced_error(self.replaced)
                self._lease.acquire(lease)
            except BaseException:
                self._thread_lock.release()
                raise
            # Holding the file lock proves nothing if the path holds another store now (the
            # lock file this process locks is not the one a new store's processes lock).
            problem = self.identity.problem()
            if problem is not None:
                self._lease.release()
                self._thread_lock.release()
                raise self.replaced_error(problem)
        self._lock_depth += 1
        if outermost and catch_up:
            try:
                in_progress, generation = self.checkpoint.writer_state()
                if in_progress != -1:
                    # The previous holder died in the middle of an append.  If it did not
                    # confirm it, drop that append whole (it was never acknowledged, and no
                    # reader saw it); a confirmed one is kept.
                    start, limit = dead_append_bounds(self, in_progress)
                    self._recover(start, limit=limit)
                    self._catch_up()
                elif generation != self.appender.generation:
                    self._catch_up()
                if self.checkpoint.get("index_commit_pending"):
                    # a commit marker published by a writer that died before writing its
                    # entries: write them now (rolled forward, see index_commit)
                    if finish_pending_commit(self):
                        self._catch_up(force=True)
            except BaseException:
                self._unlock(outermost)
                raise
        return outermost

    def _unlock(self, outermost: bool) -> None:
        """Release what the matching :meth:`_lock` took."""
        self._lock_depth -= 1
        try:
            if outermost:
                lease = self._lease
                if lease.held and lease.left > 1:
                    lease.left -= 1  # kept for the next append
                else:  # no lease, or its appends are used up
                    lease.release()
        finally:
            self._thread_lock.release()

    @contextmanager
    def _write_locked(self, catch_up: bool = True, lease: bool = False) -> Iterator[None]:
        """Hold the append lock of this process and of the store directory; an outermost
        holder that appended waits for the replicas after releasing it
        (:meth:`_await_replicas`).  ``lease``: as :meth:`_lock`'s."""
        outermost = self._lock(catch_up, lease)
        start = self.appender.write_offset
        try:
            yield
        except BaseException:
            self._unlock(outermost)
            raise
        end = self.appender.write_offset
        acks = self.replica_acks  # (read under the lock: the term the append was made in)
        self._unlock(outermost)
        if outermost and end != start:
            self._await_replicas(end, acks)

    def _await_replicas(self, end: int, acks: ReplicaAcks | None) -> None:
        """Acknowledge an append only once the replicas that must hold it do
        (:class:`~store.core.ports.ReplicaAcks`; nothing to wait for outside a replica set
        with ``min_insync_replicas`` above 1).  Called without the lock held, so that other
        appends go on meanwhile and one wait covers them all.

        ``acks`` is what :attr:`replica_acks` was while the append held the lock, never
        what it is now: a change of role may come between the release and this wait (a
        leader becoming follower drops its acks and closes them), and the write must then
        fail as deposed (the closed acks say so), not pass as if no replica were needed."""
        if acks is None:
            return
        deferred = getattr(self._replica_wait, "end", None)
        if deferred is not None:  # (inside a WaitAfterLock: waited for when it is released)
            self._replica_wait.end = max(deferred, end)
            if getattr(self._replica_wait, "acks", None) is None:
                self._replica_wait.acks = acks  # (the first term appended in: its wait fails
            return                              # if a change of role came since)
        acks.wait(end)

    def defer_replica_wait(self) -> None:
        """From now on, this thread's appends note the end to wait for instead of waiting
        (:class:`WaitAfterLock`)."""
        self._replica_wait.end = -1
        self._replica_wait.acks = None

    def end_replica_wait(self, wait: bool = True) -> None:
        """Stop deferring; with ``wait``, wait for the replicas of what was appended
        meanwhile (after the caller released its own lock)."""
        end = getattr(self._replica_wait, "end", None)
        acks = getattr(self._replica_wait, "acks", None)  # (as the appends found them)
        self._replica_wait.end = self._replica_wait.acks = None
        if wait and end is not None and end >= 0 and acks is not None:
            acks.wait(end)

    def write_lock(self, lease: bool = False):
        """The store's append lock as a context manager (re-entrant within a process).

        Services hold it across a read-decide-append step so that concurrent processes do
        not deliver the same message twice.  ``lease``: the step appends little (a
        follower's chunk of a single send), and the ``flock`` may be kept for the next
        (:mod:`~store.core.lock_lease`).
        """
        self._check_writable()
        return self._write_locked(lease=lease)

    def _check_writable(self) -> None:
        self._check_open()
        if self.replaced is not None:
            raise self.replaced_error(self.replaced)
        error = self.flusher.take_error()
        if error is not None:
            raise FlushError(f"flushing store {self.root} failed: {error}; the data appended "
                             "since the last successful flush may not be durable") from error

    # ------------------------------------------------------------------ catch-up and cuts
    def _catch_up(self, force: bool = False) -> None:
        if self.appender.catch_up(force):
            self.commit_log.files.refresh()
            self.topic_table.reload()

    def drop_tail(self, offset: int) -> None:
        """Cut what was appended from ``offset`` on (an atomic group that failed), as recovery
        cuts an append that never completed."""
        self._recover(offset, limit=offset)
        self._catch_up(force=True)
        self.key_index.cut(self.appender.write_offset)

    def placement_chain(self, count: int, queues: Iterable[tuple[str, int]]) -> PlacementChain:
        """A :class:`~store.core.placement_chain.PlacementChain` for the ``count`` chunks of
        one append, from the log end and the ends of ``queues`` (``(topic, queue id)``, the
        queues its chunks will write) now.  Its :meth:`~PlacementChain.presume`, given as
        :meth:`assemble_encoded`'s ``presume``, lets each chunk's encoding write the fields an
        append would write under the lock."""
        self._check_writable()
        with self._write_locked():
            appender = self.appender
            ends = {key: appender.next_queue_offset(key) for key in queues}
            return PlacementChain(self.commit_log, appender.config.commitlog_file_size_bytes,
                                  count, appender.write_offset, ends)  # (the append's rule)

    @contextmanager
    def atomic_append(self) -> Iterator[None]:
        """Hold the write lock; every append inside the block lands whole or not at all.

        Readers (in every process) see the block's records only when it ends; a crash or an
        exception inside it drops them all (see :meth:`Appender.atomic_group`).
        """
        with self.write_lock(), self.appender.atomic_group():
            yield

    def _recover(self, start_offset: int, limit: int | None = None) -> None:
        recover_tail(self, start_offset, limit=limit, listeners=self._recovery_listeners)
        self.recovered = True


class WaitAfterLock:
    """A caller's own lock around store writes (a served store's write section) whose
    holder waits for the replicas of what it appended only after releasing it, so that
    writers behind it append meanwhile and one report of the followers releases them all
    (:meth:`AppendLocking.defer_replica_wait`).  Not re-entrant."""

    def __init__(self, store: AppendLocking) -> None:
        self._store = store
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._store.defer_replica_wait()
        self._lock.acquire()

    def __exit__(self, kind, value, traceback) -> None:
        self._lock.release()
        self._store.end_replica_wait(wait=kind is None)
