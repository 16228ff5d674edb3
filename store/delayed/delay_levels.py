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

Progress: ``config/delayOffset.json`` = ``{"offsetTable": {level: next offset},
"dataVersion": {...}, "deliverMark": -1, "storeId": "<the store's id>", "savedAt": <the
CommitLog's end when saved>, "seal": "<crc32 of the offsets, savedAt and storeId>",
"lastCopies": {level: [from, to]: the CommitLog range the copy of the level's last delivered
entry was appended in, a hint}}`` written
atomically in fastjson's text, as RocketMQ writes it (:mod:`store.files.broker_files`: integer
keys unquoted, other fields kept); it is read leniently.  A file that names another store, or
whose mark or offsets point past the CommitLog or their queues, is not used: the progress is
rebuilt from the queues (from their first entries, with a mark, as for a lost file).  A run saves
``deliverMark`` before appending and clears it with the new offsets, so a run that died in
between is redone without delivering anything twice.

The file is derived and never trusted blindly: only the version this process saved itself
(same inode, time and size) is used as it is.  Any other (another process's, a restored
backup, a stale ``.bak``, an edited or damaged file) is checked against the CommitLog before a
run delivers from it: every delivered copy carries its source's CommitLog offset
(``__RMQ_DELAY_ORIGIN``), so the run collects the origins of the records appended since the
file was saved (``savedAt``, when its seal holds) or, for a file whose seal is broken or that
has none, since the oldest source the file calls undelivered, and skips those sources, as a
run that died is redone (:func:`~store.delayed.delivery.origins_since`).  A set-back offset
therefore delivers nothing twice and heals with the run's save.  The normal path costs one
``stat`` per run; another process's file costs one compiled scan of what was appended since
that process saved.

Such a file is checked forward too (:meth:`ScheduleService._check_forward`): the entries it
calls delivered must have delivered copies, found from the file's ``lastCopies`` hint, from
what this process saw at its own last save, or by probing back from the offset
(:mod:`store.delayed.delivered_prefix`); an offset moved past them is lowered, with a mark,
so the entries without a copy are delivered once, when due.  A RocketMQ broker's copies
carry no origin: the first save in a store writes an owner mark
(``config/delayOffset.json.rmq``, ``{"brokerOffsets": {...}, "crc": ...}``) holding the
offsets of the broker's file it replaced (empty for a store rmq made); the entries below
them count as delivered.  A file without rmq's fields in a store with no mark is a broker's,
taken as it is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import zlib
from dataclasses import dataclass

import numpy as np

from ..files.crash_points import crash_point
from ..files.broker_files import read_lenient_json, write_config
from ..formats.record_codec import RecordSpec
from ..files.consume_queue import live_mask
from ..core.ports import StorePort
from ..base.errors import InvalidDelayError
from ..formats.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    SCHEDULE_TOPIC,
)
from .delivered_prefix import OriginScan, copy_in, delivered_prefix
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


#: The owner mark next to ``delayOffset.json`` (see the module docstring).
OWNER_MARK_SUFFIX = ".rmq"


def _int_or(value: object, default: int) -> int:
    """``value`` as an int, or ``default`` when it is missing or not a number."""
    try:
        return int(value) if value is not None and not isinstance(value, bool) else default
    except (TypeError, ValueError):
        return default

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


@dataclasses.dataclass
class _Progress:
    offsets: dict[int, int]
    mark: int = -1
    counter: int = 0
    #: the CommitLog's end when the file was saved (-1: unknown, or the seal is broken)
    saved_at: int = -1
    #: the file is the version this process saved last (no check against the CommitLog)
    trusted: bool = False
    #: level -> the CommitLog range the copy of its last delivered entry was appended in (a
    #: hint that makes the check of a file from an earlier process cheap; never trusted)
    copies: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)


