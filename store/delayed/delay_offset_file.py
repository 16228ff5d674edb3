"""The progress of the 4.x delay levels: ``config/delayOffset.json`` and its owner mark, read,
checked against the CommitLog and saved (:class:`DelayOffsetFile`, kept by
:class:`~store.delayed.delay_levels.DelayLevelService`).

Progress: ``config/delayOffset.json`` = ``{"offsetTable": {level: next offset},
"dataVersion": {...}, "deliverMark": -1, "storeId": "<the store's id>", "savedAt": <the
CommitLog's end when saved>, "seal": "<crc32 of the offsets, savedAt and storeId>",
"lastCopies": {level: [from, to]: the CommitLog range the copy of the level's last delivered
entry was appended in, a hint}}`` written
atomically in fastjson's text, as RocketMQ writes it (:mod:`store.files.broker_files`: integer
keys unquoted, other fields kept); it is read leniently.  A file that names another store, or
whose mark or offsets point past the CommitLog or their queues, is not used: the progress is
rebuilt from the queues (from their first entries, with a mark, as for a lost file).  A run
(:meth:`~store.delayed.delay_levels.DelayLevelService.deliver_due`) saves ``deliverMark``
before appending and clears it with the new offsets, so a run that died in between is redone
without delivering anything twice.

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

Such a file is checked forward too (:meth:`DelayOffsetFile._check_forward`): the entries it
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

from ..core.ports import StorePort
from ..files.broker_files import read_lenient_json, write_config
from ..files.crash_points import crash_point
from ..formats.message import SCHEDULE_TOPIC
from .delivered_prefix import OriginScan, copy_in, delivered_prefix
from .delivery import read_queue_entries

#: The owner mark next to ``delayOffset.json`` (see the module docstring).
OWNER_MARK_SUFFIX = ".rmq"


def _int_or(value: object, default: int) -> int:
    """``value`` as an int, or ``default`` when it is missing or not a number."""
    try:
        return int(value) if value is not None and not isinstance(value, bool) else default
    except (TypeError, ValueError):
        return default


log = logging.getLogger("store")


@dataclasses.dataclass
class DelayProgress:
    """The delay levels' progress as the file holds it: each level's next queue offset,
    the ``deliverMark`` of a run under way (-1: none) and the file's version counter."""

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


class DelayOffsetFile:
    """``config/delayOffset.json`` of one store and its owner mark (see the module)."""

    def __init__(self, store: StorePort) -> None:
        self.store = store
        self.levels = store.config.delay_levels_ms
        self.path = os.path.join(store.root, "config", "delayOffset.json")
        #: the stamp of the file this process saved last (see :meth:`load`)
        self._saved_stamp: tuple[int, int, int] | None = None
        #: what this process knew when it saved last: ``(CommitLog offset, offsets)``, every
        #: copy of an entry from those offsets on lies at or after that offset
        self._known: tuple[int, dict[int, int]] | None = None
        #: the stamp of the last file not saved here that was checked, and what it gave
        self._checked: tuple[tuple[int, int, int] | None, DelayProgress] | None = None
        #: the owner mark's broker offsets (None: not read yet, or no mark yet)
        self._broker: dict[int, int] | None = None
        #: RocketMQ's offsets read from a broker's file, kept for the owner mark
        self._adopted: dict[int, int] = {}

    def load(self) -> DelayProgress:
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

    def _read(self, trusted: bool) -> DelayProgress:
        """The progress the file holds, checked (see :meth:`load`)."""
        data = read_lenient_json(self.path)
        if not isinstance(data, dict) or not isinstance(data.get("offsetTable"), dict):
            return self.lost()
        offsets = {}
        damaged = False
        for key, value in data["offsetTable"].items():
            try:
                offsets[int(key)] = int(value)
            except (TypeError, ValueError):
                damaged = True
        version = data.get("dataVersion") or {}
        progress = DelayProgress(offsets, _int_or(data.get("deliverMark"), -1),
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
            rebuilt = self.lost()
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

    def _check_forward(self, progress: DelayProgress) -> None:
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

    def _drop_impossible(self, progress: DelayProgress) -> None:
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

    def lost(self) -> DelayProgress:
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
        return DelayProgress({}, mark, 0)

    def save(self, progress: DelayProgress) -> None:
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
