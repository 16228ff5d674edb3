"""Recurring schedules of one store: a message fired into its topic at every due time.

What one schedule is (its message, its cron expression or interval, its bounds) and what it
sends of fires it missed (its catch-up policy, ``catch_up``) is
:mod:`store.schedule.recurring_schedule`; this module keeps the schedules of a store (the
book) and fires their copies exactly once.

**Where they live.**  ``config/rmq_schedules.json`` (JSON, written atomically with a
``.bak``, as the broker's config files): every schedule with its next fire time and
the fires so far; beside it ``config/rmq_schedules.mark``, the ``deliverMark`` of a firing
step under way (a book written by an earlier version may hold it as ``deliverMark``).  Neither
is in the CommitLog, so retention never touches them.  The book is kept parsed between calls
(re-read only when another process wrote it) and written once per change or firing step.

**Firing** (:meth:`ScheduleBook.fire_due`, run by ``store.deliver_due()``, so by ``rmq serve``
and by streaming queries): under the store's write lock, every active schedule whose next
fire time is at or before now fires once per due time, never early (several due times
of one schedule: what its catch-up policy sends, :meth:`Schedule.take_due`).  A copy is a new message
of the schedule's topic (in the queue its key hashes to, so one schedule's fires keep their
order) with the properties ``RMQ_SCHEDULE_KEY`` and ``RMQ_SCHEDULE_FIRE_MS`` (the fire time),
and ``__RMQ_DELIVER_MS`` = the fire time (the ``deliver_timestamp`` column).

**Exactly once across crashes**, as the delay levels' ``deliverMark`` works: before appending
the copies, the CommitLog end is saved as the mark (the small mark file); after the copies
are flushed the new fire times are saved and the mark file removed.  Whoever next takes the
book with a mark still set (a process killed in between) first reads the records appended
since the mark, counts the copies found there as fired, and only then goes on.

**Pause, resume, remove** take the same lock, so once they return no fire of that schedule
happens that was not already written.  A resumed schedule fires from its next due time after
the resume; the fires due while it was paused are skipped.

**In a replica set** (:attr:`ScheduleBook.replicated`, set by the replica's server) the book
is recorded in the CommitLog too, so that it is copied with everything else: each write of
the book first appends one record of :data:`BOOK_TOPIC` (queue 0; the body: the book's JSON
as the file holds it), then writes the file, which names that record (``logOffset``). The
file is then a cache of the log: whoever finds a later record in the log than the one its
file names, or no file (a follower; a replica that changed role, whose file was set aside),
takes the book from the latest record and counts the fired copies appended since it as fired
(a replica sets its book's files aside at each change of role or cut of its tail once the
book was recorded, :func:`recorded_book_files`), as the mark's settlement does
(:func:`_fired_since`; incrementally, for a follower's readers). A firing step appends its
copies, then the book's record: a new leader goes on with every schedule's phase and count,
whether or not the old leader's step had reached its record. The leader records the book
again once its latest record lies :data:`RECORD_AGAIN_BYTES` behind the log's end (so that
taking it never reads far), and retention keeps the segment that holds the latest record
(:meth:`ScheduleBook.retention_floor`). A book is one record: at most
``max_message_size_bytes`` of JSON.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

import numpy as np

from ..files.crash_points import crash_point
from ..files.broker_files import read_lenient_json
from ..files.fileio import atomic_write
from ..delayed.delivery import properties_since
from ..formats.record_codec import RecordSpec
from ..formats.message import PROPERTY_DELIVER_MS, PROPERTY_UNIQ_KEY, sharding_queue
from .recurring_schedule import Schedule, ScheduleInfo

#: The properties every fired copy carries (visible in the message's properties).
PROPERTY_SCHEDULE_KEY = "RMQ_SCHEDULE_KEY"
PROPERTY_SCHEDULE_FIRE_MS = "RMQ_SCHEDULE_FIRE_MS"
#: On a copy that stands for several missed due times (``catch_up="latest_once"``): how many.
PROPERTY_SCHEDULE_FIRES = "RMQ_SCHEDULE_FIRES"
#: Copies appended per step of :meth:`ScheduleBook.fire_due`.
FIRE_CHUNK = 4096
FILE_NAME = os.path.join("config", "rmq_schedules.json")
MARK_NAME = os.path.join("config", "rmq_schedules.mark")
#: The system topic a replicated book is recorded in (one queue; see the module).
BOOK_TOPIC = "rmq_sys_schedule_book"
#: A leader records its book again once its latest record is this far behind the log's end.
RECORD_AGAIN_BYTES = 64 << 20
#: The book's files (what a replica sets aside, :func:`recorded_book_files`).
BOOK_FILES = (FILE_NAME, FILE_NAME + ".bak", MARK_NAME)



class ScheduleBook:
    """The schedules of one store (see the module)."""

    def __init__(self, store) -> None:
        self.store = store
        self.path = os.path.join(store.root, FILE_NAME)
        self.mark_path = os.path.join(store.root, MARK_NAME)
        # the file's identity (inode, size, mtime) and what a step with nothing due needs of
        # it (the earliest fire, a mark of an older version): such a step reads only a stat
        self._cached: tuple[tuple, dict] | None = None
        # the same identity and the schedules as objects (the only copy of the book in
        # memory), changed in place under the write lock and written by _save (dropped when a
        # change fails half way)
        self._parsed: tuple[tuple, dict[str, Schedule]] | None = None
        # a firing step this process began and goes on with (bounded calls in a row): its
        # mark stays set and the book unwritten until the last call; the parsed copy is then
        # ahead of the file, and a crash in between is settled from the mark as any other
        self._own_mark = -1
        #: Whether the book is recorded in the CommitLog (a replica set's; see the module).
        self.replicated = False
        # a book taken from the log: (its record's offset, the log scanned up to, schedules)
        self._from_log_cache: tuple[int, int, dict[str, Schedule]] | None = None

    # -- the file ---------------------------------------------------------------------------
    def _identity(self) -> tuple | None:
        """The book file's identity (its ``.bak`` when the file is missing: an earlier
        version killed between its two renames left only the backup, which the read takes)."""
        for candidate in (self.path, self.path + ".bak"):
            try:
                st = os.stat(candidate)
            except OSError:
                continue
            return (candidate, st.st_ino, st.st_size, st.st_mtime_ns)
        return None

    def _summary(self) -> dict | None:
        """``{"earliest", "mark"}`` of the book as last written (``None``: no book); parses
        the file when another process wrote it since."""
        summary = self._file_summary()
        if not self.replicated:
            return summary
        latest = self._latest_record()
        if latest < 0 or (summary is not None and summary["record"] >= latest):
            return summary
        schedules = self._from_log(latest)  # the log holds a later book than the file
        key = ("log", latest)
        summary = {"earliest": _earliest(schedules), "mark": -1, "record": latest}
        self._cached, self._parsed = (key, summary), (key, schedules)
        return summary

    def _file_summary(self) -> dict | None:
        """:meth:`_summary` of the file alone."""
        identity = self._identity()
        if identity is None:
            self._cached = self._parsed = None
            return None
        if self._cached is not None and self._cached[0] == identity:
            return self._cached[1]
        data = read_lenient_json(self.path, valid=lambda d: isinstance(d, dict))
        if data is None:
            self._cached = self._parsed = None
            return None
        table = data.get("schedules") or {}
        schedules = {k: Schedule.from_json(k, v) for k, v in table.items()}
        legacy_mark = int(data.get("deliverMark", -1))  # a book an earlier version wrote
        record = data.get("logOffset")
        del data, table  # the objects are the one copy kept
        summary = {"earliest": _earliest(schedules), "mark": legacy_mark,
                   "record": record if isinstance(record, int) else -1}
        self._cached = (identity, summary)
        self._parsed = (identity, schedules)
        return summary

    # -- the book in the log (a replica set's) ------------------------------------------------
    def _latest_record(self) -> int:
        return latest_book_record(self.store)

    def forget(self) -> None:
        """Drop what this object holds of the book (a replica's change of role or cut moved
        its files, or cut the log): the next call reads the file, or the log, again."""
        self._cached = self._parsed = self._from_log_cache = None
        self._own_mark = -1

    def _from_log(self, latest: int) -> dict[str, Schedule]:
        """The book of the record at ``latest``, with the copies fired since counted (read
        on from where the last call stopped when it took the same record)."""
        store = self.store
        cached = self._from_log_cache
        if cached is not None and cached[0] == latest:
            _, scanned, schedules = cached
        else:
            data = json.loads(store.read_record(latest).body)
            schedules = {k: Schedule.from_json(k, v) for k, v in data["schedules"].items()}
            scanned = latest
        end = store.confirmed_offset()
        if end > scanned:
            _count_fired(schedules, _fired_since(store, scanned))
        self._from_log_cache = (latest, end, schedules)
        return schedules

    def retention_floor(self) -> int | None:
        """The latest record of a replicated book: retention keeps its segment."""
        if not self.replicated:
            return None
        latest = self._latest_record()
        return latest if latest >= 0 else None

    def record(self) -> bool:
        """Record the book in the log now, when it has schedules the log does not hold (a
        store that starts leading a replica set); whether it did."""
        with self._changing():
            schedules = self._settled()
            summary = self._cached[1] if self._cached is not None else None
            if not schedules or (summary is not None and summary["record"] >= 0):
                return False
            self._save(schedules)
            return True

    def _read_mark(self) -> int:
        """The mark of a firing step under way (-1: none)."""
        try:
            with open(self.mark_path, "rb") as fh:
                text = fh.read().strip()
        except FileNotFoundError:
            return -1
        return int(text) if text.lstrip(b"-").isdigit() else -1

    def _set_mark(self, mark: int) -> None:
        """Save the mark durably, before any copy of the step is appended."""
        crash_point("schedules.mark", "before")
        atomic_write(self.mark_path, str(mark).encode("ascii"))
        crash_point("schedules.mark", "after")

    def _clear_mark(self) -> None:
        self._own_mark = -1
        try:
            os.remove(self.mark_path)
        except FileNotFoundError:
            pass

    def _nothing_due(self, now: int) -> bool:
        """Whether the book, as last written, has no fire due by ``now`` and no mark to
        settle (a stat of the book: a step with nothing to do takes no lock)."""
        if os.path.exists(self.mark_path):
            return False
        summary = self._summary()
        if summary is None:
            return True
        if summary["mark"] >= 0:
            return False
        earliest = summary["earliest"]
        return earliest < 0 or earliest > now

    def _load(self) -> tuple[dict[str, Schedule], int]:
        """The schedules and the mark (the caller holds the write lock)."""
        mark = self._read_mark()
        summary = self._summary()
        if summary is None:
            return {}, mark
        if self._parsed is None or self._parsed[0] != self._cached[0]:
            self._cached = None  # dropped by a failed change: parsed again from the file
            summary = self._summary()
            if summary is None:
                return {}, mark
        return self._parsed[1], max(mark, summary["mark"])

    def _save(self, schedules: dict[str, Schedule]) -> None:
        data = {"schedules": {k: s.to_json() for k, s in schedules.items()},
                "deliverMark": -1}
        record = -1
        if self.replicated:  # the log first: a file naming a record the log lacks is never
            store = self.store  # (the record is what the followers copy)
            store.ensure_topic(BOOK_TOPIC)
            body = json.dumps({"schedules": data["schedules"]}, separators=(",", ":"))
            record = store.append([RecordSpec(topic=BOOK_TOPIC, body=body.encode("utf-8"),
                                              properties={}, queue_id=0,
                                              born_timestamp_ms=store.now_ms())])[0]
            record = record.commitlog_offset
            data["logOffset"] = record
        crash_point("schedules.book", "before")
        atomic_write(self.path, json.dumps(data, separators=(",", ":")).encode("utf-8"),
                     keep_backup=True)
        crash_point("schedules.book", "after")
        identity = self._identity()  # what was written is what the next read would parse
        self._cached = (identity, {"earliest": _earliest(schedules), "mark": -1,
                                   "record": record})
        self._parsed = (identity, schedules)

    def _settled(self) -> dict[str, Schedule]:
        """The schedules, after settling a firing step a killed process left (mark set)."""
        parsed_before = self._parsed
        schedules, mark = self._load()
        if mark >= 0 and mark == self._own_mark and self._parsed is parsed_before:
            return schedules  # our own step under way: the parsed copy is the newest
        self._own_mark = -1
        if mark >= 0:
            _count_fired(schedules, _fired_since(self.store, mark))
            self._save(schedules)
            self._clear_mark()
        return schedules

    @contextmanager
    def _changing(self):
        """The write lock, for a change of the parsed book in place: a change that fails
        half way drops the parsed copy (the next call reads the file again)."""
        with self.store.write_lock():
            try:
                yield
            except BaseException:
                self._parsed = self._from_log_cache = None
                raise

    # -- changing ---------------------------------------------------------------------------
    def add(self, schedule: Schedule) -> ScheduleInfo:
        """Add ``schedule`` (replacing one with its key); return what it is now."""
        return self.apply([schedule], [])[0][0]

    def apply(self, adds: list[Schedule], removes: list[str]
              ) -> tuple[list[ScheduleInfo], int, int]:
        """Add (or replace) ``adds`` and remove ``removes``, in one write of the book.

        A schedule identical to the one under its key (same message, expression or
        interval, zone and bounds) changes nothing: its next fire, fire count and pause are
        kept, so applying the same definitions again is harmless.  One that differs only in
        its catch-up policy takes the new policy and keeps its progress (and phase).  Returns
        the infos of ``adds``, how many of them changed the book and how many keys were
        removed.
        """
        with self._changing():
            schedules = self._settled()
            now = self.store.now_ms()
            infos, changed, removed = [], 0, 0
            for key in removes:
                removed += schedules.pop(key, None) is not None
            for schedule in adds:
                old = schedules.get(schedule.key)
                if old is not None and old.definition() == schedule.definition():
                    if old.policy() != schedule.policy():  # a new policy keeps the phase
                        old.catch_up, old.catch_up_window_ms = schedule.policy()
                        changed += 1
                    infos.append(old.info())
                    continue
                schedule.created_ms = now
                if schedule.every_ms is not None:
                    schedule.anchor_ms = schedule.start_at_ms if schedule.start_at_ms is not None \
                        else now + schedule.every_ms
                schedule.next_fire_ms = schedule.following(now)
                schedules[schedule.key] = schedule
                infos.append(schedule.info())
                changed += 1
            if changed or removed:
                self._save(schedules)
            return infos, changed, removed

    def remove(self, key: str) -> bool:
        """Remove the schedule ``key``; ``False`` when there is none."""
        with self._changing():
            schedules = self._settled()
            if schedules.pop(key, None) is None:
                return False
            self._save(schedules)
            return True

    def set_paused(self, key: str, paused: bool) -> bool:
        """Pause or resume the schedule ``key``; ``False`` when there is none."""
        with self._changing():
            schedules = self._settled()
            s = schedules.get(key)
            if s is None:
                return False
            if s.paused != paused:
                s.paused = paused
                if not paused and s.next_fire_ms is not None:  # skip what fell due meanwhile
                    s.next_fire_ms = s.following(max(self.store.now_ms(), s.next_fire_ms - 1))
                self._save(schedules)
            return True

    def list(self) -> list[ScheduleInfo]:
        """Every schedule, by key."""
        with self._changing():
            schedules = self._settled()
        return [schedules[k].info() for k in sorted(schedules)]

    # -- firing -----------------------------------------------------------------------------
    def fire_due(self, max_messages: int | None = None) -> int:
        """Fire every due time of every active schedule (see the module); return the copies
        appended.  ``max_messages`` bounds one call; the next call goes on.

        One step: the mark saved, the copies appended (:data:`FIRE_CHUNK` at a time) and
        flushed, the book written once, the mark removed.
        """
        if self._nothing_due(self.store.now_ms()):
            if self.replicated:
                self._record_again()
            return 0  # nothing due, or no schedule at all: no lock taken
        store = self.store
        budget = None if max_messages is None else max(1, int(max_messages))
        with self._changing():
            schedules = self._settled()
            now = store.now_ms()
            due = [s for s in schedules.values()
                   if not s.paused and s.next_fire_ms is not None and s.next_fire_ms <= now]
            if not due:
                self._finish(schedules)
                return 0
            if self._own_mark < 0:
                # the mark, before any copy (a step that only drops missed fires needs none,
                # but saving it costs a small write in a step that is rare)
                self._set_mark(store.confirmed_offset())
            fires: list[tuple[Schedule, int, int]] = []  # (schedule, fire time, stands for)
            for s in due:
                if budget is not None and len(fires) >= budget:
                    break  # the rest keep their next fire: the next call goes on
                s.take_due(now, fires, budget)
            for lo in range(0, len(fires), FIRE_CHUNK):
                crash_point("schedules.fire_append", "before")
                store.append([self._copy(s, t, n, now) for s, t, n in fires[lo:lo + FIRE_CHUNK]])
                crash_point("schedules.fire_append", "after")
            store.flush()  # the copies are durable before the book that claims them
            if budget is not None and len(fires) >= budget:
                # more may be due: the caller calls again; the book is written once, at the
                # end of the step (a fresh process fires in small bounded calls until its
                # compiled loops are in, see MessageStore.deliver_due)
                self._own_mark = self._read_mark()
            else:
                self._save(schedules)
                self._clear_mark()
        return len(fires)

    def _record_again(self) -> None:
        """Record a replicated book again when its latest record lies
        :data:`RECORD_AGAIN_BYTES` behind the log's end (see the module)."""
        latest = self._latest_record()
        if latest < 0 or self.store.confirmed_offset() - latest < RECORD_AGAIN_BYTES:
            return
        with self._changing():
            self._save(self._settled())

    def _finish(self, schedules: dict[str, Schedule]) -> None:
        """Write the book of a step this process left under way (bounded calls), if any."""
        if self._own_mark >= 0:
            self._save(schedules)
            self._clear_mark()

    def _copy(self, s: Schedule, fire_ms: int, stands_for: int, now: int) -> RecordSpec:
        store = self.store
        props = dict(s.properties)
        props[PROPERTY_UNIQ_KEY] = store.id_generator.next_id(now)
        props[PROPERTY_SCHEDULE_KEY] = s.key
        props[PROPERTY_SCHEDULE_FIRE_MS] = str(fire_ms)
        if stands_for > 1:
            props[PROPERTY_SCHEDULE_FIRES] = str(stands_for)
        props[PROPERTY_DELIVER_MS] = str(fire_ms)
        count = store.ensure_topic(s.topic)
        return RecordSpec(topic=s.topic, body=s.body, properties=props,
                          queue_id=sharding_queue(s.key, count), born_timestamp_ms=now)


