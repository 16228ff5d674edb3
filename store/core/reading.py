"""Reading a store: queues, pull, offsets by time, Arrow batches.

:class:`ReadableStore` is what a writable :class:`~store.core.store_core.StoreCore` and a
read-only :class:`~store.facade.store_reader.StoreReader` share: the store's files and every read.  It
takes no lock: it reads ``confirm_phy_offset`` first and never looks at bytes past it, so it
never sees a partly written record.

**The visible end.**  Every read takes its upper bound from one method,
:meth:`ReadableStore.visible_offset`: the confirmed end, or less when a *read bound* is set
(:attr:`ReadableStore.read_bound`).  A served replica sets one on the readers its clients
use: its high watermark, the CommitLog offset enough replicas hold
(:mod:`store.replication.watermark`), so that nothing a client read can be cut from the log
by a change of leader.  The store's own services (delivery of due messages, check rounds,
replication) take :meth:`ReadableStore.confirmed_offset`, the whole log.  A store opened
alone has no bound and pays nothing for it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..files.checkpoint import StoreCheckpoint
from ..formats.record_codec import Record
from ..files.commit_log import CommitLog
from ..base.config import LAYOUT_FIELDS, StoreConfig
from ..files.consume_queue import ConsumeQueue
from ..base.errors import (
    ConfigMismatchError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    StoreClosedError,
    UnknownTopicError,
)
from ..files.fileio import read_json
from ..formats.message import MessageView, is_system_topic, record_view
from ..files.topics import TopicTable
from .arrow_decode import read_queue_batch
from .following import follow_one
from .format_version import FORMAT_VERSION, check_readable, migrate, recorded_version
from .identity import is_store_id
from .key_index import KeyIndex
from .read_checks import record_entry_problem
from .store_layout import layout_from_files, recorded_layout, write_layout
from .verify import VerifyReport, verify_commitlog

Clock = Callable[[], int]
log = logging.getLogger("store")


def system_clock() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class ReadableStore:
    """The files of a store directory and every read of them (see the module docstring).

    Subclasses call :meth:`_open_files` from their constructor.
    """

    root: str
    config: StoreConfig
    read_only: bool = True
    #: The CommitLog offset this store's readers see records below, besides the confirmed
    #: end (``read_bound()``; ``None`` from it: the confirmed end), or ``None``: no bound
    #: (see the module docstring).
    read_bound: Callable[[], int | None] | None = None
    #: How long a read of queue offsets past the bound waits for the bound to pass them (s).
    read_bound_wait_s: float = 0.0

    def _open_files(self, path: str, config: StoreConfig | Mapping | None,
                    clock: Clock | None, *, record_layout: bool) -> None:
        self.root = os.path.abspath(path)
        # an rmq store of an earlier checkpoint layout (see store.files.checkpoint): before the
        # layout record of a new store is written
        legacy = os.path.isfile(os.path.join(self.root, "config", "store.json"))
        self.config = self._resolve_config(config, record_layout=record_layout)
        recorded = read_json(os.path.join(self.root, "config", "store.json"), recorded_layout)
        #: The id recorded when the store was created (:mod:`store.core.identity`); ``None``
        #: for a store no rmq has written to since ids exist (a RocketMQ store read-only).
        self.store_id: str | None = (recorded["store_id"] if recorded is not None
                                     and is_store_id(recorded.get("store_id")) else None)
        self.now_ms: Clock = clock or system_clock
        self.commit_log = CommitLog(os.path.join(self.root, "commitlog"),
                                    self.config.commitlog_file_size_bytes,
                                    read_only=self.read_only)
        self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"),
                                          writable=not self.read_only, legacy_layout=legacy)
        self.key_index = KeyIndex(self.root, self.config, self.commit_log, self.checkpoint,
                                  read_only=self.read_only)
        self.topic_table = TopicTable(os.path.join(self.root, "config", "topics.json"),
                                      os.path.join(self.root, "consumequeue"))
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        #: Queues compared with the CommitLog after a damaged read, by CommitLog end.
        self._healed: dict[tuple[str, int], int] = {}
        self._closed = False

    def _resolve_config(self, config: StoreConfig | Mapping | None, *,
                        record_layout: bool) -> StoreConfig:
        """The settings to use: ``config`` with the layout recorded at creation winning."""
        if config is None:
            config = StoreConfig()
        elif isinstance(config, Mapping):
            config = StoreConfig.from_dict(dict(config))
        elif not isinstance(config, StoreConfig):
            raise InvalidConfigError(
                f"config={config!r}; allowed: a StoreConfig, a dict of its fields, or None")
        path = os.path.join(self.root, "config", "store.json")
        recorded = read_json(path, recorded_layout)
        #: The on-disk format version (store.core.format_version): newer ones are refused.
        self.format_version = recorded_version(recorded)
        check_readable(self.root, self.format_version)
        if recorded is not None and record_layout and self.format_version < FORMAT_VERSION:
            self.format_version = migrate(self.root, self.format_version)
            write_layout(path, recorded["layout"], recorded.get("created_ms"),
                         recorded.get("store_id"))
        if recorded is None and os.path.exists(path):
            log.warning("%s (and its .bak) is damaged: the layout is taken from the files "
                        "and the settings given", path)
        elif recorded is not None and record_layout and not os.path.exists(path + ".bak"):
            write_layout(path, recorded["layout"], recorded.get("created_ms"),
                         recorded.get("store_id"))
        if recorded is not None:
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
        found = layout_from_files(self.root)  # a store another system wrote (RocketMQ)
        if found:
            config = config.replace(**found)
        if record_layout:
            write_layout(path, config.layout(), system_clock())
        return config

    def _close_files(self) -> None:
        self._closed = True
        for q in self._queues.values():
            q.close()
        self.key_index.close()
        self.commit_log.close()
        self.checkpoint.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:  # overridden by the writable core
        """Release the store's files (idempotent); later calls raise ``StoreClosedError``."""
        if not self._closed:
            self._close_files()

    # ------------------------------------------------------------------ topics and queues
    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The :class:`ConsumeQueue` object of a queue (created lazily; files on first write)."""
        key = (topic, queue_id)
        q = self._queues.get(key)
        if q is None:
            q = ConsumeQueue(os.path.join(self.root, "consumequeue"), topic, queue_id,
                             self.config.consume_queue_file_entries, read_only=self.read_only)
            self._queues[key] = q
        return q

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
        """CommitLog offset up to which records are complete and indexed.

        From the checkpoint when rmq wrote it; otherwise (a store written by RocketMQ, or a
        damaged checkpoint, opened read-only) where the valid records end.
        """
        if self.checkpoint.trusted_now():
            return self.checkpoint.get("confirm_phy_offset")
        return self.commit_log.valid_end()

    def visible_offset(self) -> int:
        """CommitLog offset below which readers see records: :meth:`confirmed_offset`, or
        the read bound when one is set and lower (see the module docstring)."""
        end = self.confirmed_offset()
        bound = self.read_bound
        if bound is None:
            return end
        limit = bound()
        return end if limit is None or limit >= end else max(0, limit)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the newest visible message of the queue (0 for an empty queue)."""
        self._check_open()
        return self._check_queue(topic, queue_id).max_offset(self.visible_offset())

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest offset still readable (retention moves it forward)."""
        self._check_open()
        queue = self._check_queue(topic, queue_id)
        return queue.min_offset(self.commit_log.min_offset(), self.visible_offset())

    def queue_bounds(self, queues: Iterable[tuple[str, int]]
                     ) -> dict[tuple[str, int], tuple[int, int]]:
        """``{(topic, queue_id): (min_offset, max_offset)}`` of many queues at once.

        What :meth:`min_offset` and :meth:`max_offset` give for each, with the topic table
        and the confirmed end read once for all of them: a streaming query's driver asks
        this of every subscribed queue at every micro-batch.  Raises
        :class:`UnknownTopicError` for a queue that does not exist.
        """
        self._check_open()
        table = self.topic_table.reload()
        confirmed = self.visible_offset()
        self.commit_log.files.refresh()  # retention in another process moves the minimum
        commitlog_min = self.commit_log.min_offset()
        out = {}
        for topic, queue_id in queues:
            count = self.topic_table.cached_queue_count(topic) if topic in table else None
            if count is None or not isinstance(queue_id, (int, np.integer)) \
                    or not 0 <= int(queue_id) < count:
                self._check_queue(topic, queue_id)  # raises the error naming what exists
            queue = self.consume_queue(topic, int(queue_id))
            high = queue.max_offset(confirmed)
            out[(topic, queue_id)] = (queue.min_offset(commitlog_min, confirmed, max_offset=high),
                                      high)
        return out

    def all_consume_queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) with files on disk, system topics included."""
        root = os.path.join(self.root, "consumequeue")
        out = []
        for topic in sorted(os.listdir(root)) if os.path.isdir(root) else ():
            tdir = os.path.join(root, topic)
            if not os.path.isdir(tdir):
                continue
            for q in sorted(os.listdir(tdir)):
                if q.isdigit():
                    out.append((topic, int(q)))
        return out

    def disk_usage_bytes(self) -> int:
        """Bytes the store's files occupy on disk (allocated blocks, sparse files counted so)."""
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    # ------------------------------------------------------------------ reading
    def read_record(self, commitlog_offset: int) -> Record:
        """Decode the record at a CommitLog offset."""
        self._check_open()
        return self.commit_log.read_record(commitlog_offset)

    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, *,
             verify_crc: bool = False) -> list[MessageView]:
        """Up to ``max_messages`` messages of a queue from ``offset`` on.

        Returns ``[]`` at the end of the queue.  Raises :class:`OffsetOutOfRangeError` for an
        offset below :meth:`min_offset` (removed by retention) or above :meth:`max_offset`,
        and :class:`CorruptRecordError` (file and offset) for a record that does not match
        its queue entry or, with ``verify_crc``, whose body fails its CRC, or for a queue
        offset whose damaged record recovery did not index; the messages before such a
        record are returned first, and the pull from its offset raises.
        """
        try:
            views, damaged = self._pull(topic, queue_id, offset, max_messages, verify_crc)
            if not damaged or not self._heal(topic, queue_id):
                return views
        except CorruptRecordError:
            if not self._heal(topic, queue_id):
                raise
        return self._pull(topic, queue_id, offset, max_messages, verify_crc)[0]

    def follow(self, topic: str, *, start: str = "latest", poll_interval_s: float = 0.2,
               stop: Callable[[], bool] | None = None, deliver_due: bool = False
               ) -> Iterator[MessageView]:
        """Every message of ``topic``, queue by queue in order, as it becomes visible.

        ``start`` ``"latest"`` (only new messages) or ``"earliest"``; once every queue is
        read to its end, ``stop()`` (if given) ends the iteration by returning true, else
        the follower waits ``poll_interval_s`` and looks again; ``deliver_due`` runs
        :meth:`deliver_due` each round (a writable store) so that due delayed messages
        surface.  See :func:`store.core.following.follow_members`.
        """
        return follow_one(self, topic, start=start, poll_interval_s=poll_interval_s,
                          stop=stop, deliver_due=deliver_due)

    def heal_queue(self, topic: str, queue_id: int) -> bool:
        """Compare a queue with the CommitLog and rebuild it when the queue is what is
        damaged (:mod:`store.core.queue_healing`); whether it was rebuilt (read again).  For
        services that meet a damaged entry outside :meth:`pull` (due delivery)."""
        return self._heal(topic, queue_id)

    def _heal(self, topic: str, queue_id: int) -> bool:
        """After a read met damage: rebuild the queue when it is what is damaged
        (:mod:`store.core.queue_healing`); whether it was (retry the read)."""
        from .queue_healing import heal_queue

        return heal_queue(self, topic, int(queue_id), self._healed)

    def _pull(self, topic: str, queue_id: int, offset: int, max_messages: int,
              verify_crc: bool) -> tuple[list[MessageView], bool]:
        """:meth:`pull`'s messages, and whether it stopped early at damage."""
        self._check_open()
        if not isinstance(max_messages, int) or max_messages <= 0:
            raise InvalidMessageError(f"max_messages={max_messages!r}; allowed: an int >= 1")
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            raise OffsetOutOfRangeError(f"offset={offset!r}; allowed: an int queue offset")
        offset = int(offset)
        queue = self._check_queue(topic, queue_id)
        limit = self.visible_offset()
        maxo = queue.max_offset(limit)
        mino = queue.min_offset(self.commit_log.min_offset(), limit)
        if offset < mino or offset > maxo:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}/{queue_id} is out of range; allowed: {mino} to {maxo}"
                + (" (older messages were removed by retention)" if offset < mino else ""))
        entries = queue.entries(offset, min(maxo, offset + max_messages))
        views = []
        for i, (phys, size, _) in enumerate(entries.tolist()):
            if size <= 0:  # a hole: recovery found this queue offset's record damaged
                problem, where = (f"queue offset {offset + i} of {topic}/{queue_id} has no "
                                  "entry (its record was damaged and not indexed)"), None
            else:
                try:
                    rec = self.commit_log.read_record(phys)
                except CorruptRecordError:  # its segment is gone, or the record unreadable
                    if views:
                        return views, True
                    raise
                problem = record_entry_problem(rec, int(queue_id), offset + i, size, phys,
                                               verify_crc=verify_crc)
                where = phys
                if problem is None:
                    try:
                        views.append(record_view(rec, offset + i))
                        continue
                    except ValueError as exc:  # a damaged number among the properties
                        problem = f"cannot decode its properties: {exc}"
            if views:  # the messages before the damaged one are served; the next pull
                return views, True  # (from the damaged offset) raises
            if where is None:
                raise CorruptRecordError(queue.directory, offset + i, problem)
            raise CorruptRecordError(self.commit_log.files.find(where).path, where, problem)
        return views, False

    def query_messages(self, topic: str, key: str | None = None, begin_ms: int | None = None,
                       end_ms: int | None = None, max: int = 64
                       ) -> list[MessageView]:
        """Messages of ``topic`` by key and/or store time (RocketMQ's ``queryMessage``).

        With ``key``: the messages carrying it (in ``KEYS`` or as their ``UNIQ_KEY``), found
        through the message-key index, in CommitLog order; without: the messages stored in
        ``[begin_ms, end_ms]`` (both inclusive, ``None``: open), in store-time order, each
        queue binary-searched on store time.  At most ``max``.  Raises
        :class:`~store.base.errors.KeyIndexUnavailableError` for a key on a store that keeps no
        index (see :mod:`store.core.queries`).
        """
        from .queries import query_messages

        return query_messages(self, topic, key, begin_ms, end_ms, max)

    def view_message(self, msg_id: str, *, topic: str | None = None) -> MessageView | None:
        """The message of ``msg_id`` (RocketMQ's ``viewMessage``), ``None`` when no visible
        record has it: an offset message id (``offset_message_id``: store host and CommitLog
        offset) is decoded to its record; a unique key (``SendResult.msg_id``) is looked up
        in the message-key index, under ``topic`` or every topic of the store (the copy in
        a user topic wins for a delayed or transactional message stored twice)."""
        from .queries import view_message

        return view_message(self, msg_id, topic)

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
        queue = self.consume_queue(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            entry = queue.entry(mid)
            assert entry is not None
            if self.commit_log.store_timestamp(entry[0]) < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def verify_commitlog(self, progress=None) -> VerifyReport:
        """Check the structure and body CRC of every CommitLog record up to the confirmed
        end (``rmq stats --verify``); changes nothing; ``progress(bytes done, bytes total)``
        after each segment.  See :mod:`store.core.verify`."""
        self._check_open()
        return verify_commitlog(self, progress)

    def read_arrow(self, topic: str, queue_id: int, start: int, end: int, *,
                   tags: Iterable[str] | None = None, columns: Sequence[str] | None = None,
                   verify_crc: bool = False, skip_corrupt: bool = False):
        """Decode queue offsets ``[start, end)`` into a ``pyarrow.RecordBatch`` (vectorised).

        Columns follow :data:`store.MESSAGE_SCHEMA`, or are the ``columns`` named, in that
        order (only those are decoded).  ``tags`` keeps only messages whose tag is one of
        them (filtered on tagsCode before any body is read).  ``verify_crc`` checks every
        body against its CRC; ``skip_corrupt`` drops records failing a check instead of
        raising :class:`CorruptRecordError`.  A queue file found damaged is rebuilt from the
        CommitLog first (in memory for a read-only store, :mod:`store.core.queue_healing`).
        """
        self._check_open()
        if self.read_bound is not None and end > start and self.read_bound() is not None:
            self._await_visible(topic, queue_id, int(end))

        def read(skip: bool):
            return read_queue_batch(self, topic, queue_id, start, end, tags=tags,
                                    columns=columns, verify_crc=verify_crc, skip_corrupt=skip)

        try:  # strictly first: damage is then seen, and a damaged queue rebuilt
            return read(False)
        except CorruptRecordError:
            if not self._heal(topic, queue_id) and not skip_corrupt:
                raise
            return read(skip_corrupt)

    def _await_visible(self, topic: str, queue_id: int, end: int) -> None:
        """With a read bound: return once queue offsets below ``end`` are visible, waiting
        up to :attr:`read_bound_wait_s` for the bound to move (a reader that planned its
        range on another replica, whose bound was ahead of this one's);
        :class:`OffsetOutOfRangeError` past it."""
        queue = self._check_queue(topic, queue_id)
        deadline = time.monotonic() + self.read_bound_wait_s
        while (visible := queue.max_offset(self.visible_offset())) < end:
            if time.monotonic() >= deadline:
                written = queue.max_offset(self.confirmed_offset())
                raise OffsetOutOfRangeError(
                    f"queue offsets up to {end} of {topic}/{queue_id} are not readable yet: "
                    f"readers see up to {visible} (the high watermark: what enough replicas "
                    f"hold{'; the queue holds ' + str(written) if written > visible else ''}); "
                    f"allowed: end <= {visible}, or read again once the replicas hold more")
            time.sleep(0.005)
