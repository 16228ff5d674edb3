"""Timer service: RocketMQ 5's timer wheel, driven by ``store.deliver_due()``.

Flow (RocketMQ's five timer threads, run synchronously under the store's write lock):

1. **Send** (:meth:`TimerService.rewrite`): the producer's message becomes a record of
   ``rmq_sys_wheel_timer`` queue 0 with ``TIMER_OUT_MS`` (the fire time rounded to the
   precision P: an exact multiple of P moves one P earlier, anything else rounds down),
   ``TIMER_DELIVER_MS`` (the time asked for), ``REAL_TOPIC`` and ``REAL_QID``.  The store
   indexes it with the tag hash as tagsCode, as RocketMQ 5 does; the fire time and the
   cancel mark are gathered from the records, whole ranges at once (:mod:`.timer_queue`).
2. **Enqueue**: new ConsumeQueue entries become 52-byte TimerLog units chained per slot
   (:mod:`.timer_log`) and the 32-byte wheel slots are updated (:mod:`.wheel`), all with NumPy
   (:mod:`.placement`).
   An entry already due is delivered at once.  A fire time at least ``timer_roll_window_slots``
   slots ahead is *rolled*: the unit goes to a slot half or a whole window ahead and, when
   that slot fires, the record is re-put to the timer topic (``TIMER_ROLL_TIMES`` + 1), which
   also keeps a fresh copy of it inside the CommitLog's retention.
3. **Dequeue**: every slot T with ``T + P <= now`` is read, newest unit first through
   ``prevPos``; cancel markers in the slot drop their targets; the rest are restored to their
   real topic and queue with ``__RMQ_DELIVER_MS`` = the time asked for, ``TIMER_ENQUEUE_MS``,
   ``TIMER_DEQUEUE_MS`` and the origin (see :mod:`store.delayed.delivery`), many records per
   append (:mod:`.firing`).

Never early: slot T fires only once ``now >= T + P``, and rounding puts T + P at or after the
requested time, so a message is up to one P late and never early.

Unlike RocketMQ, nothing is lost after a long outage: the read time never jumps forward past
unfired slots.  Placements always stay within ``timer_wheel_slots`` of the read time (when the
read time lags by more than the wheel minus the roll window, new units are placed relative to
the read time and roll again), so a live slot is never overwritten, and catching up scans the
wheel once with NumPy instead of tick by tick.

Progress lives in ``config/timercheck`` (:mod:`.checkpoint`).  A run saves a mark first and
clears it with the new progress at the end; a run that died in between is redone by the next
one, which rebuilds wheel slots pointing past the checkpointed TimerLog end, zeroes that tail,
and skips every source whose delivery already reached the CommitLog.  Pending messages live
only in the files: memory does not grow with their number.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from typing import NamedTuple

import numpy as np

from ..base.config import StoreConfig
from ..files.crash_points import crash_point
from ..formats.record_codec import RecordSpec
from ..core.identity import store_tag
from ..core.ports import StorePort
from ..delayed.delivery import (
    check_headroom,
    origins_since,
    read_queue_entries,
    release_commitlog_pages,
    routed_properties,
)
from ..base.errors import InvalidMessageError, TimerFlowControlError
from ..formats.message import (
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    TIMER_TOPIC,
)
from . import timer_checkpoint as ckpt
from .timer_checkpoint import TimerCheckpoint
from .slot_firing import SlotFiring
from .delay_keys import DelayKeys
from .wheel_placement import WheelShape, enqueue, repair_wheel
from .recall import cancel_marker
from .timer_log import MAGIC_ROLL, UNIT_SIZE
from .timer_queue import fire_counts, upgrade_tags_codes
from .validation import (copy_aside, delivered_since_mark, handled_in_slot,
                         timer_files_problem, timer_origins_since)
from .timer_seal import seal_holds, write_seal
from .wheel import open_timer_files, read_live_ticks

log = logging.getLogger("store")

#: TimerLog units below the checkpointed end looked at by the open-time check of the
#: checkpoint (:meth:`TimerService._log_contradicts`).
_CHECKED_UNITS = 256

_NO_END = 1 << 62
_FLOW_CONTROL_OFF = 2**31 - 1


def _left(budget: int | None, used: int) -> int | None:
    return None if budget is None else max(0, budget - used)


def register_timer_topic(port: StorePort) -> None:
    """Make the timer topic known to the core: one queue (tagsCode: the tag hash, as RocketMQ
    5 dispatches it; fire times are read from the records, see :mod:`.timer_queue`)."""
    port.register_system_topic(TIMER_TOPIC, 1)


def refuse_broker_timer_of_another_precision(root: str, config: StoreConfig) -> None:
    """Before a writable open of ``root`` writes anything: raise
    :class:`~store.base.errors.ConfigMismatchError` when the timer files are a RocketMQ 5
    broker's (its checkpoint, never saved by rmq; no ``config/store.json`` yet) and cannot
    have been written with ``config.timer_precision_ms`` (see
    :func:`~store.timer.timer_checkpoint.check_broker_precision`).  The open would refuse
    them later anyway, after recording the wrong precision in ``config/store.json`` and
    rewriting the checkpoint and the queue table."""
    if not os.path.isdir(root) or os.path.exists(os.path.join(root, "config", "store.json")):
        return  # the open says what is wrong with a path that is no directory; a store's own
        # settings: the recorded precision is used
    path = os.path.join(root, "config", "timercheck")
    state = ckpt.load(path)
    if state is None or not ckpt.written_by_rocketmq(state, path):
        return
    wheel = read_live_ticks(os.path.join(root, "timerwheel"))
    if wheel is not None:
        ckpt.check_broker_precision(state, wheel[0], config.timer_precision_ms, wheel[1])


def round_fire_time(deliver_ms: int, precision_ms: int) -> int:
    """RocketMQ's TIMER_OUT_MS: one precision earlier for exact multiples, else rounded down."""
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms - deliver_ms % precision_ms