def _seal(offsets: dict[int, int], saved_at: int, store_id: object) -> str:
    """The check value of a saved progress: crc32 of its offsets, ``savedAt`` and store id."""
    text = json.dumps([sorted((int(k), int(v)) for k, v in offsets.items()), saved_at,
                       store_id], separators=(",", ":"))
    return f"{zlib.crc32(text.encode()):08x}"


def _stamp(path: str) -> tuple[int, int, int] | None:
    """What identifies one version of the file (any replace or edit changes it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class DelayLevelService:
    """Delivery of the 4.x delay levels of one store (see the module docstring)."""

    def __init__(self, store: StorePort) -> None:
        self.store = store
        self.levels = store.config.delay_levels_ms
        self.path = os.path.join(store.root, "config", "delayOffset.json")
        #: Damaged queue entries a rebuild was tried for (delayed.routing.rebuilt_after_holes).
        self._tried: set = set()
        #: queue entries this object's runs moved past (delivered, or skipped as replaced,
        #: cancelled or already delivered): see ``TimerService.handled``
        self.handled = 0
        #: the stamp of the file this process saved last (see :meth:`_load`)
        self._saved_stamp: tuple[int, int, int] | None = None
        #: what this process knew when it saved last: ``(CommitLog offset, offsets)``, every
        #: copy of an entry from those offsets on lies at or after that offset
        self._known: tuple[int, dict[int, int]] | None = None
        #: the stamp of the last file not saved here that was checked, and what it gave
        self._checked: tuple[tuple[int, int, int] | None, _Progress] | None = None
        #: the owner mark's broker offsets (None: not read yet, or no mark yet)
        self._broker: dict[int, int] | None = None
        #: RocketMQ's offsets read from a broker's file, kept for the owner mark
        self._adopted: dict[int, int] = {}
        #: the copies :meth:`pending_count` leaves out: ``(scanned from, to, origins)``
        self._uncounted: tuple[int, int, np.ndarray] | None = None
        if not os.path.exists(self.path) and not os.path.exists(self.path + ".bak"):
            with store.write_lock():
                if read_lenient_json(self.path) is None:
                    self._save(self._lost())  # a new store: empty table, no mark

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
    def _load(self) -> _Progress:
        """Read ``delayOffset.json`` (the caller holds the write lock)."""
        stamp = _stamp(self.path)
        trusted = self._saved_stamp is not None and stamp == self._saved_stamp
        if not trusted and self._checked is not None and self._checked[0] == stamp \
                and stamp is not None:
            return dataclasses.replace(self._checked[1],
                                       offsets=dict(self._checked[1].offsets))
        progress = self._read(trusted)
        if not progress.trusted:
            for level, floor in (self._broker_floor() or {}).items():
                # entries a RocketMQ broker delivered before rmq took the store over (its
                # copies carry no origin): a file set back below them is damage
                if progress.offsets.get(level, 0) < floor:
                    progress.offsets[level] = floor
            self._checked = (stamp, dataclasses.replace(progress,
                                                        offsets=dict(progress.offsets)))
        return progress

    def _read(self, trusted: bool) -> _Progress:
        """The progress the file holds, checked (see :meth:`_load`)."""
        data = read_lenient_json(self.path)
        if not isinstance(data, dict) or not isinstance(data.get("offsetTable"), dict):
            return self._lost()
        offsets = {}
        damaged = False
        for key, value in data["offsetTable"].items():
            try:
                offsets[int(key)] = int(value)
            except (TypeError, ValueError):
                damaged = True
        version = data.get("dataVersion") or {}
        progress = _Progress(offsets, _int_or(data.get("deliverMark"), -1),
                             _int_or(version.get("counter"), 0)
                             if isinstance(version, dict) else 0)
        saved_at = _int_or(data.get("savedAt"), -1)
        copies = data.get("lastCopies")
        for key, span in (copies.items() if isinstance(copies, dict) else ()):
            if isinstance(span, list) and len(span) == 2:
                level, lo, hi = _int_or(key, 0), _int_or(span[0], -1), _int_or(span[1], -1)
                if 0 <= lo <= hi:
                    progress.copies[level] = (lo, hi)
        if not damaged and data.get("seal") == _seal(offsets, saved_at,
                                                     data.get("storeId")):
            progress.saved_at = saved_at
        progress.trusted = trusted and progress.saved_at >= 0
        if data.get("storeId") not in (None, self.store.store_id):
            log.warning("%s belongs to another store (%s; this one is %s): the delay levels' "
                        "progress is rebuilt from their queues", self.path,
                        data.get("storeId"), self.store.store_id)
            rebuilt = self._lost()
            rebuilt.counter = progress.counter
            return rebuilt
        self._drop_impossible(progress)
        if not progress.trusted:
            if self._broker_floor() is None and not any(
                    name in data for name in ("storeId", "seal", "savedAt")):
                # a RocketMQ broker's file, before rmq saved one here: its deliveries carry
                # no origins; its offsets are taken (and kept in the owner mark)
                self._adopted = dict(progress.offsets)
            else:
                self._check_forward(progress)
        return progress

    def _check_forward(self, progress: _Progress) -> None:
        """Lower every level's offset a file not saved by this process moved past what the
        CommitLog shows delivered (:mod:`store.delayed.delivered_prefix`), with a mark from
        which the run collects the copies found, so the entries without one are delivered
        once and those with one are skipped."""
        store = self.store
        confirmed = store.confirmed_offset()
        known = self._known if self._known is not None and self._known[0] <= confirmed \
            else None
        broker = self._broker_floor() or {}
        scan = OriginScan(store)
        lowered = []
        for level, claimed in sorted(progress.offsets.items()):
            if not 1 <= level <= len(self.levels):
                continue
            queue = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            # entries below RocketMQ's offsets were delivered by the broker (no origins)
            first = max(queue.first_index(), broker.get(level, 0))
            copies_from = None
            if known is not None:
                first = max(first, known[1].get(level, 0))
                copies_from = known[0]
            if copies_from is None and level in progress.copies \
                    and copy_in(store, queue, claimed, progress.copies[level]):
                continue  # the copy of the entry below the offset is where the file says
            really = delivered_prefix(queue, first, claimed, scan, copies_from)
            if really < claimed:
                progress.offsets[level] = really
                lowered.append(f"level {level}: {claimed} -> {really}")
        if lowered:
            log.warning("%s: offsets past what the CommitLog holds delivered (%s): the entries "
                        "without a delivered copy are delivered when due", self.path,
                        ", ".join(lowered))
            progress.mark = scan.start if progress.mark < 0 else min(progress.mark, scan.start)

    def _broker_floor(self) -> dict[int, int] | None:
        """The owner mark's broker offsets (``{}`` for a store rmq made), or ``None`` when
        rmq has not saved the file in this store yet (no mark)."""
        if self._broker is None:
            data = read_lenient_json(self.path + OWNER_MARK_SUFFIX)
            if data is None and not os.path.exists(self.path + OWNER_MARK_SUFFIX):
                return None
            table = data.get("brokerOffsets") if isinstance(data, dict) else None
            if not isinstance(table, dict) or data.get("crc") != _seal(table, 0, None):
                log.warning("%s%s is damaged: no delay-level entry is taken as delivered by a "
                            "RocketMQ broker", self.path, OWNER_MARK_SUFFIX)
                table = {}
            self._broker = {int(k): int(v) for k, v in table.items()}
        return self._broker

    def _drop_impossible(self, progress: _Progress) -> None:
        """Restart every level whose saved offset lies past its queue from the queue's first
        entry, with a mark, as for a lost file (what it delivered already is not delivered
        again); a mark past the CommitLog's end is moved back to it.  Such a file was written
        for another CommitLog (a process that had a removed store open, a restored backup of
        another store): trusting it would skip every message of that level."""
        store = self.store
        confirmed = store.confirmed_offset()
        starts = []
        for level, offset in list(progress.offsets.items()):
            if not 1 <= level <= len(self.levels):
                continue
            queue = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            end = queue.max_offset(confirmed)
            if 0 <= offset <= end:
                continue
            log.warning("%s: the offset %d of delay level %d is not within its queue (0 to "
                        "%d): the level restarts from its first entry", self.path, offset,
                        level, end)
            del progress.offsets[level]
            first = queue.first_index()
            head = read_queue_entries(queue, first, min(first + 1, end))
            if len(head):
                starts.append(int(head["offset"][0]))
        if progress.mark > confirmed:
            log.warning("%s: the delivery mark %d is past the CommitLog's end %d", self.path,
                        progress.mark, confirmed)
            starts.append(confirmed)
            progress.mark = -1
        if starts:
            mark = max(min(starts), store.commit_log.min_offset())
            progress.mark = mark if progress.mark < 0 else min(progress.mark, mark)

    def _lost(self) -> _Progress:
        """No progress file: start at each queue's beginning, skipping what was delivered."""
        store = self.store
        starts = []
        for level in range(1, len(self.levels) + 1):
            queue = store.consume_queue(SCHEDULE_TOPIC, level - 1)
            first = queue.first_index()
            maxo = queue.max_offset(store.confirmed_offset())
            e = read_queue_entries(queue, first, min(first + 1, maxo))
            if len(e):
                starts.append(int(e["offset"][0]))
        mark = max(min(starts), store.commit_log.min_offset()) if starts else -1
        return _Progress({}, mark, 0)

    def _save(self, progress: _Progress) -> None:
        progress.counter += 1
        offsets = {int(k): int(v) for k, v in sorted(progress.offsets.items())}
        saved_at = self.store.confirmed_offset()
        crash_point("delay_levels.offset_save", "before")
        write_config(self.path, {
            "offsetTable": offsets,
            "dataVersion": {"counter": progress.counter, "stateVersion": 0,
                            "timestamp": self.store.now_ms()},
            "deliverMark": progress.mark,
            "storeId": self.store.store_id,
            "savedAt": saved_at,
            "seal": _seal(offsets, saved_at, self.store.store_id),
            "lastCopies": {int(k): list(v) for k, v in sorted(progress.copies.items())},
        })
        self._saved_stamp = _stamp(self.path)
        self._known = (progress.mark if progress.mark >= 0 else saved_at, offsets)
        crash_point("delay_levels.offset_save", "after")
        if self._broker is None and self._broker_floor() is None:
            # after the first save: the file is rmq's from now on (see the module docstring)
            broker = {int(k): int(v) for k, v in sorted(self._adopted.items())}
            write_config(self.path + OWNER_MARK_SUFFIX,
                         {"brokerOffsets": broker, "crc": _seal(broker, 0, None)})
            self._broker = broker

    def retention_floor(self) -> int | None:
        """The CommitLog offset of the oldest delay-level message not yet delivered."""
        store = self.store
        progress = self._load()
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
            return dict(self._load().offsets)

    # ------------------------------------------------------------------ delivering
    def deliver_due(self, max_messages: int | None = None) -> int:
        """Deliver the delay-level messages due by now; return how many.

        ``max_messages`` bounds the queue entries one call handles (``None``: every due one);
        a bounded call stops inside a level's queue and the next call goes on from there.
        """
        store = self.store
        budget = None if max_messages is None else max(1, int(max_messages))
        with store.write_lock():
            progress = self._load()
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
                self._save(progress)  # a run that dies now is redone from the same start
                redo = True
            if not redo:
                progress.mark = confirmed
                self._save(progress)  # durable before anything is appended
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
            self._save(progress)
            release_commitlog_pages(store)
            return delivered

    def _unverified_since(self, progress: _Progress, work: list, confirmed: int) -> int | None:
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
    def _pending_ranges(self, progress: _Progress, confirmed: int) -> list:
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

    def _copies_not_counted(self, progress: _Progress, ranges: list,
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
            progress = self._load()
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
            progress = self._load()
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
