"""MessageStore: the store's public face (open, append, read, recover, retain).

Directory tree under the store root::

    commitlog/{20-digit offset}                 CommitLog segments (store.commit_log)
    consumequeue/{topic}/{queueId}/{20-digit}   ConsumeQueues (store.consume_queue)
    checkpoint                                  shared positions (store.checkpoint)
    abort                                       crash marker: present while any process has it open
    lock, open.lock                             append lock; open-count lock
    config/store.json                           layout settings recorded at creation
    config/topics.json                          topics and queue counts (store.topics)
    config/delayOffset.json, timer*, transaction*   delay levels, timer, transactions

Concurrency: any number of processes may open one directory.  Appends take a ``flock`` on
``lock`` (and a thread lock), so they are serialised across processes; before appending, a
writer catches up with what other processes wrote (``write_generation``) and repairs the tail a
dead writer left (``write_in_progress``).  Readers take no lock: they read ``confirm_phy_offset``
first and never look at bytes past it, so they never see a partly written record.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import codec
from .checkpoint import StoreCheckpoint
from .codec import (TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK,
                    MessageIdGenerator, Record, RecordSpec)
from .commit_log import CommitLog
from .config import LAYOUT_FIELDS, StoreConfig
from .consume_queue import ConsumeQueue
from .errors import (ConfigMismatchError, InvalidConfigError, InvalidMessageError,
                     MessageTooLargeError, OffsetOutOfRangeError, StoreClosedError,
                     StoreNotFoundError, UnknownTopicError)
from .message import (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_DELIVER_MS, PROPERTY_KEYS,
                      PROPERTY_TAGS, PROPERTY_TRANSACTION_ID, PROPERTY_UNIQ_KEY, SCHEDULE_TOPIC,
                      SYSTEM_PROPERTY_NAMES, MessageView, is_system_topic)
from .message import PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_TIMER_OUT_MS, TIMER_TOPIC
from .topics import TopicTable, read_json, system_queue_count, write_json_atomic

Clock = Callable[[], int]


def system_clock() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where one record landed."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class BatchAppendResult:
    """Where the records of :meth:`MessageStore.append_batch` landed.

    Record ``i`` has queue offset ``first_queue_offset + i`` (-1 when not indexed: prepared
    or rolled-back transaction records) and CommitLog offset ``commitlog_offsets[i]``.
    """

    topic: str
    queue_id: int
    first_queue_offset: int
    commitlog_offsets: np.ndarray
    sizes: np.ndarray
    store_timestamp_ms: int


class MessageStore:
    """A file-backed RocketMQ-style message store.

    Use :meth:`open` (or ``with MessageStore.open(path) as store``).  See the package
    docstring of :mod:`store` for the whole API.
    """

    # ------------------------------------------------------------------ opening and closing
    @classmethod
    def open(cls, path: str | os.PathLike, config: StoreConfig | None = None, *,
             clock: Clock | None = None, flush_service: bool = True,
             read_only: bool = False) -> "MessageStore":
        """Open (creating when missing) the store at ``path``; recover it after a crash.

        Parameters
        ----------
        path : str or path-like
            The store directory.
        config : StoreConfig, optional
            Settings; layout settings recorded in an existing store win (see
            :class:`StoreConfig`).
        clock : callable, optional
            Returns "now" in epoch ms; tests pass a controllable one.
        flush_service : bool
            Run the background flush thread (every ``flush_interval_commitlog_ms``).
        read_only : bool
            Open an existing store for reading only (what Spark executors do): no marker,
            no recovery, no flush thread, no writes; appends raise :class:`StoreError`.
        """
        return cls(os.fspath(path), config, clock=clock, flush_service=flush_service,
                   read_only=read_only)

    def __init__(self, path: str, config: StoreConfig | None = None, *,
                 clock: Clock | None = None, flush_service: bool = True,
                 read_only: bool = False) -> None:
        self.root = os.path.abspath(path)
        self._closed = True
        self.read_only = read_only
        if read_only:
            self._init_read_only(config, clock)
            return
        for sub in ("commitlog", "consumequeue", "config"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        self.config = self._resolve_config(config)
        self.now_ms: Clock = clock or system_clock
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        flags = os.O_RDWR | os.O_CREAT
        self._write_lock_fd = os.open(os.path.join(self.root, "lock"), flags, 0o644)
        self._open_lock_fd = os.open(os.path.join(self.root, "open.lock"), flags, 0o644)
        self.commit_log = CommitLog(os.path.join(self.root, "commitlog"),
                                    self.config.commitlog_file_size_bytes)
        self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"))
        self.topic_table = TopicTable(os.path.join(self.root, "config", "topics.json"))
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queue_next: dict[tuple[str, int], int] = {}
        self._round_robin: dict[str, itertools.count] = {}
        self._tags_code_cache: dict[str, int] = {}
        self._generation = -1
        self._write_offset = 0
        self._flush_lock = threading.Lock()
        self._flushed_generation = -1
        self.id_generator = MessageIdGenerator()
        self._closed = False
        self.recovered = False

        try:
            self._join_and_recover()
            self._start_services(flush_service)
        except BaseException:
            self._release()  # do not keep the open lock (others would wait forever)
            raise

    def _join_and_recover(self) -> None:
        """Join the processes that have the store open; recover it when that is needed."""
        # Am I the only process with the store open?  Then an ``abort`` marker is a crash.
        # The open lock is held (exclusive when alone, else shared) before the marker is
        # written, so a process closing at the same moment cannot delete a newcomer's marker;
        # a sole opener keeps it exclusive until recovery is done, so others wait for it.
        sole = _try_flock(self._open_lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not sole:
            fcntl.flock(self._open_lock_fd, fcntl.LOCK_SH)
        abort_path = os.path.join(self.root, "abort")
        crashed = sole and os.path.exists(abort_path)
        # Same boot as the crashed process: the checkpoint in the page cache is exact, so
        # an append it had not confirmed is dropped whole.  After a reboot it may be stale:
        # keep every valid record (as RocketMQ does), since a synchronous send may have been
        # acknowledged after the checkpoint page last reached the disk.
        same_boot = crashed and _read_text(abort_path).split()[1:] == [_BOOT_ID] and _BOOT_ID
        with open(abort_path, "w") as fh:
            fh.write(f"{os.getpid()} {_BOOT_ID}")
        with self._write_locked(catch_up=False):
            confirm = self.checkpoint.get("confirm_phy_offset")
            if crashed:
                self._recover(self.checkpoint.get("flushed_phy_offset"),
                              limit=confirm if same_boot else None)
            elif self.checkpoint.get("write_in_progress") != -1:
                self._recover(confirm, limit=confirm)
            elif sole:
                from .recovery import verify_tail

                if verify_tail(self):
                    self.recovered = True
            self._catch_up(force=True)
        if sole:
            fcntl.flock(self._open_lock_fd, fcntl.LOCK_SH)  # downgrade: others may join now

    def _start_services(self, flush_service: bool) -> None:
        """Build the services on the core and start the flush thread."""
        # Services built on the core (delay levels, timer wheel, transactions).
        from .schedule import ScheduleService
        from .timer.service import TimerService
        from .transaction.service import TransactionService

        self.schedule = ScheduleService(self)
        self.timer = TimerService(self)
        self.transactions = TransactionService(self)

        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if flush_service:  # in SYNC_FLUSH too: it makes queues durable and bounds recovery
            self._flusher = threading.Thread(target=self._flush_loop, name="rmq-flush", daemon=True)
            self._flusher.start()

    def _release(self) -> None:
        """Give back the files and locks of a store whose opening failed."""
        self._closed = True
        for close in (self.commit_log.close, self.checkpoint.close):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort; the original error matters
                pass
        for fd in (self._write_lock_fd, self._open_lock_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _init_read_only(self, config: StoreConfig | None, clock: Clock | None) -> None:
        if not os.path.isfile(os.path.join(self.root, "config", "store.json")):
            raise StoreNotFoundError(
                f"{self.root} is not an rmq store (no config/store.json); give the directory "
                "a producer wrote to")
        self.config = self._resolve_config(config)
        self.now_ms = clock or system_clock
        self._thread_lock = threading.RLock()
        self.commit_log = CommitLog(os.path.join(self.root, "commitlog"),
                                    self.config.commitlog_file_size_bytes)
        self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"))
        self.topic_table = TopicTable(os.path.join(self.root, "config", "topics.json"))
        self._queues = {}
        self._queue_next = {}
        self._tags_code_cache = {}
        self._closed = False
        self.recovered = False

    def _resolve_config(self, config: StoreConfig | Mapping | None) -> StoreConfig:
        if config is None:
            config = StoreConfig()
        elif isinstance(config, Mapping):
            config = StoreConfig.from_dict(dict(config))
        elif not isinstance(config, StoreConfig):
            raise InvalidConfigError(
                f"config={config!r}; allowed: a StoreConfig, a dict of its fields, or None")
        path = os.path.join(self.root, "config", "store.json")
        recorded = read_json(path)
        if isinstance(recorded, dict) and isinstance(recorded.get("layout"), dict):
            layout = {k: v for k, v in recorded["layout"].items() if k in LAYOUT_FIELDS}
            differing = {k: (getattr(config, k), v) for k, v in layout.items()
                         if getattr(config, k) != v}
            if differing and config.strict_layout:
                detail = ", ".join(f"{k}: given {a!r}, recorded {b!r}"
                                   for k, (a, b) in differing.items())
                raise ConfigMismatchError(
                    f"store {self.root} was created with other layout settings ({detail}); "
                    "open it with the recorded values or without strict_layout"
                )
            if not differing:
                return config
            wheel = layout.get("timer_wheel_slots", config.timer_wheel_slots)
            if config.timer_roll_window_slots >= wheel:
                # the given roll window belongs to another wheel size; keep it inside this one
                layout["timer_roll_window_slots"] = max(2, wheel // 4)
            return config.replace(**layout)
        write_json_atomic(path, {"layout": config.layout(), "created_ms": system_clock()})
        return config

    def close(self) -> None:
        """Flush everything and release the store; the last process out removes ``abort``."""
        if self._closed:
            return
        if self.read_only:
            self._closed = True
            for q in self._queues.values():
                q.close()
            self.commit_log.close()
            self.checkpoint.close()
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        with self._write_locked(catch_up=False):
            for service in (self.timer, self.schedule, self.transactions):
                service.close()
            self.flush()
            in_progress = self.checkpoint.get("write_in_progress") != -1
        if _try_flock(self._open_lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB) and not in_progress:
            try:
                os.unlink(os.path.join(self.root, "abort"))
            except FileNotFoundError:
                pass
        fcntl.flock(self._open_lock_fd, fcntl.LOCK_UN)
        self._closed = True
        for q in self._queues.values():
            q.close()
        self.commit_log.close()
        self.checkpoint.close()
        os.close(self._write_lock_fd)
        os.close(self._open_lock_fd)

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is closed")

    # ------------------------------------------------------------------ locking and catch-up
    @contextmanager
    def _write_locked(self, catch_up: bool = True) -> Iterator[None]:
        """Hold the append lock of this process and of the store directory."""
        with self._thread_lock:
            # Re-entrant: only the outermost holder takes and releases the file lock (an
            # inner release would let another process append inside the outer section).
            outermost = self._lock_depth == 0
            if outermost:
                fcntl.flock(self._write_lock_fd, fcntl.LOCK_EX)
            self._lock_depth += 1
            try:
                if outermost and catch_up:
                    if self.checkpoint.get("write_in_progress") != -1:
                        # The previous holder died in the middle of an append.  If it did not
                        # confirm it, drop that append whole (it was never acknowledged, and
                        # no reader saw it); a confirmed one is kept.
                        confirm = self.checkpoint.get("confirm_phy_offset")
                        self._recover(confirm, limit=confirm)
                    self._catch_up()
                yield
            finally:
                self._lock_depth -= 1
                if outermost:
                    fcntl.flock(self._write_lock_fd, fcntl.LOCK_UN)

    def write_lock(self):
        """The store's append lock as a context manager (re-entrant within a process).

        Services hold it across a read-decide-append step so that concurrent processes do
        not deliver the same message twice.
        """
        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.root} was opened read_only")
        return self._write_locked()

    def _catch_up(self, force: bool = False) -> None:
        generation = self.checkpoint.get("write_generation")
        if force or generation != self._generation:
            self._generation = generation
            self._write_offset = self.checkpoint.get("confirm_phy_offset")
            self._queue_next.clear()
            self.commit_log.files.refresh()
            self.topic_table.reload()

    def _recover(self, start_offset: int, limit: int | None = None) -> None:
        from .recovery import recover_tail

        recover_tail(self, start_offset, limit=limit)
        self.recovered = True

    # ------------------------------------------------------------------ topics and queues
    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The :class:`ConsumeQueue` object of a queue (created lazily; files on first write)."""
        key = (topic, queue_id)
        q = self._queues.get(key)
        if q is None:
            q = ConsumeQueue(os.path.join(self.root, "consumequeue"), topic, queue_id,
                             self.config.consume_queue_file_entries)
            self._queues[key] = q
        return q

    def _ensure_topic(self, topic: str) -> int:
        count = self.topic_table.queue_count(topic)
        if count is None:
            count = system_queue_count(topic, len(self.config.delay_levels_ms))
            if count is None:
                count = self.config.default_queue_count
            self.topic_table.create(topic, count, self.now_ms())
        return count

    def _ensure_topic_cached(self, topic: str) -> int:
        """:meth:`_ensure_topic` without re-reading ``topics.json`` for a known topic.

        Safe under the append lock: topics are never changed or removed, and a topic another
        process created is found by :meth:`TopicTable.create`, which re-reads the file.
        """
        cfg = self.topic_table._topics.get(topic)
        if cfg is not None:
            return int(cfg["writeQueueNums"])
        return self._ensure_topic(topic)

    def _ensure_topic_locked(self, topic: str) -> int:
        """Create ``topic`` if needed (under the append lock); return its queue count."""
        count = self.topic_table.queue_count(topic)
        if count is not None:
            return count
        with self._write_locked():
            return self._ensure_topic(topic)

    def next_queue(self, topic: str, queue_count: int) -> int:
        """The next queue of ``topic`` in this process's round robin."""
        with self._thread_lock:
            return next(self._round_robin.setdefault(topic, itertools.count())) % queue_count

    def topics(self, *, include_system: bool = False) -> list[str]:
        """Names of the topics in the store (user topics unless ``include_system``)."""
        self._check_open()
        names = self.topic_table.names()
        return names if include_system else [t for t in names if not is_system_topic(t)]

    def queue_ids(self, topic: str) -> list[int]:
        """The queue ids of ``topic``; :class:`UnknownTopicError` when it does not exist."""
        self._check_open()
        count = self.topic_table.queue_count(topic)
        if count is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist in store {self.root}; "
                                    f"existing topics: {self.topics()}")
        return list(range(count))

    def _check_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        ids = self.queue_ids(topic)
        if not isinstance(queue_id, (int, np.integer)) or int(queue_id) not in ids:
            raise UnknownTopicError(
                f"queue_id {queue_id!r} does not exist for topic {topic!r}; "
                f"allowed: 0 to {len(ids) - 1}"
            )
        return self.consume_queue(topic, int(queue_id))

    def confirmed_offset(self) -> int:
        """CommitLog offset up to which records are complete and indexed."""
        return self.checkpoint.get("confirm_phy_offset")

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the newest visible message of the queue (0 for an empty queue)."""
        self._check_open()
        return self._check_queue(topic, queue_id).max_offset(self.confirmed_offset())

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest offset still readable (retention moves it forward)."""
        self._check_open()
        cq = self._check_queue(topic, queue_id)
        return cq.min_offset(self.commit_log.min_offset(), self.confirmed_offset())

    # ------------------------------------------------------------------ appending
    def append(self, specs: Sequence[RecordSpec], *, batch: bool = False) -> list[AppendResult]:
        """Append records (already validated and rewritten by the producer or a service).

        Queue ids of ``None`` are chosen round robin.  With ``batch``, the records share one
        store time and, when they fit, one segment (RocketMQ moves a batch to the next file
        whole).  Returns where each record landed, in order.
        """
        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.root} was opened read_only; appends are refused")
        if not specs:
            return []
        with self._write_locked():
            return self._append_locked(specs, batch=batch)

    def _append_locked(self, specs: Sequence[RecordSpec], *, batch: bool) -> list[AppendResult]:
        cfg = self.config
        now = self.now_ms()
        offset = self._write_offset
        encoded: list[tuple[int, bytes]] = []  # (offset, bytes) pieces, blanks included
        results: list[AppendResult] = []
        dispatch: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
        pending_next: dict[tuple[str, int], int] = {}
        max_record = cfg.max_message_size_bytes + 64 * 1024

        sized = []
        for spec in specs:
            topic_b = spec.topic.encode("ascii")
            props_b = codec.encode_properties(spec.properties)
            if len(props_b) > cfg.max_properties_size_bytes:
                raise MessageTooLargeError(
                    f"properties of a message to {spec.topic!r} are {len(props_b)} bytes; "
                    f"allowed: at most {cfg.max_properties_size_bytes}")
            size = codec.record_size(len(spec.body), len(topic_b), len(props_b))
            if size > max_record or size + codec.BLANK.size > cfg.commitlog_file_size_bytes:
                raise MessageTooLargeError(
                    f"a record of {size} bytes does not fit "
                    f"(max {min(max_record, cfg.commitlog_file_size_bytes - 8)})")
            sized.append((spec, topic_b, props_b, size))

        if batch:  # move the whole batch to the next file when it would cross the boundary
            total = sum(s[3] for s in sized)
            if total + codec.BLANK.size <= cfg.commitlog_file_size_bytes:
                start, blank = self.commit_log.place(offset, total)
                if blank is not None:
                    encoded.append((offset, blank))
                    offset = start

        for spec, topic_b, props_b, size in sized:
            start, blank = self.commit_log.place(offset, size)
            if blank is not None:
                encoded.append((offset, blank))
            queue_count = self._ensure_topic_cached(spec.topic)
            qid = spec.queue_id
            if qid is None:
                rr = self._round_robin.setdefault(spec.topic, itertools.count())
                qid = next(rr) % queue_count
            elif not 0 <= qid < queue_count:
                raise InvalidMessageError(
                    f"queue_id {qid} for topic {spec.topic!r}; allowed: 0 to {queue_count - 1}")
            key = (spec.topic, qid)
            tx_type = spec.sys_flag & TRANSACTION_TYPE_MASK
            dispatched = tx_type in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
            if dispatched:
                qoff = pending_next.get(key)
                if qoff is None:
                    qoff = self._next_queue_offset(key)
                pending_next[key] = qoff + 1
            else:
                qoff = 0  # PREPARED and ROLLBACK records are never indexed
            data = codec.encode_record(spec, queue_id=qid, queue_offset=qoff, physical_offset=start,
                                       store_timestamp_ms=now, topic_bytes=topic_b,
                                       properties_bytes=props_b)
            encoded.append((start, data))
            if dispatched:
                dispatch.setdefault(key, []).append(
                    (qoff, start, size, self._tags_code(spec.topic, spec.properties, now)))
            results.append(AppendResult(spec.topic, qid, qoff, start, size, now))
            offset = start + size

        entries = {}
        for key, rows in dispatch.items():
            _, offsets, sizes, codes = zip(*rows)
            entries[key] = (rows[0][0], offsets, sizes, codes)
        self._commit_append(self._join_pieces(encoded), entries, offset, now)
        self._queue_next.update(pending_next)
        return results

    def _commit_append(self, chunks: list[tuple[int, bytes]],
                       entries: dict[tuple[str, int], tuple], end: int, now: int) -> None:
        """Write CommitLog chunks and queue entries, then make them visible (lock held).

        ``chunks`` are ``(offset, bytes)`` writes, each inside one segment; ``entries`` maps a
        queue to ``(first queue offset, offsets, sizes, tags codes)``; ``end`` is where the
        log ends afterwards.
        """
        # Crash safety: mark the append, write, (sync), index, then publish.
        cp = self.checkpoint
        cp.set("write_in_progress", self._write_offset)
        cp.set("last_append_offset", self._write_offset)
        for off, data in chunks:
            self.commit_log.write(off, data)
        if self.config.flush_disk_type == "SYNC_FLUSH":
            self.commit_log.flush(self._write_offset)
        for key, (first, offsets, sizes, codes) in entries.items():
            self.consume_queue(*key).put(first, offsets, sizes, codes)
        cp.set("physic_msg_timestamp", now)
        cp.set("confirm_phy_offset", end)
        self._generation = cp.get("write_generation") + 1
        cp.set("write_generation", self._generation)
        cp.set("write_in_progress", -1)
        self._write_offset = end

    def append_batch(self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes], *,
                     tags: Sequence[str | None] | None = None, flags=0,
                     born_timestamp_ms: int = 0, queue_id: int | None = None,
                     sys_flag: int = 0, born_host: bytes = codec.LOCALHOST,
                     born_port: int = 0) -> "BatchAppendResult":
        """Append records of one topic to one queue at once (the vectorised batch path).

        Byte for byte what :meth:`append` with ``batch=True`` writes for the same records, but
        without a :class:`RecordSpec` per record: headers are one NumPy array, each segment
        gets one write, queue entries one block.

        Parameters
        ----------
        topic : str
            A validated topic whose tagsCode comes from the tag (not the schedule or timer
            topic, whose tagsCode comes from properties: use :meth:`append`).
        bodies : sequence of bytes
            The bodies, already validated.
        properties : sequence of bytes
            Each record's encoded properties string (:func:`store.codec.encode_properties`).
        tags : sequence of str or None, optional
            Each record's tag, for the ConsumeQueue tagsCode.
        flags : int or sequence of int
            The records' user flags.
        queue_id : int, optional
            The queue; ``None`` picks the next one round robin.

        Returns
        -------
        BatchAppendResult
            The queue, the first queue offset and each record's CommitLog offset.
        """
        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.root} was opened read_only; appends are refused")
        if topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            raise ValueError(f"append_batch cannot index {topic!r}; use append()")
        n = len(bodies)
        if n == 0 or len(properties) != n:
            raise ValueError(f"append_batch needs as many properties ({len(properties)}) as "
                             f"bodies ({n}), at least one")
        cfg = self.config
        topic_b = topic.encode("ascii")
        body_lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
        props_lengths = np.fromiter(map(len, properties), dtype=np.int64, count=n)
        if int(props_lengths.max()) > cfg.max_properties_size_bytes:
            i = int(np.argmax(props_lengths > cfg.max_properties_size_bytes))
            raise MessageTooLargeError(
                f"properties of a message to {topic!r} are {int(props_lengths[i])} bytes; "
                f"allowed: at most {cfg.max_properties_size_bytes}")
        sizes = codec.FIXED_SIZE + len(topic_b) + body_lengths + props_lengths
        max_record = min(cfg.max_message_size_bytes + 64 * 1024,
                         cfg.commitlog_file_size_bytes - codec.BLANK.size)
        if int(sizes.max()) > max_record:
            raise MessageTooLargeError(
                f"a record of {int(sizes.max())} bytes does not fit (max {max_record})")
        dispatched = (sys_flag & TRANSACTION_TYPE_MASK) in (TRANSACTION_NOT_TYPE,
                                                             TRANSACTION_COMMIT_TYPE)
        codes = None
        if dispatched:
            codes = np.zeros(n, dtype=np.int64)
            if tags is not None:
                lookup = {t: self._tag_hash(t) for t in set(tags)}
                codes = np.fromiter(map(lookup.__getitem__, tags), dtype=np.int64, count=n)
        with self._write_locked():
            now = self.now_ms()
            queue_count = self._ensure_topic_cached(topic)
            qid = queue_id
            if qid is None:
                qid = next(self._round_robin.setdefault(topic, itertools.count())) % queue_count
            elif not 0 <= qid < queue_count:
                raise InvalidMessageError(
                    f"queue_id {qid} for topic {topic!r}; allowed: 0 to {queue_count - 1}")
            key = (topic, qid)
            first = self._next_queue_offset(key) if dispatched else 0
            starts, runs, end = self._place_batch(self._write_offset, sizes)
            template = codec.batch_header_template(
                queue_id=qid, sys_flag=sys_flag, born_timestamp_ms=born_timestamp_ms,
                born_host=born_host, born_port=born_port, store_timestamp_ms=now)
            queue_offsets = first + np.arange(n, dtype=np.int64) if dispatched else 0
            pieces = codec.encode_batch(template, topic_b, list(bodies), list(properties),
                                        sizes=sizes, body_lengths=body_lengths,
                                        queue_offsets=queue_offsets, physical_offsets=starts,
                                        flags=flags)
            chunks = []
            for off, i, j, blank in runs:
                data = b"".join(pieces[5 * i:5 * j])
                chunks.append((off, data + blank if blank else data))
            entries = {key: (first, starts, sizes, codes)} if dispatched else {}
            self._commit_append(chunks, entries, end, now)
            if dispatched:
                self._queue_next[key] = first + n
        return BatchAppendResult(topic, qid, first if dispatched else -1, starts, sizes, now)

    def _place_batch(self, offset: int, sizes: np.ndarray) -> tuple[np.ndarray, list, int]:
        """Where the records of a batch go when the log ends at ``offset``.

        RocketMQ's rule: a record of length L needs L + 8 bytes left in its segment, else an
        8-byte blank closes the segment; a batch that fits a segment moves to the next one
        whole.  Returns each record's offset, the writes as ``(offset, first, stop, blank)``
        (records ``[first, stop)`` then an optional blank, all in one segment) and the new end.
        """
        file_size = self.config.commitlog_file_size_bytes
        blank_size = codec.BLANK.size
        ends = np.cumsum(sizes)
        total = int(ends[-1])
        runs: list[tuple[int, int, int, bytes]] = []
        if total + blank_size <= file_size:
            start, blank = self.commit_log.place(offset, total)
            if blank is not None:
                runs.append((offset, 0, 0, blank))
            runs.append((start, 0, len(sizes), b""))
            return start + ends - sizes, runs, start + total
        n = len(sizes)
        starts = np.empty(n, dtype=np.int64)
        i, pos = 0, offset
        while i < n:
            segment_end = pos - pos % file_size + file_size
            base = int(ends[i] - sizes[i])
            # records i..j-1 fit when each ends at least 8 bytes before the segment end
            j = int(np.searchsorted(ends, segment_end - blank_size - pos + base, side="right"))
            if j > i:
                starts[i:j] = pos + ends[i:j] - sizes[i:j] - base
                runs.append((pos, i, j, b""))
                pos += int(ends[j - 1]) - base
                i = j
            if i < n:  # the next record does not fit: close the segment with a blank
                runs.append((pos, 0, 0, codec.encode_blank(segment_end - pos)))
                pos = segment_end
        return starts, runs, pos

    def _join_pieces(self, pieces: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """Join contiguous ``(offset, bytes)`` pieces into one chunk per segment."""
        size = self.config.commitlog_file_size_bytes
        chunks: list[tuple[int, bytes]] = []
        run_start, run, run_end = 0, [], 0
        for off, data in pieces:
            if run and (off != run_end or off // size != run_start // size):
                chunks.append((run_start, b"".join(run)))
                run = []
            if not run:
                run_start = off
            run.append(data)
            run_end = off + len(data)
        if run:
            chunks.append((run_start, b"".join(run)))
        return chunks

    def _next_queue_offset(self, key: tuple[str, int]) -> int:
        nxt = self._queue_next.get(key)
        if nxt is None:
            nxt = self.consume_queue(*key).max_offset(self._write_offset)
            self._queue_next[key] = nxt
        return nxt

    def _tags_code(self, topic: str, properties, store_ts: int) -> int:
        if topic == SCHEDULE_TOPIC and PROPERTY_DELAY_TIME_LEVEL in properties:
            return self.schedule_deliver_time(int(properties[PROPERTY_DELAY_TIME_LEVEL]), store_ts)
        if topic == TIMER_TOPIC and PROPERTY_TIMER_OUT_MS in properties:
            # ours, not RocketMQ's: the timer's slot time (negated for a cancel marker), so the
            # timer enqueues from the ConsumeQueue alone (see store.timer.service)
            out = int(properties[PROPERTY_TIMER_OUT_MS])
            return -out if PROPERTY_TIMER_DEL_UNIQKEY in properties else out
        return self._tag_hash(properties.get(PROPERTY_TAGS))

    def _tag_hash(self, tags: str | None) -> int:
        """The tagsCode of a tag (0 for none), cached."""
        if not tags:
            return 0
        code = self._tags_code_cache.get(tags)
        if code is None:
            code = codec_tags_code(tags)
            if len(self._tags_code_cache) < 65536:
                self._tags_code_cache[tags] = code
        return code

    def schedule_deliver_time(self, level: int, store_ts: int) -> int:
        """RocketMQ's tagsCode of a SCHEDULE_TOPIC_XXXX record: store time + level delay."""
        levels = self.config.delay_levels_ms
        if level <= 0:
            return store_ts + 1000
        return store_ts + levels[min(level, len(levels)) - 1]

    # ------------------------------------------------------------------ flushing
    def flush(self) -> None:
        """Make everything appended so far durable and record it in the checkpoint.

        Runs beside appends (``fdatasync`` needs no append lock); the checkpoint's
        ``flushed_phy_offset`` only moves forward, and only after the data below it is on disk.
        """
        with self._flush_lock:
            confirm = self.checkpoint.get("confirm_phy_offset")
            generation = self.checkpoint.get("write_generation")
            if generation == self._flushed_generation:
                return
            self.commit_log.flush(min(self.checkpoint.get("flushed_phy_offset"), confirm))
            for q in list(self._queues.values()):
                q.flush()
            self.checkpoint.set("logics_msg_timestamp", self.checkpoint.get("physic_msg_timestamp"))
            if confirm > self.checkpoint.get("flushed_phy_offset"):
                self.checkpoint.set("flushed_phy_offset", confirm)
            self.checkpoint.flush()
            self._flushed_generation = generation

    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_commitlog_ms / 1000
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:  # pragma: no cover - keep flushing; the next round retries
                pass

    # ------------------------------------------------------------------ reading
    def read_record(self, commitlog_offset: int) -> Record:
        """Decode the record at a CommitLog offset."""
        self._check_open()
        return self.commit_log.read_record(commitlog_offset)

    def pull(self, topic: str, queue_id: int, offset: int,
             max_messages: int = 32) -> list[MessageView]:
        """Up to ``max_messages`` messages of a queue from ``offset`` on.

        Returns ``[]`` at the end of the queue.  Raises :class:`OffsetOutOfRangeError` for an
        offset below :meth:`min_offset` (removed by retention) or above :meth:`max_offset`.
        """
        self._check_open()
        if not isinstance(max_messages, int) or max_messages <= 0:
            raise InvalidMessageError(f"max_messages={max_messages!r}; allowed: an int >= 1")
        cq = self._check_queue(topic, queue_id)
        limit = self.confirmed_offset()
        maxo = cq.max_offset(limit)
        mino = cq.min_offset(self.commit_log.min_offset(), limit)
        if offset < mino or offset > maxo:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}/{queue_id} is out of range; allowed: {mino} to {maxo}"
                + (" (older messages were removed by retention)" if offset < mino else ""))
        entries = cq.entries(offset, min(maxo, offset + max_messages))
        views = []
        for i, e in enumerate(entries):
            rec = self.commit_log.read_record(int(e["offset"]))
            views.append(record_view(rec, offset + i))
        return views

    def queue_entries(self, topic: str, queue_id: int, start: int, end: int) -> np.ndarray:
        """ConsumeQueue entries ``[start, end)`` (fields ``offset``, ``size``, ``tags_code``)."""
        self._check_open()
        return self.consume_queue(topic, queue_id).entries(start, end)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is at or after ``timestamp_ms``.

        Returns :meth:`max_offset` when every message is older (RocketMQ's LOWER boundary).
        """
        self._check_open()
        lo = self.min_offset(topic, queue_id)
        hi = self.max_offset(topic, queue_id)
        cq = self.consume_queue(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            entry = cq.entry(mid)
            assert entry is not None
            if self.commit_log.store_timestamp(entry[0]) < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def read_arrow(self, topic: str, queue_id: int, start: int, end: int, *,
                   tags: Iterable[str] | None = None):
        """Decode queue offsets ``[start, end)`` into a ``pyarrow.RecordBatch`` (vectorised).

        Columns follow :data:`store.arrow_decode.MESSAGE_SCHEMA`.  ``tags`` keeps only
        messages whose tag is one of them (filtered on tagsCode before any body is read).
        """
        from .arrow_decode import read_queue_batch

        self._check_open()
        return read_queue_batch(self, topic, queue_id, start, end, tags=tags)

    # ------------------------------------------------------------------ delayed and transactional
    def producer(self, group: str = "DEFAULT_PRODUCER"):
        """A :class:`~store.producer.Producer` of ``group``."""
        from .producer import Producer

        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.root} was opened read_only; sends are refused")
        return Producer(self, group)

    def transaction_producer(self, group: str, listener):
        """A producer that sends half messages and runs ``listener``'s local transaction."""
        from .transaction.producer import TransactionProducer

        self._check_open()
        return TransactionProducer(self, group, listener)

    def deliver_due(self) -> int:
        """Move every delayed message due by now into its real topic; return how many."""
        self._check_open()
        return self.schedule.deliver_due() + self.timer.deliver_due()

    def end_transaction(self, transaction_id: str, state) -> bool:
        """Commit or roll back a half message; ``False`` when it was already ended."""
        self._check_open()
        return self.transactions.end_transaction(transaction_id, state)

    def check_transactions(self, resolve=None):
        """Run one round of the transaction check loop with ``resolve(view) -> state``.

        Without ``resolve`` the listeners of this process's transaction producers are asked.
        Returns a :class:`~store.transaction.check.CheckResult` (counts of the round).
        """
        self._check_open()
        return self.transactions.check(resolve)

    def pending_delayed_stats(self) -> dict:
        """Pending delayed messages: total, per kind, next due time and counts by due time.

        See :func:`store.stats.pending_delayed_stats` for the shape.
        """
        from .stats import pending_delayed_stats

        self._check_open()
        return pending_delayed_stats(self)

    def pending_transaction_stats(self) -> dict:
        """Open transactions (``pending``) and the oldest one's born time (``oldest_born_ms``)."""
        self._check_open()
        return self.transactions.pending_stats()

    # ------------------------------------------------------------------ retention
    def clean_expired_files(self, *, force: bool = False) -> int:
        """Delete CommitLog segments older than ``file_reserved_time_hours``; return how many.

        A segment's age is the store time of the first record of the next segment (records
        are in store-time order), so the newest segment is never deleted.  ConsumeQueue files
        whose records are all gone go too, and queue minimum offsets move forward.
        """
        from .retention import clean_expired_files

        self._check_open()
        return clean_expired_files(self, force=force)

    # ------------------------------------------------------------------ stats
    def disk_usage_bytes(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    def all_consume_queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) with files on disk, system topics included."""
        root = os.path.join(self.root, "consumequeue")
        out = []
        for topic in sorted(os.listdir(root)):
            tdir = os.path.join(root, topic)
            if not os.path.isdir(tdir):
                continue
            for q in sorted(os.listdir(tdir)):
                if q.isdigit():
                    out.append((topic, int(q)))
        return out


def codec_tags_code(tags: str) -> int:
    from .message import java_string_hash

    return java_string_hash(tags)


def record_view(rec: Record, queue_offset: int | None = None) -> MessageView:
    """The user-facing view of a record (system properties hidden)."""
    props = rec.properties
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES}
    keys = tuple(k for k in props.get(PROPERTY_KEYS, "").split(" ") if k)
    deliver = props.get(PROPERTY_DELIVER_MS)
    tx_id = props.get(PROPERTY_TRANSACTION_ID) if (
        rec.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE else None
    return MessageView(
        topic=rec.topic, queue_id=rec.queue_id,
        queue_offset=rec.queue_offset if queue_offset is None else queue_offset,
        commitlog_offset=rec.physical_offset, msg_id=props.get(PROPERTY_UNIQ_KEY, ""),
        tags=props.get(PROPERTY_TAGS), keys=keys, body=rec.body, properties=user,
        born_timestamp_ms=rec.born_timestamp_ms, store_timestamp_ms=rec.store_timestamp_ms,
        deliver_timestamp_ms=int(deliver) if deliver else None, transaction_id=tx_id,
        reconsume_times=rec.reconsume_times, sys_flag=rec.sys_flag,
        system_properties={k: v for k, v in props.items() if k in SYSTEM_PROPERTY_NAMES},
    )


def _read_text(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


#: Identifies this boot of the machine (Linux); empty where unknown.
_BOOT_ID = _read_text("/proc/sys/kernel/random/boot_id").strip()


def _try_flock(fd: int, flags: int) -> bool:
    try:
        fcntl.flock(fd, flags)
        return True
    except BlockingIOError:
        return False