def latest_book_record(store) -> int:
    """The CommitLog offset of the latest record of the book in ``store``'s log (an open
    store, writable or not; -1: none kept)."""
    if store.topic_table.cached_queue_count(BOOK_TOPIC) is None \
            and store.topic_table.queue_count(BOOK_TOPIC) is None:
        return -1
    queue = store.consume_queue(BOOK_TOPIC, 0)
    count = queue.max_offset(store.confirmed_offset())
    entry = queue.entry(count - 1) if count else None
    if entry is None or entry[0] < store.commit_log.min_offset():
        return -1
    return entry[0]


def recorded_book_files(store) -> tuple[str, ...]:
    """:data:`BOOK_FILES` when the book of ``store`` (open, writable or not) was recorded in
    its log (the log holds a record, or the file names one): a replica sets them aside at a
    change of role or a cut and takes the book from the log; ``()`` for a book never
    recorded (a store that led a replica set before its book was recorded keeps its file,
    and records it once it leads)."""
    if latest_book_record(store) >= 0:
        return BOOK_FILES
    data = read_lenient_json(os.path.join(store.root, FILE_NAME),
                             valid=lambda d: isinstance(d, dict))
    recorded = (data or {}).get("logOffset")
    return BOOK_FILES if isinstance(recorded, int) and recorded >= 0 else ()


