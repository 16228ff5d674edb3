"""StoreCore: a writable store directory (open, locks, crash marker, catch-up, flush, appends).

Directory tree under the store root::

    commitlog/{20-digit offset}                 CommitLog segments (store.files.commit_log)
    consumequeue/{topic}/{queueId}/{20-digit}   ConsumeQueues (store.files.consume_queue)
    checkpoint                                  shared positions (store.files.checkpoint)
    abort                                       crash marker: present while any process has it open
    lock, open.lock                             append lock; open-count lock
    config/store.json                           layout settings recorded at creation
    config/topics.json                          topics and queue counts (store.files.topics)
    config/queueTable.json                      queue ends at the last close (.integrity)
    config/delayOffset.json, timer*, transaction*   the services' files

Concurrency: any number of processes may open one directory.  Appends take a ``flock`` on
``lock`` (and a thread lock), so they are serialised across processes; before appending, a
writer catches up with what other processes wrote (``write_generation``) and repairs the tail a
dead writer left (``write_in_progress``).  Readers take no lock (see
:mod:`store.core.reading`).

Opening is two steps so that services can register their hooks (:mod:`store.core.ports`)
before recovery runs: the constructor opens the files, :meth:`StoreCore.start` joins the other
processes, recovers when needed and starts the flush thread.
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Mapping, Sequence

import numpy as np

from ..files.abort_marker import MARKER_FILE, try_flock, write_marker, written_this_boot
from ..formats.record_codec import LOCALHOST, RecordSpec
from ..base.config import StoreConfig
from ..base.errors import InvalidMessageError, StoreNotFoundError, StoreReplacedError
from ..formats.message_id import MessageIdGenerator
from ..files.topics import default_queue_count
from .append_types import (AppendResult, AssembledRecords, BatchAppendResult, EncodedAppend,
                           EncodedRecords, Presume, SingleAppend)
from .appender import Appender
from .index_commit import finish_pending_commit, register_index_commits
from .queue_dispatch import Dispatcher
from .flushing import FlushService
from .key_index import KeyIndexService
from .identity import DirectoryIdentity
from .integrity import check_at_open, write_queue_table
from .lock_lease import LockLease
from .locking import AppendLocking
from .pipeline import THREADS
from .ports import RecoveryListener, ReplicaAcks, RetentionGuard, RetentionListener, TagsCodeRule
from .write_placement import Allocate
from .reading import Clock, ReadableStore
from .store_layout import ensure_store_id
from .recovery_start import (
    crash_limit,
    dead_append_bounds,
    recover_without_checkpoint,
    verify_tail,
)
from .queue_rebuild import RebuildResult, rebuild_queues
from .retention import delete_expired_segments


class StoreCore(AppendLocking, ReadableStore):
    """A store directory opened for writing (see the module docstring).

    Parameters
    ----------
    path : str
        The store directory (created when missing).
    config : StoreConfig or dict, optional
        Settings; layout settings recorded in an existing store win.
    clock : callable, optional
        Returns "now" in epoch ms; tests pass a controllable one.
    """

    read_only = False

    def __init__(self, path: str, config: StoreConfig | Mapping | None = None, *,
                 clock: Clock | None = None) -> None:
        root = os.path.abspath(path)
        if os.path.exists(root) and not os.path.isdir(root):
            raise StoreNotFoundError(f"{root} is a file, not a store directory; allowed: a "
                                     "directory (created when missing)")
        for sub in ("commitlog", "consumequeue", "config"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        self._open_files(root, config, clock, record_layout=True)
        self._closed = True  # until start()
        self._started = False
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        flags = os.O_RDWR | os.O_CREAT
        self._write_lock_fd = os.open(os.path.join(self.root, "lock"), flags, 0o644)
        self._open_lock_fd = os.open(os.path.join(self.root, "open.lock"), flags, 0o644)
        #: The lock file this process opened: a removed or replaced store is noticed by it.
        self.identity = DirectoryIdentity(self.root, self._write_lock_fd)
        self.key_index.identity_problem = self.identity.problem
        #: Why this process stopped writing to the store (it was removed or replaced).
        self.replaced: str | None = None
        #: What must hold an append before it is acknowledged beyond this disk (a replica
        #: set's leader with min_insync_replicas above 1; set by its server).
        self.replica_acks: ReplicaAcks | None = None
        self._replica_wait = threading.local()  # (a deferred wait: locking.WaitAfterLock)
        self._lease = LockLease(self._write_lock_fd, self.config.append_lock_lease_ms,
                                self._thread_lock)
        self.id_generator = MessageIdGenerator()
        #: Threads that encode a large append (the caller and a helper); set it to 1 in a
        #: process whose cores are busy already (the rmq sink's Spark tasks do).
        self.encode_threads = THREADS
        self.dispatcher = Dispatcher(self.consume_queue, lambda topic, queue_id: (
            self.topic_table.queue_written(topic, queue_id, self.now_ms())))
        self.appender = Appender(self)
        register_index_commits(self)
        # the index files older than the CommitLog kept go with it (RocketMQ's rule)
        self._retention_listeners: list[RetentionListener] = [self.key_index.delete_expired]
        self._retention_guards: list[RetentionGuard] = []
        self._recovery_listeners: list[RecoveryListener] = []
        self.recovered = False
        self.flusher = FlushService(self.root, self.commit_log, self.checkpoint,
                                    lambda: self._queues.values(),
                                    self.config.flush_interval_commitlog_ms)
        #: builds the message-key index behind the appends (:mod:`store.core.key_index`)
        self.key_indexer = KeyIndexService(self.key_index, self.confirmed_offset)

    # ------------------------------------------------------------------ hooks
    def register_system_topic(self, topic: str, queue_count: int,
                              tags_code: TagsCodeRule | None = None) -> None:
        """A service's system topic: its queue count and, optionally, its tagsCode rule."""
        self.dispatcher.register_system_topic(topic, queue_count, tags_code)
        self.appender.forget_plain_topics()

    def add_retention_listener(self, listener: RetentionListener) -> None:
        """Call ``listener(commitlog_min)`` after retention deleted CommitLog segments."""
        self._retention_listeners.append(listener)

    def add_retention_guard(self, guard: RetentionGuard) -> None:
        """Retention keeps the segment of the offset ``guard()`` returns, and later ones."""
        self._retention_guards.append(guard)

    def add_recovery_listener(self, listener: RecoveryListener) -> None:
        """Call ``listener(core, scan)`` after a recovery scan, before its end is published."""
        self._recovery_listeners.append(listener)

    # ------------------------------------------------------------------ opening and closing
    def start(self, *, flush_service: bool = True) -> None:
        """Join the processes that have the store open, recover when needed, start flushing."""
        self._closed = False
        try:
            self._join_and_recover()
        except BaseException:
            self._release()  # do not keep the open lock (others would wait forever)
            raise
        self._started = True
        if flush_service:  # in SYNC_FLUSH too: it makes queues durable and bounds recovery
            self.flusher.start()
            self.key_indexer.start()

    def _join_and_recover(self) -> None:
        # Am I the only process with the store open?  Then an ``abort`` marker is a crash.
        # The open lock is held (exclusive when alone, else shared) before the marker is
        # written, so a process closing at the same moment cannot delete a newcomer's marker;
        # a sole opener keeps it exclusive until recovery is done, so others wait for it.
        sole = try_flock(self._open_lock_fd, fcntl.LOCK_EX)
        if not sole:
            fcntl.flock(self._open_lock_fd, fcntl.LOCK_SH)
        abort_path = os.path.join(self.root, MARKER_FILE)
        crashed = sole and os.path.exists(abort_path)
        # Same boot as the crashed process: the checkpoint in the page cache is exact, so
        # an append it had not confirmed is dropped whole.  After a reboot it may be stale:
        # keep every valid record (as RocketMQ does), since a synchronous send may have been
        # acknowledged after the checkpoint page last reached the disk.
        same_boot = crashed and written_this_boot(abort_path)
        write_marker(abort_path)
        # the id every progress file is checked against (written now into a store of an
        # older version; read again here so that processes that created the store at the
        # same moment agree on the id the file kept)
        self.store_id = ensure_store_id(self.root)
        with self._write_locked(catch_up=False):
            if not self.checkpoint.trusted:  # one rmq did not write: the records decide
                self.recovered = recover_without_checkpoint(self, self._recovery_listeners)
            elif crashed:
                self._recover(self.checkpoint.get("flushed_phy_offset"),
                              limit=crash_limit(self, same_boot))
            elif (marker := self.checkpoint.get("write_in_progress")) != -1:
                start, limit = dead_append_bounds(self, marker)
                self._recover(start, limit=limit)
            elif sole and verify_tail(self, self._recovery_listeners):
                self.recovered = True
            if sole and check_at_open(self, self._recovery_listeners):
                self.recovered = True  # damaged segments or lost queue entries repaired
            if self.checkpoint.get("index_commit_pending"):
                finish_pending_commit(self)  # a commit marker published, entries not written
            self._catch_up(force=True)
            if sole:  # the index after recovery: set aside when damaged, cut, caught up
                self.key_index.open_check(self.appender.write_offset,
                                          crashed=crashed or self.recovered)
        if sole:
            fcntl.flock(self._open_lock_fd, fcntl.LOCK_SH)  # downgrade: others may join now

    def _release(self) -> None:
        """Give back the files and locks of a store whose opening failed."""
        self._closed = True
        for close in (self._lease.close, self.commit_log.close, self.checkpoint.close):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort; the original error matters
                pass
        for fd in (self._write_lock_fd, self._open_lock_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _close_services(self) -> None:
        """Release what the layers above hold, under the write lock (overridden there)."""

    def _release_services(self) -> None:
        """Release what the layers above hold without writing a file (the store was removed
        or replaced: its path is another store's now); overridden there."""

    def replaced_error(self, problem: str) -> StoreReplacedError:
        """Stop writing to this store for good: ``problem`` says how it was removed or
        replaced.  Returns the error to raise."""
        self.replaced = problem
        return StoreReplacedError(
            f"store {self.root} {problem} while this process had it open; this process "
            "stopped writing to it, so that nothing it holds is written into another store. "
            "Open the store at this path again to use what is there now (messages "
            "acknowledged by the old store are in its files only if they were kept)")

    def check_identity(self) -> None:
        """Raise :class:`~store.base.errors.StoreReplacedError` when the store directory was
        removed or replaced since this process opened it (one ``stat``)."""
        if self.replaced is not None:
            raise self.replaced_error(self.replaced)
        problem = self.identity.problem()
        if problem is not None:
            raise self.replaced_error(problem)

    def close(self) -> None:
        """Flush everything and release the store; the last process out removes ``abort``."""
        if self._closed:
            return
        if not self._started:
            self._release()
            return
        self.flusher.stop()
        self.key_indexer.stop()
        if self.replaced is None:
            self.replaced = self.identity.problem()
        if self.replaced is not None:  # write nothing into whatever is at the path now
            self._closed = True
            self._release_services()
            self._lease.close()
            self._close_files()
            os.close(self._write_lock_fd)
            os.close(self._open_lock_fd)
            return
        with self._write_locked(catch_up=False):
            self._close_services()
            self.key_index.build(self.confirmed_offset())  # a clean close leaves none behind
            self.key_index.seal()  # (another process's first use then needs no check)
            self.flusher.flush()
            self.key_index.flush()
            write_queue_table(self)
            in_progress = self.checkpoint.get("write_in_progress") != -1
        if try_flock(self._open_lock_fd, fcntl.LOCK_EX) and not in_progress:
            try:
                os.unlink(os.path.join(self.root, MARKER_FILE))
            except FileNotFoundError:
                pass
        fcntl.flock(self._open_lock_fd, fcntl.LOCK_UN)
        self._lease.close()
        self._close_files()
        os.close(self._write_lock_fd)
        os.close(self._open_lock_fd)

    # ------------------------------------------------------------------ topics
    def ensure_topic(self, topic: str) -> int:
        """Create ``topic`` when missing (under the append lock); return its queue count.
        Topics never change or go, so a known one needs no re-read of ``topics.json``."""
        count = self.topic_table.cached_queue_count(topic)
        if count is not None:
            return count
        with self._write_locked():
            count = self.topic_table.queue_count(topic)
            if count is None:
                count = self.dispatcher.system_queue_count(topic)
                if count is None:
                    count = default_queue_count(topic, self.config.default_queue_count)
                self.topic_table.create(topic, count, self.now_ms())
            return count

    def queue_count_for(self, topic: str) -> int:
        """The queue count of ``topic``, or the one it gets when created (creates nothing:
        work that may never be committed, such as a sink's staging, routes with it)."""
        count = self.topic_table.cached_queue_count(topic) or self.topic_table.queue_count(topic)
        if count is None:
            count = self.dispatcher.system_queue_count(topic)
        return count if count is not None else default_queue_count(
            topic, self.config.default_queue_count)

    def tags_code(self, topic: str, properties: Mapping[str, str],
                  store_timestamp_ms: int) -> int:
        """The ConsumeQueue tagsCode of a record (a registered rule, else the tag hash)."""
        return self.dispatcher.tags_code(topic, properties, store_timestamp_ms)

    def has_tags_rule(self, topic: str) -> bool:
        """Whether ``topic``'s tagsCode comes from a registered rule rather than its tag."""
        return self.dispatcher.has_rule(topic)

    def tag_hashes(self, tags: Sequence[str | None]) -> np.ndarray:
        """The tagsCodes of plain records with these tags (one hash per distinct tag)."""
        return self.dispatcher.tag_hashes(tags)

    def next_queue(self, topic: str, queue_count: int) -> int:
        """The next queue of ``topic`` in this process's round robin."""
        with self._thread_lock:
            return self.appender.next_queue(topic, queue_count)

    # ------------------------------------------------------------------ appending
    def append(self, specs: Sequence[RecordSpec], *, batch: bool = False) -> list[AppendResult]:
        """Append records (already validated and rewritten by the producer or a service).

        Queue ids of ``None`` are chosen round robin.  With ``batch``, the records share one
        store time and, when they fit, one segment (RocketMQ moves a batch to the next file
        whole).  Returns where each record landed, in order.
        """
        self._check_writable()
        if not specs:
            return []
        with self._write_locked():
            return self.appender.append(specs, batch=batch)

    def append_one(self, topic: str, body: bytes, properties: bytes, tags: str | None = None,
                   flag: int = 0, born_timestamp_ms: int = 0,
                   queue_id: int | None = None) -> SingleAppend:
        """Append one plain record (the single-send path: :meth:`Appender.prepare_one
        <store.core.appender.Appender.prepare_one>` without the lock, then
        :meth:`Appender.append_one <store.core.appender.Appender.append_one>` under it).

        ``topic`` is validated, ``body`` the validated body, ``properties`` the encoded
        properties string; ``tags`` gives the ConsumeQueue tagsCode; ``queue_id`` of
        ``None`` picks the next queue round robin.  The same bytes as :meth:`append` of one
        :class:`RecordSpec`, at a fraction of its cost.
        """
        if self._closed or self.flusher.error is not None:
            self._check_writable()
        one = self.appender.prepare_one(topic, body, properties, tags, flag, born_timestamp_ms,
                                        queue_id)
        outermost = self._lock(True, True)  # with a lease: the next send skips the flock
        try:
            done = self.appender.append_one(one)
            end = self.appender.write_offset
            acks = self.replica_acks  # (under the lock: see _await_replicas)
        except BaseException:
            self._unlock(outermost)
            raise
        self._unlock(outermost)
        if outermost and acks is not None:
            self._await_replicas(end, acks)
        return done

    def append_batch(self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes], *,
                     tags: Sequence[str | None] | None = None, flags=0,
                     born_timestamp_ms: int = 0, queue_id: int | None = None,
                     sys_flag: int = 0, born_host: bytes = LOCALHOST,
                     born_port: int = 0) -> BatchAppendResult:
        """Append records of one topic to one queue at once (the vectorised batch path).

        Byte for byte what :meth:`append` with ``batch=True`` writes for the same records, but
        without a :class:`RecordSpec` per record: headers are one NumPy array, each segment
        gets one write, queue entries one block.

        Parameters
        ----------
        topic : str
            A validated topic whose tagsCode comes from the tag (a system topic with a tagsCode
            rule of its own goes through :meth:`append`).
        bodies, properties : sequence of bytes, or ByteColumn
            The validated bodies and each record's encoded properties string (either as a
            :class:`~store.formats.byte_columns.ByteColumn`: its bytes are used as they are).
        tags : sequence of str or None, optional
            Each record's tag, for the ConsumeQueue tagsCode.
        flags : int or sequence of int
            The records' user flags.
        queue_id : int, optional
            The queue; ``None`` picks the next one round robin.

        Returns the queue, the first queue offset and each record's CommitLog offset
        (:class:`BatchAppendResult`).
        """
        self._check_writable()
        if self.dispatcher.has_rule(topic):
            raise InvalidMessageError(
                f"append_batch cannot index {topic!r} (its tagsCode comes from its "
                "properties); use append()")
        n = len(bodies)
        if n == 0 or len(properties) != n:
            raise InvalidMessageError(
                f"append_batch needs as many properties ({len(properties)}) as bodies ({n}), "
                "at least one")
        with self._write_locked():
            return self.appender.append_batch(
                topic, bodies, properties, tags=tags, flags=flags,
                born_timestamp_ms=born_timestamp_ms, queue_id=queue_id, sys_flag=sys_flag,
                born_host=born_host, born_port=born_port)

    def append_encoded(self, records: EncodedRecords) -> EncodedAppend:
        """Append records given as columns (see :class:`~store.core.append_types.EncodedRecords`):
        assembled and placed under the write lock."""
        self._check_writable()
        if not len(records.headers):
            raise InvalidMessageError("append_encoded needs at least one record")
        with self._write_locked():
            return self.appender.append_encoded(records)

    def append_assembled(self, records: AssembledRecords) -> EncodedAppend:
        """Append records :meth:`assemble_encoded` made (outside the lock, maybe on another
        thread): only their placement is done under the write lock."""
        self._check_writable()
        if not len(records):
            raise InvalidMessageError("append_assembled needs at least one record")
        with self._write_locked():
            return self.appender.append_assembled(records)

    def assemble_encoded(self, records: EncodedRecords, *, allocate: Allocate | None = None,
                         presume: Presume | None = None) -> AssembledRecords:
        """Encode records given as columns into their CommitLog bytes, all but the fields
        the append writes (queue id and offset, physical offset, store time).

        Takes no lock and may run on any thread, beside appends: writers encode the next
        chunk of a large append while this one is written (:meth:`append_assembled` takes
        the result).  Raises :class:`MessageTooLargeError` when a record breaks a limit.
        ``allocate(records, sizes)`` returns the buffer the records are encoded into (see
        :func:`~store.core.write_placement.assemble_unplaced`); ``presume``: see
        :meth:`placement_chain`.
        """
        if not len(records.headers):
            raise InvalidMessageError("assemble_encoded needs at least one record")
        return self.appender.assemble(records, allocate=allocate, presume=presume)

    def max_record_bytes(self) -> int:
        """The largest record an append takes, in bytes (a message at
        ``max_message_size_bytes`` with room for its properties, within a segment)."""
        return self.appender.max_record

    # ------------------------------------------------------------------ flushing
    def flush(self) -> None:
        """Make everything appended so far durable and record it in the checkpoint.

        Runs beside appends (``fdatasync`` needs no append lock); the checkpoint's
        ``flushed_phy_offset`` only moves forward, and only after the data below it is on disk.
        Raises :class:`FlushError` when the background flush failed since the last call.
        """
        self._check_writable()
        self.flusher.flush()

    # ------------------------------------------------------------------ retention
    def rebuild_queues(self, progress=None) -> RebuildResult:
        """Rebuild every ConsumeQueue and the topic table from the CommitLog (``rmq repair``;
        :mod:`store.core.queue_rebuild`, with its ``progress``): nothing is deleted, no record removed.
        Best run while no other process uses the store (its readers see queues empty a moment)."""
        self._check_writable()
        with self.write_lock():
            result = rebuild_queues(self, progress)
            write_queue_table(self)
            return result

    def rebuild_key_index(self) -> tuple[list[str], bool]:
        """Check the message-key index file by file and rebuild it from the CommitLog when
        one is damaged, or when it is missing (``rmq repair``; see
        :meth:`~store.core.key_index.KeyIndex.rebuild`).  Returns the names the damaged
        files were set aside as (never deleted) and whether the index was rebuilt."""
        self._check_writable()
        with self.write_lock():
            return self.key_index.rebuild(self.confirmed_offset())

    def clean_expired_files(self, *, force: bool = False, below: int | None = None) -> int:
        """Delete CommitLog segments older than ``file_reserved_time_hours``; return how many.

        See :mod:`store.core.retention`: never the newest segment, never a segment holding a
        delayed message not yet delivered or an open half message (not even with ``force``);
        queue files and minimum offsets follow, and the retention listeners are told the new
        CommitLog minimum.  ``below`` (a replica set's follower, whose leader keeps nothing
        below that offset): delete instead the segments that end at or below it, whatever
        their age (the leader's retention chose them, its services' needs counted).
        """
        self._check_writable()
        with self.write_lock():
            return delete_expired_segments(self, self._retention_listeners, force=force,
                                           guards=self._retention_guards, below=below)