class QueuedFires(NamedTuple):
    """The fire times (and how many messages each) of the timer queue's offsets
    ``start:end``, kept between runs while the wheel has not taken ``start`` yet."""

    start: int
    end: int
    fires: np.ndarray
    weights: np.ndarray


class TimerService:
    """The timer wheel of one store (see the module docstring).

    Parameters
    ----------
    store : StorePort
        The store it serves; its settings ``timer_*`` shape the files.
    """

    def __init__(self, store: StorePort) -> None:
        self.store = store
        cfg = store.config
        self.precision = cfg.timer_precision_ms
        self.slots = cfg.timer_wheel_slots
        self.window = cfg.timer_roll_window_slots
        self.congest = cfg.timer_congest_num_each_slot
        self.max_delay = cfg.timer_max_delay_ms
        self.shape = WheelShape(self.precision, self.window, self.slots)
        self._check_path = os.path.join(store.root, "config", "timercheck")
        self.store_tag = store_tag(store.store_id) if store.store_id else 0
        self._state: TimerCheckpoint | None = None
        #: units (queue records enqueued, wheel entries fired or rolled) this object's runs
        #: handled: a bounded run may handle units and deliver none (enqueuing), and a
        #: caller stepping through the work tells "nothing left" from "no copy yet" by it
        self.handled = 0
        self._rng = random.Random()
        self._queued: QueuedFires | None = None
        self._unsaved: tuple[tuple, np.ndarray] | None = None
        #: whether every timer-queue entry is known to hold a tag hash (see _save)
        self._tags_known = False
        with store.write_lock():  # one process creates and initialises the wheel
            self.wheel, self.log, damaged = open_timer_files(
                store.root, self.slots, self.precision, cfg.timer_log_file_size_bytes)
            if damaged:  # the wheel is rebuilt from the timer ConsumeQueue (see _sync)
                self.wheel.created = True
            self.firing = SlotFiring(store, self.wheel, self.log, self.precision)
            self.keys = DelayKeys(store, self.precision, self._key_progress)
            self.firing.keys = self.keys
            # a queue an earlier rmq indexed by fire time (from where the checkpoint does
            # not know it holds hashes: nothing for a store this rmq wrote)
            upgrade_tags_codes(store, self._tags_hashed_to(ckpt.load(self._check_path)))
            self._tags_known = True
            self._sync()

    def _tags_hashed_to(self, disk: TimerCheckpoint | None) -> int | None:
        """The timer queue offset below which ``disk`` says every entry holds a tag hash
        (``None``: it says nothing it can be trusted on, and the whole queue is looked at:
        no checkpoint, an earlier version's, another store's, or an offset past the queue)."""
        if disk is None or disk.tags_hashed_to <= 0 or disk.store_tag not in (0, self.store_tag):
            return None
        to = disk.tags_hashed_to - 1
        return to if to <= self.store.consume_queue(TIMER_TOPIC, 0).max_offset() else None

    # ------------------------------------------------------------------ sending
    def rewrite(self, spec: RecordSpec, deliver_ms: int) -> tuple[RecordSpec, int]:
        """Turn a message due at ``deliver_ms`` (in the future) into a timer-topic record.

        Returns the rewritten spec and ``deliver_ms``.  Raises
        :class:`~store.base.errors.TimerFlowControlError` when per-slot flow control
        (``timer_congest_num_each_slot``) refuses it.
        """
        out = self.fire_time(deliver_ms)
        store = self.store
        props = routed_properties(store, spec)
        props[PROPERTY_TIMER_OUT_MS] = str(out)
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
        check_headroom(store, props)
        rewritten = dataclasses.replace(spec, topic=TIMER_TOPIC, queue_id=0, properties=props)
        return rewritten, deliver_ms

    def fire_time(self, deliver_ms: int) -> int:
        """The slot time (``TIMER_OUT_MS``) of a message due at ``deliver_ms``, after per-slot
        flow control (:class:`~store.base.errors.TimerFlowControlError` when it refuses)."""
        out = round_fire_time(deliver_ms, self.precision)
        if self.congest < _FLOW_CONTROL_OFF:
            self._check_congestion(out)
        return out

    def _check_congestion(self, out: int) -> None:
        """RocketMQ's isReject, with its inverted probability curve."""
        store = self.store
        with store.write_lock():
            st = self._sync()
            _, _, num = self.wheel.get(out)
            fires, weights = self._queued_fires(st.last_timer_queue_offset)
            num += int(weights[fires == out].sum())  # not yet enqueued: counted too
        limit = self.congest
        if num <= limit:
            return
        if num >= 2 * limit or self._rng.random() * 1000 > 1000 * (num - limit) / (limit + 0.1):
            raise TimerFlowControlError(
                f"the timer slot of {out} already holds {num} messages; "
                f"timer_congest_num_each_slot={limit} (flow control); retry later or spread "
                "the delivery times")

    def cancel(self, topic: str, msg_id: str, *, stored_queue_offset: int | None = None) -> bool:
        """Cancel a pending timer message (RocketMQ's delete marker).

        Returns ``True`` when a timer message with ``msg_id`` whose real topic is ``topic`` is
        still pending (its delivery time is in the future): a marker is stored in the same
        slot and the message never surfaces.  Returns ``False`` (and stores nothing) for an
        unknown id, the id of a message on another topic, a message sent with a delay level,
        one already due, or one already cancelled.  The marker itself never surfaces.
        ``stored_queue_offset`` (the send's :attr:`SendResult.stored_queue_offset`) finds
        the record directly; without it the record is looked up from the time in the id,
        which only ids made by this store carry.

        Raises
        ------
        InvalidMessageError
            ``topic`` or ``msg_id`` is not a non-empty string.
        """
        for name, value in (("topic", topic), ("msg_id", msg_id)):
            if not isinstance(value, str) or not value:
                raise InvalidMessageError(f"cancel: {name}={value!r}; allowed: a non-empty str")
        if stored_queue_offset is not None and (
                not isinstance(stored_queue_offset, int) or isinstance(stored_queue_offset, bool)
                or stored_queue_offset < 0):
            raise InvalidMessageError(f"cancel: stored_queue_offset={stored_queue_offset!r}; "
                                      "allowed: None or an int >= 0 (a send's "
                                      "SendResult.stored_queue_offset)")
        store = self.store
        with store.write_lock():
            spec = cancel_marker(store, topic, msg_id, store.now_ms(), max_delay_ms=self.max_delay,
                                 precision_ms=self.precision, index=stored_queue_offset)
            if spec is None:
                return False
            store.append([spec])
            return True

    # ------------------------------------------------------------------ state
    def _sync(self) -> TimerCheckpoint:
        """Load the checkpoint (another process may have moved it); create it when missing.

        The caller holds the store's write lock.
        """
        disk = ckpt.load(self._check_path)
        if disk is not None and self._state is not None and disk.counter != self._state.counter \
                and disk.tags_hashed_to <= 0:
            self._tags_known = False  # an earlier rmq saved it: its entries are not upgraded
        if disk is not None and (self._state is None or disk.counter != self._state.counter):
            problem = self._checkpoint_problem(disk)
            if problem is not None:
                log.warning("%s: %s; the timer is rebuilt from the timer topic's queue",
                            self._check_path, problem)
                self._state = None
                disk = self._rebuild(None)
        if disk is not None and ckpt.written_by_rocketmq(disk, self._check_path) \
                and not self.wheel.created:
            disk = ckpt.adopt_rocketmq(disk, self.wheel.live_ticks(), self.precision, self.slots)
            self._save(disk)  # a RocketMQ 5 broker's progress, now rmq's
        if disk is None or disk.wheel_slots != self.slots or disk.precision_ms != self.precision \
                or self.wheel.created:
            if disk is not None and not self.wheel.created:
                log.warning("%s: its wheel (precision %d ms, %d slots) is not this store's "
                            "(%d ms, %d slots; zeroed fields are damage); the timer is rebuilt "
                            "from the timer topic's queue", self._check_path, disk.precision_ms,
                            disk.wheel_slots, self.precision, self.slots)
            disk = self._rebuild(disk)
        elif self._state is not None and disk.counter == self._state.counter:
            return self._state  # unchanged since we saved or loaded it
        if self._state is None:
            # first look in this process: slots pointing past the log are corrupt (or were
            # being updated by a run that died, which its redo repairs the same way), and
            # damage inside the files is looked for before they are used
            repair_wheel(self.wheel, self.log, disk, self.shape)
            # (files a clean close sealed and nothing changed since need no check)
            problem = None if seal_holds(self._check_path, self.wheel, self.log,
                                         disk.last_timer_log_flush_pos) \
                else timer_files_problem(self.store, self.wheel, self.log, disk)
            if problem is not None:
                disk = self._rebuild_damaged(disk, problem)
            elif (since := self._stale_from(disk)) is not None:
                log.warning("%s: the timer delivered after CommitLog offset %d, where this "
                            "checkpoint was saved (a stale copy: a restored backup, an older "
                            "file); its next run skips every message delivered since, as a "
                            "dead run's redo does", self._check_path, since)
                disk.deliver_mark = since
                self._save(disk)
            handled = None if problem is not None \
                else handled_in_slot(self.store, self.wheel, self.log, disk)
            if handled is not None:
                log.warning("%s: its count of handled units of the slot at %d ms (slotDone "
                            "%d) is not what the delivered copies say (%d); corrected",
                            self._check_path, disk.last_read_time_ms, disk.slot_done, handled)
                disk.slot_done = handled
                self._save(disk)
            self.wheel.release_memory()
            ckpt.mark_as_rmqs(self._check_path)  # after a save: the files are rmq's now
        self._state = disk
        return disk

    def _stale_from(self, disk: TimerCheckpoint) -> int | None:
        """Where a checkpoint with no run under way was saved (the CommitLog's end then),
        when timer copies were appended after it: a later run this checkpoint does not know
        of delivered them, and its progress (read time, queue offset, slotDone) is older
        than the timer's (a stale copy of the file).  ``None`` when it is the newest (the
        normal case: the scan covers only what was appended since its save), when it has no
        such offset (an earlier version's) or when it would fire or enqueue nothing now.

        Setting the mark there makes the next run a redo: every source with a copy from
        there on is skipped, so nothing is delivered twice and nothing the TimerLog holds
        is skipped (see :meth:`_recover`)."""
        store = self.store
        start, confirmed = disk.saved_end_from - 1, store.confirmed_offset()
        if disk.deliver_mark >= 0 or not 0 <= start < confirmed:
            return None  # a redo skips the copies anyway; nothing appended since its save
        now = store.now_ms()
        qmax = store.consume_queue(TIMER_TOPIC, 0).max_offset(confirmed)
        if qmax <= disk.last_timer_queue_offset and not len(
                self.wheel.due_slots(disk.last_read_time_ms, now - now % self.precision)):
            return None  # nothing it would fire or enqueue (a slot fired since was due then)
        return start if len(timer_origins_since(store, start)) else None

    def _rebuild_damaged(self, disk: TimerCheckpoint, problem: str) -> TimerCheckpoint:
        """Set the damaged wheel and TimerLog aside (copies) and rebuild the timer from the
        timer topic's queue (:meth:`_rebuild`: nothing delivered is delivered again)."""
        root = self.store.root
        kept = [copy_aside(os.path.join(root, name)) for name in ("timerwheel", "timerlog")]
        log.warning("the timer files are damaged (%s); copied to %s and rebuilt from the "
                    "timer topic's queue", problem, ", ".join(kept))
        return self._rebuild(disk)

    def _checkpoint_problem(self, disk: TimerCheckpoint) -> str | None:
        """Why a checkpoint read from disk cannot be this store's (see
        :func:`~store.timer.timer_checkpoint.foreign_or_impossible`), or ``None``."""
        store = self.store
        confirmed = store.confirmed_offset()
        self.log.files.refresh()  # another process may have added TimerLog files
        last = self.log.files.last_file()
        queue = store.consume_queue(TIMER_TOPIC, 0)
        problem = ckpt.foreign_or_impossible(
            disk, store_tag=self.store_tag, queue_end=queue.max_offset(confirmed),
            log_end=last.end if last is not None else 0, commitlog_end=confirmed)
        if problem is None and self._state is None \
                and not ckpt.written_by_rocketmq(disk, self._check_path):
            problem = self._log_contradicts(disk, queue)
        return problem

    def _log_contradicts(self, disk: TimerCheckpoint, queue) -> str | None:
        """Whether the TimerLog around the checkpointed end contradicts the checkpointed
        queue offset (checked once per process: a damaged field, not a run that died).

        Every timer-queue entry below ``last_timer_queue_offset`` was enqueued, so its unit
        lies below ``last_timer_log_flush_pos``, and no entry from that offset on has one
        there.  A run that died leaves units past the end only for entries it had not
        enqueued yet (and rolls: those are not looked at).  A zeroed or stale end or offset
        breaks one of these: the unit just below the end names a record the checkpoint says
        was not enqueued, or the first unit past the end one it says was.
        With no mark (no run under way), nothing lies past the end at all.
        """
        q = disk.last_timer_queue_offset
        enqueued_to = -1  # CommitLog offset of the last record the checkpoint says is enqueued
        if q > 0:
            entry = read_queue_entries(queue, q - 1, q)
            if len(entry):
                enqueued_to = int(entry["offset"][0])
        end = disk.last_timer_log_flush_pos
        if end >= UNIT_SIZE:  # the newest units below the end that are no rolls
            start = max(self.log.files.min_offset(), end - _CHECKED_UNITS * UNIT_SIZE)
            start = end - (end - start) // UNIT_SIZE * UNIT_SIZE  # on a unit boundary
            below = [u for _, u in self.log.valid_units(start, end)]
            units = np.concatenate(below) if below else None
            fresh = units["offset_py"][(units["magic"] & MAGIC_ROLL) == 0] \
                if units is not None else ()
            if len(fresh) and int(fresh.max()) > enqueued_to:
                return (f"the TimerLog below its checkpointed end {end} holds a unit of a "
                        f"message the checkpointed queue offset {q} says was not enqueued yet")
        past = next(self.log.valid_units(end, end + UNIT_SIZE), None)
        if past is not None and len(past[1]) and disk.deliver_mark < 0:
            # units are appended only inside a run, after its mark is saved: with no mark,
            # nothing lies past the end (a redo or a rebuild zeroes it)
            return (f"the TimerLog goes on past its checkpointed end {end} though no run was "
                    "under way")
        if past is not None and not past[1]["magic"][0] & MAGIC_ROLL \
                and int(past[1]["offset_py"][0]) <= enqueued_to:
            return (f"the TimerLog goes on past its checkpointed end {end} with a message the "
                    f"checkpointed queue offset {q} says was enqueued already")
        return None

    def _key_progress(self) -> tuple[int, int, int]:
        """How far the timer has fired and enqueued, and the mark of a run a killed process
        left (for the delay keys; the caller holds the write lock)."""
        st = self._sync()
        return st.last_read_time_ms, st.last_timer_queue_offset, st.deliver_mark

    def _rebuild(self, old: TimerCheckpoint | None) -> TimerCheckpoint:
        """Start the timer files afresh from the timer ConsumeQueue.

        Used for a new store, and when ``timercheck`` or ``timerwheel`` was lost: the wheel is
        emptied, the TimerLog cleared and every queued timer message enqueued again; the mark
        makes the next run skip those already delivered.
        """
        store = self.store
        now = store.now_ms()
        queue = store.consume_queue(TIMER_TOPIC, 0)
        confirmed = store.confirmed_offset()
        qmax = queue.max_offset(confirmed)
        state = TimerCheckpoint(precision_ms=self.precision, wheel_slots=self.slots,
                                last_read_time_ms=now - now % self.precision)
        if qmax > 0 or self.log.files.files or old is not None:
            if old is not None and old.last_read_time_ms > 0:
                state.last_read_time_ms = min(state.last_read_time_ms, old.last_read_time_ms)
            self.wheel.reset()
            self.log.truncate(0)
            qmin = queue.min_offset(store.commit_log.min_offset(), confirmed)
            state.last_timer_queue_offset = qmin
            first = read_queue_entries(queue, qmin, min(qmax, qmin + 1))
            if len(first):
                state.deliver_mark = max(int(first["offset"][0]), store.commit_log.min_offset())
        self.wheel.created = False
        self._save(state)
        return state

    def _seal(self) -> None:
        """Write the seal when no run is under way and the checkpoint on disk is the one this
        process saved or loaded last (its files as it left them)."""
        st = self._state
        if st is None or st.deliver_mark >= 0:
            return
        disk = ckpt.load(self._check_path)
        if disk is None or disk.counter != st.counter or disk.deliver_mark >= 0:
            return
        self.wheel.flush()
        self.log.flush()
        write_seal(self._check_path, self.wheel, self.log, disk.last_timer_log_flush_pos)

    def _save(self, state: TimerCheckpoint) -> None:
        state.counter += 1
        # (never before the read time: a read time after its save time is damage, see
        # checkpoint.foreign_or_impossible; a broker's read time may be ahead of this clock)
        state.timestamp = max(self.store.now_ms(), state.last_read_time_ms)
        state.master_timer_queue_offset = state.last_timer_queue_offset
        state.store_tag = self.store_tag
        state.saved_end_from = self.store.confirmed_offset() + 1
        # (every entry queued so far holds a tag hash: the open upgraded the older ones and
        # this rmq writes hashes; unknown again once an earlier rmq saved, see _sync)
        state.tags_hashed_to = self.store.consume_queue(TIMER_TOPIC, 0).max_offset() + 1 \
            if self._tags_known else 0
        self._cover_log(state)
        crash_point("timer.checkpoint", "before")
        ckpt.save(self._check_path, state)
        crash_point("timer.checkpoint", "after")

    def _cover_log(self, state: TimerCheckpoint) -> None:
        """Make ``state``'s CRC of the TimerLog start in a file still on disk.

        A checkpoint without one (an earlier version's, a rebuild's) starts it at its end:
        the units below were checked by this process's first use, but are not certified by
        it.  One whose start retention deleted starts it again at the first file (the files
        this process checked and has been using since; once per deleted file).
        """
        end = state.last_timer_log_flush_pos
        start = state.log_crc_from - 1
        if state.log_crc_from and start >= self.log.files.min_offset() and start <= end:
            return
        crc = self.log.crc(self.log.files.min_offset(), end) if state.log_crc_from else None
        if crc is None:
            state.log_crc_from, state.log_crc = end + 1, 0
        else:
            state.log_crc_from, state.log_crc = self.log.files.min_offset() + 1, crc

    # ------------------------------------------------------------------ delivering
    def deliver_due(self, max_messages: int | None = None) -> int:
        """Enqueue new timer messages and deliver the ones due by now; return how many.

        ``max_messages`` bounds the units one call handles (``None``: every due one).  A
        bounded call may stop inside a slot: the checkpoint then keeps the read time at that
        slot and how many of its units (in append order) are done, and the next call goes on
        from there; the slot's cancel markers are read in full first, so a split never lets a
        cancelled message through.
        """
        store = self.store
        with store.write_lock():
            st = self._sync()
            now = store.now_ms()
            floor_now = now - now % self.precision
            qmax = store.consume_queue(TIMER_TOPIC, 0).max_offset(store.confirmed_offset())
            due = (self.wheel.due_slots(st.last_read_time_ms, floor_now)
                   if floor_now > st.last_read_time_ms else ())
            if st.deliver_mark < 0 and qmax <= st.last_timer_queue_offset and not len(due):
                # nothing to enqueue or fire: move the read time on without a save
                st.last_read_time_ms = max(st.last_read_time_ms, floor_now)
                return 0
            if self.keys.active():  # the keyed records appended since: applied first
                self.keys.sync()
            try:
                return self._run(st, now, None if max_messages is None
                                 else max(1, int(max_messages)))
            finally:
                self.wheel.release_memory()
                self.log.release_memory()
                self.keys.release_memory()
                release_commitlog_pages(store)

    def _run(self, st: TimerCheckpoint, now: int, budget: int | None = None) -> int:
        store = self.store
        work = st.copy()
        if self.firing.split_slot is not None and self.firing.split_slot.counter != st.counter:
            self.firing.split_slot = None  # another process (or a failed run) saved since
        redo = work.deliver_mark >= 0  # a run that died: redone, skipping what it delivered
        if not redo:
            work.deliver_mark = store.confirmed_offset()
            self._save(work)  # the mark is durable before anything is appended
            done = np.empty(0, np.int64)
        else:
            done = self._recover(work)
        self._state = work  # the in-memory copy follows the file's counter
        try:
            delivered = 0
            handled = 0  # units counted against the budget
            for _ in range(4):
                d, h = enqueue(self.store, self.wheel, self.log, self.firing, self.shape, work,
                               done, now, _left(budget, handled))
                delivered, handled = delivered + d, handled + h
                if budget is not None and handled >= budget:
                    break
                n, rolled, h = self.firing.dequeue(work, done, now, _left(budget, handled))
                delivered, handled = delivered + n, handled + h
                if not rolled or (budget is not None and handled >= budget):
                    break
            # what the new checkpoint claims must be on disk before it
            store.flush()
            self.log.flush()
            self.wheel.flush()
            # A redo stopped by its budget keeps the dead run's mark: that run may have
            # delivered entries and slots past where this one stopped, and the next run
            # must skip them too (with a fresh mark it would deliver them again).
            if not (redo and budget is not None and handled >= budget):
                work.deliver_mark = -1
            self._save(work)
            self.handled += handled
            if self.firing.split_slot is not None:
                self.firing.split_slot = self.firing.split_slot._replace(counter=work.counter)
        except BaseException:
            self._state = None  # the next run reloads the file (mark set) and redoes this one
            self.firing.split_slot = None
            raise
        return delivered

    def _recover(self, work: TimerCheckpoint) -> np.ndarray:
        """Undo what a dead run did to the wheel and TimerLog; return the sources it finished."""
        repair_wheel(self.wheel, self.log, work, self.shape)
        self.log.truncate(work.last_timer_log_flush_pos)
        return origins_since(self.store, work.deliver_mark)

    # ------------------------------------------------------------------ housekeeping
    def _queued_fires(self, start: int) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~.timer_queue.fire_counts` of the queue from ``start`` (the records not yet
        in the wheel) to its end; extended incrementally while ``start`` stays put."""
        store = self.store
        qmax = store.consume_queue(TIMER_TOPIC, 0).max_offset(store.confirmed_offset())
        cached = self._queued
        if cached is None or cached.start != start or cached.end > qmax:
            cached = QueuedFires(start, start, np.empty(0, np.int64), np.empty(0, np.int64))
        if cached.end < qmax:
            fires, weights = fire_counts(store, cached.end, qmax)
            cached = QueuedFires(start, qmax, np.concatenate([cached.fires, fires]),
                                 np.concatenate([cached.weights, weights]))
        self._queued = cached
        return cached.fires, cached.weights

    def _delivered_unsaved(self, st: TimerCheckpoint) -> np.ndarray:
        """:func:`~.validation.delivered_since_mark` for ``st`` now, kept while nothing it
        depends on moved (a store left as a dead run left it is asked again and again)."""
        store = self.store
        if st.deliver_mark < 0:
            return np.empty(0, np.int64)
        now = store.now_ms()
        floor_now = now - now % self.precision
        key = (st.counter, st.deliver_mark, store.confirmed_offset(), floor_now)
        if self._unsaved is None or self._unsaved[0] != key:
            times = delivered_since_mark(store, self.wheel, self.log, st, floor_now)
            release_commitlog_pages(store)
            self._unsaved = (key, times)
        return self._unsaved[1]

    def pending_count(self) -> int:
        """Timer messages not yet delivered (wheel counts plus the un-enqueued queue tail,
        less what a run the checkpoint does not know of delivered already)."""
        store = self.store
        with store.write_lock():
            st = self._sync()
            backlog = int(self._queued_fires(st.last_timer_queue_offset)[1].sum())
            pending = self.wheel.pending_count(st.last_read_time_ms) - st.slot_done
            pending -= len(self._delivered_unsaved(st))
            self.wheel.release_memory()
            return max(0, pending + backlog)

    def state(self) -> TimerCheckpoint:
        """A copy of the timer's progress (``config/timercheck`` as last saved)."""
        with self.store.write_lock():
            return self._sync().copy()

    def pending_due_ms(self) -> tuple[np.ndarray, np.ndarray]:
        """When pending timer messages fire: ``(fire times, counts)``, vectorised.

        One row per live wheel slot (its time + the precision, weighted by its ``num``; a
        rolled message counts at its roll slot) and one per queued record not yet enqueued
        (cancel markers weigh -1).
        """
        store = self.store
        P = self.precision
        with store.write_lock():
            st = self._sync()
            times, nums = self.wheel.live_slots(st.last_read_time_ms)
            fires, weights = self._queued_fires(st.last_timer_queue_offset)
            # the units of the slot at the read time a bounded run handled already, and what
            # a run the checkpoint does not know of delivered, are no longer pending
            done = np.concatenate([np.full(st.slot_done, st.last_read_time_ms + P, np.int64),
                                   self._delivered_unsaved(st)])
            self.wheel.release_memory()
        due = np.concatenate([times + P, fires + P, done])
        weight = np.concatenate([nums, weights, np.full(len(done), -1)]).astype(np.int64)
        return due.astype(np.int64), weight

    def retention_floor(self) -> int | None:
        """The lowest CommitLog offset a pending timer message may have: the first record
        not yet enqueued, and every unit of the timer log from the oldest chain start of a
        live slot on (conservative: it may keep a few delivered records longer)."""
        store = self.store
        st = self._sync()
        floors = []
        queue = store.consume_queue(TIMER_TOPIC, 0)
        qmax = queue.max_offset(store.confirmed_offset())
        if qmax > st.last_timer_queue_offset:
            head = read_queue_entries(queue, st.last_timer_queue_offset,
                                      st.last_timer_queue_offset + 1)
            if len(head):
                floors.append(int(head["offset"][0]))
        first = self.wheel.live_first_pos(st.last_read_time_ms)
        if first is not None:
            for _, units in self.log.valid_units(first, st.last_timer_log_flush_pos):
                live = units["offset_py"][units["offset_py"] >= 0]
                if len(live):
                    floors.append(int(live.min()))
        self.wheel.release_memory()
        return min(floors) if floors else None

    def on_retention(self, commitlog_min: int) -> None:
        """Delete TimerLog files whose units all point below the CommitLog minimum."""
        self.log.delete_expired(commitlog_min)

    def close(self) -> None:
        """Seal the timer files when this process leaves them clean (see
        :mod:`store.timer.timer_seal`; the caller holds the write lock), then close them."""
        try:
            self._seal()
        except Exception:  # a seal only saves the next open a check: never fail a close
            log.exception("sealing the timer files failed; the next open checks them")
        self.keys.close()
        self.wheel.close()
        self.log.close()