def read_schedules(root: str) -> list[ScheduleInfo]:
    """The schedules of the store at ``root`` as last written, without the write lock (a
    read-only view: a firing step a killed process left is shown as not yet settled)."""
    data = read_lenient_json(os.path.join(root, FILE_NAME), valid=lambda d: isinstance(d, dict))
    table = (data or {}).get("schedules") or {}
    return [Schedule.from_json(k, table[k]).info() for k in sorted(table)]


def _earliest(schedules: dict[str, Schedule]) -> int:
    """The earliest next fire of an active schedule (-1: none)."""
    times = [s.next_fire_ms for s in schedules.values()
             if not s.paused and s.next_fire_ms is not None]
    return min(times) if times else -1


def _count_fired(schedules: dict[str, Schedule], fired: list[tuple[str, int]]) -> None:
    """Count the fired copies ``fired`` (``(key, fire time)``, in log order) in the
    schedules they belong to: each one not counted yet moves its schedule on."""
    for key, fire_ms in fired:
        s = schedules.get(key)
        if s is not None and s.next_fire_ms is not None and fire_ms >= s.next_fire_ms:
            s.fires += 1
            s.last_fire_ms = fire_ms
            s.next_fire_ms = s.following(fire_ms)


def _fired_since(store, start: int) -> list[tuple[str, int]]:
    """``(key, fire time)`` of the fired copies appended from CommitLog offset ``start`` on
    (one compiled pass finds the two properties; only the copies are decoded)."""
    out: list[tuple[str, int]] = []
    for raw, found, vstart, vend in properties_since(
            store, start, [PROPERTY_SCHEDULE_KEY, PROPERTY_SCHEDULE_FIRE_MS]):
        for i in np.flatnonzero(found[0] & found[1]):
            key = bytes(raw[vstart[0, i]:vend[0, i]]).decode("utf-8", "replace")
            fire = bytes(raw[vstart[1, i]:vend[1, i]])
            if fire.isdigit():
                out.append((key, int(fire)))
    return out
