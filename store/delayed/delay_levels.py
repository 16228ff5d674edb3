"""4.x delay levels (RocketMQ's ScheduleMessageService), driven by ``store.deliver_due()``.

Send (:meth:`DelayLevelService.rewrite`): a message sent with ``delay_level=L`` is stored in
``SCHEDULE_TOPIC_XXXX`` queue ``L - 1`` (a level above the table is clamped to the last one)
with ``DELAY``, ``REAL_TOPIC`` and ``REAL_QID``; the store indexes it with
tagsCode = store time + the level's delay, its due time.  Each level's queue is therefore in
due-time order.

Delivery (:meth:`DelayLevelService.deliver_due`): for each level, the entries from the saved
offset on whose tagsCode is at or before now are restored to their real topic and queue, many
records per append, with ``__RMQ_DELIVER_MS`` = the due time and the origin (see
:mod:`store.delayed.delivery`); delivery stops at the first entry not yet due.  The restored
record keeps the stored properties (``DELAY``, ``REAL_TOPIC``, ``REAL_QID`` included, as
RocketMQ's does; users never see system properties).  A record gone to retention is skipped,
and one whose real topic is the transaction half topic is dropped, as in RocketMQ.

Differences from RocketMQ, on purpose: an entry due "more than one level-delay in the
future" (a clock that went backwards) is not treated as due now, since nothing may surface
early; and there is no 1 s first delay or 100 ms polling, since the caller decides when to run.

Progress: each level's next queue offset, in ``config/delayOffset.json`` as RocketMQ keeps it,
read, checked against the CommitLog and saved by
:class:`~store.delayed.delay_offset_file.DelayOffsetFile` (its module says what the file
holds and when a file is trusted).  A run saves ``deliverMark`` before appending and clears it
with the new offsets, so a run that died in between is redone without delivering anything
twice.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import numpy as np

from ..files.broker_files import read_lenient_json
from ..formats.record_codec import RecordSpec
from ..files.consume_queue import live_mask
from ..core.ports import StorePort
from ..base.errors import InvalidDelayError
from ..formats.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    SCHEDULE_TOPIC,
)
from .delay_offset_file import DelayOffsetFile, DelayProgress
from .restore import restore
from .delivery import (
    check_headroom,
    entries_without_record,
    origins_since,
    read_queue_entries,
    rebuilt_after_holes,
    release_commitlog_pages,
    routed_properties,
)

#: Queue entries examined per step.
SCHEDULE_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class LevelDelivery:
    """What the delay levels hand to :func:`~store.delayed.restore.restore`: each record's
    due time (its tagsCode); no pair of their own, nothing re-put, nothing superseded."""

    due: np.ndarray

    reads = sets = ()
    requeue_topic = None

    def part(self, rows: slice) -> LevelDelivery:
        return LevelDelivery(np.asarray(self.due[rows], dtype=np.int64))

    def requeued(self, n: int) -> np.ndarray:
        return np.zeros(n, dtype=bool)

    def due_ms(self, pairs, now: int) -> np.ndarray:
        return self.due

    def set_values(self, pairs, now: int, requeued: np.ndarray):
        n = len(self.due)
        return np.zeros((0, n), dtype=np.int64), np.zeros((0, n), dtype=bool)

    def superseded(self, pairs, keep: np.ndarray) -> None:
        return None


log = logging.getLogger("store")


def deliver_time(levels_ms: tuple[int, ...], level: int, store_timestamp_ms: int) -> int:
    """RocketMQ's due time of a level-``level`` message stored at that time (its tagsCode)."""
    if level <= 0:
        return store_timestamp_ms + 1000
    return store_timestamp_ms + levels_ms[min(level, len(levels_ms)) - 1]


