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
from typing import Callable, Iterator, Mapping

import numpy as np

from .checkpoint import StoreCheckpoint
from .codec import (MessageIdGenerator)
from .commit_log import CommitLog
from .config import LAYOUT_FIELDS, StoreConfig
from .consume_queue import ConsumeQueue
from .errors import (ConfigMismatchError, InvalidConfigError, StoreClosedError,
                     StoreNotFoundError, UnknownTopicError)
from .message import (is_system_topic)
from .topics import TopicTable, read_json, system_queue_count, write_json_atomic

Clock = Callable[[], int]


def system_clock() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


from .append import AppendMixin, AppendResult, BatchAppendResult  # noqa: E402,F401
from .reading import ReadMixin, record_view  # noqa: E402,F401


class MessageStore(AppendMixin, ReadMixin):
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

    def deliver_due(self, max_messages: int | None = None) -> int:
        """Move delayed messages due by now into their real topics; return how many.

        ``max_messages`` (``None``: all) bounds the work of one call, so that a caller can
        interleave delivery with reading; repeated calls deliver every due message exactly
        once (delay levels first, then the timer wheel).
        """
        self._check_open()
        if max_messages is None:
            return self.schedule.deliver_due() + self.timer.deliver_due()
        delivered = self.schedule.deliver_due(max_messages)
        if delivered >= max_messages:
            return delivered
        return delivered + self.timer.deliver_due(max_messages - delivered)

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