def register_schedule_topic(port: StorePort) -> None:
    """Make ``SCHEDULE_TOPIC_XXXX`` known to the core: one queue per level, and records
    indexed by their due time (the tagsCode rule)."""
    levels = port.config.delay_levels_ms

    def tags_code(properties, store_timestamp_ms: int) -> int | None:
        level = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        return None if level is None else deliver_time(levels, int(level), store_timestamp_ms)

    port.register_system_topic(SCHEDULE_TOPIC, len(levels), tags_code)


class DelayLevelService:
    """Delivery of the 4.x delay levels of one store (see the module docstring)."""

    def __init__(self, store: StorePort) -> None:
        self.store = store
        self.levels = store.config.delay_levels_ms
        #: the progress file (``config/delayOffset.json``), read and saved under the write lock
        self.offset_file = DelayOffsetFile(store)
        self.path = self.offset_file.path
        #: Damaged queue entries a rebuild was tried for (delayed.routing.rebuilt_after_holes).
        self._tried: set = set()
        #: queue entries this object's runs moved past (delivered, or skipped as replaced,
        #: cancelled or already delivered): see ``TimerService.handled``
        self.handled = 0
        #: the copies :meth:`pending_count` leaves out: ``(scanned from, to, origins)``
        self._uncounted: tuple[int, int, np.ndarray] | None = None
        if not os.path.exists(self.path) and not os.path.exists(self.path + ".bak"):
            with store.write_lock():
                if read_lenient_json(self.path) is None:
                    # a new store: empty table, no mark
                    self.offset_file.save(self.offset_file.lost())

    # ------------------------------------------------------------------ sending
    def rewrite(self, spec: RecordSpec, level: int) -> tuple[RecordSpec, int]:
        """Turn a message with delay ``level`` (>= 1) into a ``SCHEDULE_TOPIC_XXXX`` record.

        Returns the rewritten spec and its approximate due time (now + the level's delay;
        the exact one is computed from the store time when it is appended).
        """
        if isinstance(level, bool) or not isinstance(level, int) or level < 1:
            raise InvalidDelayError(f"delay_level={level!r}; allowed: an int >= 1")
        level = min(level, len(self.levels))
        store = self.store
        props = routed_properties(store, spec)
        props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        check_headroom(store, props)
        rewritten = dataclasses.replace(spec, topic=SCHEDULE_TOPIC, queue_id=level - 1,
                                        properties=props)
        return rewritten, store.now_ms() + self.levels[level - 1]

    # ------------------------------------------------------------------ progress
    def retention_floor(self) -> int | None:
        """The CommitLog offset of the oldest delay-level message not yet delivered."""
        store = self.store
        progress = self.offset_file.load()
        confirmed = store.confirmed_offset()
        floors = []
        for level in range(1, len(self.levels) + 1):
            queue = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            start = max(progress.offsets.get(level, 0), queue.first_index())
            if start < queue.max_offset(confirmed):
                head = read_queue_entries(queue, start, start + 1)
                if len(head):
                    floors.append(int(head["offset"][0]))
        return min(floors) if floors else None

    def offsets(self) -> dict[int, int]:
        """Level -> next queue offset to deliver (a copy)."""
        with self.store.write_lock():
            return dict(self.offset_file.load().offsets)

    # ------------------------------------------------------------------ delivering
    def deliver_due(self, max_messages: int | None = None) -> int:
        """Deliver the delay-level messages due by now; return how many.

        ``max_messages`` bounds the queue entries one call handles (``None``: every due one);
        a bounded call stops inside a level's queue and the next call goes on from there.
        """
        store = self.store
        budget = None if max_messages is None else max(1, int(max_messages))
        with store.write_lock():
            progress = self.offset_file.load()
            now = store.now_ms()
            confirmed = store.confirmed_offset()
            work = []
            for level in range(1, len(self.levels) + 1):
                queue = store.consume_queue(SCHEDULE_TOPIC, level - 1)
                maxo = queue.max_offset(confirmed)
                start = max(progress.offsets.get(level, 0), queue.first_index())
                if start >= maxo:
                    continue
                head = read_queue_entries(queue, start, start + 1)
                if len(head) and int(head["tags_code"][0]) <= now:
                    work.append((level, queue, start, maxo))
            if not work and progress.mark < 0:
                return 0
            done = np.empty(0, np.int64)
            redo = progress.mark >= 0  # a run that died: redone, skipping what it delivered
            since = None if progress.trusted else self._unverified_since(progress, work,
                                                                          confirmed)
            if since is not None:  # a file not ours: checked against the CommitLog first
                progress.mark = since if progress.mark < 0 else min(progress.mark, since)
                self.offset_file.save(progress)  # a run that dies now is redone from the same start
                redo = True
            if not redo:
                progress.mark = confirmed
                self.offset_file.save(progress)  # durable before anything is appended
            else:
                done = origins_since(store, progress.mark)
            stopped = False  # the budget ended this run before the due heads were all read
            delivered = 0
            for level, queue, start, maxo in work:
                if budget is not None:
                    if budget <= 0:
                        stopped = True
                        break
                    stopped = stopped or start + budget < maxo
                    maxo = min(maxo, start + budget)
                    budget -= maxo - start
                off, n, span = self._deliver_level(level, queue, start, maxo, now, done)
                progress.offsets[level] = off
                delivered += n
                self.handled += off - start
                if off > start:  # the hint follows the offset (or is dropped)
                    progress.copies.pop(level, None)
                    if span is not None:
                        progress.copies[level] = span
            store.flush()  # the deliveries are durable before the offsets that claim them
            if not (redo and stopped):
                # (a redo the budget stopped keeps the dead run's mark: that run may have
                # delivered entries past where this one stopped, and the next must skip them)
                progress.mark = -1
            self.offset_file.save(progress)
            release_commitlog_pages(store)
            return delivered

    def _unverified_since(self, progress: DelayProgress, work: list, confirmed: int) -> int | None:
        """Where the delivered copies a file not saved by this process may not know of
        begin (``None``: nowhere, nothing of it is due).

        A sealed file saved at ``savedAt`` knows of every copy appended before it; copies
        appended since are what a restored backup, a stale ``.bak`` or another process's
        newer runs leave out.  Without a valid seal (edited, damaged, written before seals,
        or by RocketMQ) nothing the file says is taken: the copies of any due source may lie
        anywhere after the oldest one, where the origins are collected from.
        """
        if 0 <= progress.saved_at <= confirmed:
            return progress.saved_at if progress.saved_at < confirmed else None
        starts = [int(read_queue_entries(queue, start, start + 1)["offset"][0])
                  for _, queue, start, _ in work]
        if not starts:
            return None
        log.warning("%s: its seal does not hold (edited, damaged or written before seals): "
                    "the delay levels' offsets are checked against the CommitLog",
                    self.path)
        return max(min(starts), self.store.commit_log.min_offset())

    def _deliver_level(self, level: int, queue, start: int, maxo: int, now: int,
                       done: np.ndarray) -> tuple[int, int]:
        """Deliver the due head of one level's queue; return ``(next offset, delivered, the
        CommitLog range the last entry's copy was appended in or None)``."""
        store = self.store
        log = store.commit_log
        delivered = 0
        off = start
        span = None
        while off < maxo:
            e = read_queue_entries(queue, off, min(maxo, off + SCHEDULE_CHUNK))
            if not len(e):
                break
            suspect = (e["size"] == 0) | entries_without_record(
                store, e, live_mask(e, log.min_offset()))
            if rebuilt_after_holes(store, SCHEDULE_TOPIC, level - 1, e, off, suspect,
                                   self._tried):
                queue = store.consume_queue(SCHEDULE_TOPIC, level - 1)  # the rebuilt one
                continue
            due = e["tags_code"] <= now
            k = len(e) if due.all() else int(np.argmin(due))
            if k == 0:
                break
            head = e[:k]
            live = live_mask(head, log.min_offset())
            if len(done):
                live &= ~np.isin(head["offset"], done)
            before = store.confirmed_offset()
            result = restore(store, head["offset"][live].astype(np.int64),
                             LevelDelivery(head["tags_code"][live].astype(np.int64)), now=now)
            delivered += result.delivered
            # the last entry's copy, if it got one, lies in what this restore appended
            span = (before, store.confirmed_offset()) if live[-1] else None
            off += k
            if k < len(e):
                break
        return off, delivered, span

    # ------------------------------------------------------------------ housekeeping
    def _pending_ranges(self, progress: DelayProgress, confirmed: int) -> list:
        """``(queue, start, end)`` of each level's entries from its offset to its end."""
        store = self.store
        ranges = []
        for level in range(1, len(self.levels) + 1):
            queue = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            maxo = queue.max_offset(confirmed)
            start = max(progress.offsets.get(level, 0), queue.first_index())
            if start < maxo:
                ranges.append((queue, start, maxo))
        return ranges

    def _copies_not_counted(self, progress: DelayProgress, ranges: list,
                            confirmed: int) -> np.ndarray:
        """The sources with a delivered copy that ``progress`` may still call pending: the
        copies a run that died appended (from its mark), and those a file not saved by this
        process may not know of (:meth:`_unverified_since`); empty on the normal path."""
        starts = [progress.mark] if progress.mark >= 0 else []
        if not progress.trusted:
            if 0 <= progress.saved_at <= confirmed:
                starts.append(progress.saved_at)
            elif ranges:  # no seal: the copies may lie anywhere after the oldest source
                starts.append(min(int(read_queue_entries(q, a, a + 1)["offset"][0])
                                  for q, a, _ in ranges))
        if not starts or min(starts) >= confirmed:
            return np.empty(0, np.int64)
        start = max(min(starts), self.store.commit_log.min_offset())
        cached = self._uncounted
        if cached is None or cached[0] != start or cached[1] > confirmed:
            cached = (start, start, np.empty(0, np.int64))
        if cached[1] < confirmed:  # (extended by what was appended since: stats poll this)
            more = origins_since(self.store, cached[1], confirmed)
            cached = (start, confirmed, np.union1d(cached[2], more))
        self._uncounted = cached
        return cached[2]

    def _pending_entries(self, ranges: list, done: np.ndarray):
        """Yield the entries of ``ranges`` without a delivered copy in ``done``, in chunks."""
        for queue, start, end in ranges:
            for lo in range(start, end, SCHEDULE_CHUNK):
                e = read_queue_entries(queue, lo, min(end, lo + SCHEDULE_CHUNK))
                yield e[~np.isin(e["offset"], done)] if len(done) else e

    def pending_count(self) -> int:
        """Delay-level messages stored but not yet delivered (exactly: the entries a
        set-back offset, or a run that died, left with a delivered copy are not counted)."""
        store = self.store
        with store.write_lock():
            progress = self.offset_file.load()
            confirmed = store.confirmed_offset()
            ranges = self._pending_ranges(progress, confirmed)
            done = self._copies_not_counted(progress, ranges, confirmed)
            if not len(done):  # the normal path: the offsets say it
                return sum(end - start for _, start, end in ranges)
            return sum(len(e) for e in self._pending_entries(ranges, done))

    def pending_due_ms(self) -> np.ndarray:
        """Due times (ms) of every stored delay-level message not yet delivered."""
        store = self.store
        out = [np.empty(0, np.int64)]
        with store.write_lock():
            progress = self.offset_file.load()
            confirmed = store.confirmed_offset()
            ranges = self._pending_ranges(progress, confirmed)
            done = self._copies_not_counted(progress, ranges, confirmed)
            out.extend(e["tags_code"].astype(np.int64)
                       for e in self._pending_entries(ranges, done))
        return np.concatenate(out)

    def on_retention(self, commitlog_min: int) -> None:
        """Nothing to do: offsets are clamped to the queue when read."""

    def close(self) -> None:
        """Nothing to release: progress is saved by every run."""
