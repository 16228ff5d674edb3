"""Timer service: RocketMQ 5's timer wheel, driven by ``store.deliver_due()``.

Flow (RocketMQ's five timer threads, run synchronously under the store's write lock):

1. **Send** (:meth:`TimerService.rewrite`): the producer's message becomes a record of
   ``rmq_sys_wheel_timer`` queue 0 with ``TIMER_OUT_MS`` (the fire time rounded to the
   precision P: an exact multiple of P moves one P earlier, anything else rounds down),
   ``TIMER_DELIVER_MS`` (the time asked for), ``REAL_TOPIC`` and ``REAL_QID``.  The store
   indexes it with tagsCode = ``TIMER_OUT_MS`` (negated for a cancel marker), so the timer
   never has to read a record to enqueue it.
2. **Enqueue**: new ConsumeQueue entries become 52-byte TimerLog units chained per slot
   (:mod:`.timer_log`) and the 32-byte wheel slots are updated (:mod:`.wheel`), all with NumPy.
   An entry already due is delivered at once.  A fire time at least ``timer_roll_window_slots``
   slots ahead is *rolled*: the unit goes to a slot half or a whole window ahead and, when
   that slot fires, the record is re-put to the timer topic (``TIMER_ROLL_TIMES`` + 1), which
   also keeps a fresh copy of it inside the CommitLog's retention.
3. **Dequeue**: every slot T with ``T + P <= now`` is read, newest unit first through
   ``prevPos``; cancel markers in the slot drop their targets; the rest are restored to their
   real topic and queue with ``__RMQ_DELIVER_MS`` = the time asked for, ``TIMER_ENQUEUE_MS``,
   ``TIMER_DEQUEUE_MS`` and the origin (see :mod:`.delivery`), many records per append.

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
import os
import random

import numpy as np

from ..codec import RecordSpec
from ..consume_queue import live_mask
from ..core.ports import StorePort
from ..delayed.restore import restore
from ..delayed.routing import (check_headroom, routed_properties, origins_since,
                               read_queue_entries, release_commitlog_pages)
from ..errors import CorruptRecordError, InvalidMessageError, TimerFlowControlError
from ..message import (PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, PROPERTY_TAGS,
                       PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_TIMER_DELIVER_MS,
                       PROPERTY_TIMER_OUT_MS, PROPERTY_UNIQ_KEY, TIMER_TOPIC)
from . import checkpoint as ckpt
from .checkpoint import TimerCheckpoint
from .recall import find_timer_record
from .timer_log import MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL, UNIT_DTYPE, UNIT_SIZE, TimerLog
from .wheel import TimerWheel

#: TIMER_ENQUEUE_MS of a message delivered straight from the queue (RocketMQ: Long.MAX).
DIRECT_ENQUEUE_MS = "9223372036854775807"
#: The tag RocketMQ gives a cancel (recall) marker.
RECALL_TAG = "_RECALL_TAG_"
#: ConsumeQueue entries enqueued per step.
ENQUEUE_CHUNK = 1 << 18
#: Units delivered per step.
DEQUEUE_CHUNK = 1 << 16
_NO_END = 1 << 62
_FLOW_CONTROL_OFF = 2**31 - 1


def _left(budget: int | None, used: int) -> int | None:
    return None if budget is None else max(0, budget - used)


def timer_tags_code(properties, store_timestamp_ms: int) -> int | None:
    """tagsCode of a timer-topic record: its fire (slot) time, negated for a cancel marker.

    Ours, not RocketMQ's (which stores the tag hash): the wheel enqueues from the
    ConsumeQueue alone, without reading the records.
    """
    out = properties.get(PROPERTY_TIMER_OUT_MS)
    if out is None:
        return None
    return -int(out) if PROPERTY_TIMER_DEL_UNIQKEY in properties else int(out)


def register_timer_topic(port: StorePort) -> None:
    """Make the timer topic known to the core: one queue, records indexed by fire time."""
    port.register_system_topic(TIMER_TOPIC, 1, timer_tags_code)


def round_fire_time(deliver_ms: int, precision_ms: int) -> int:
    """RocketMQ's TIMER_OUT_MS: one precision earlier for exact multiples, else rounded down."""
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms - deliver_ms % precision_ms


class TimerService:
    """The timer wheel of one store (see the module docstring).

    Parameters
    ----------
    store : MessageStore
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
        self._check_path = os.path.join(store.root, "config", "timercheck")
        self._state: TimerCheckpoint | None = None
        self._rng = random.Random()
        # the units of a slot a bounded run split, for the next run: (counter of the
        # checkpoint this process saved last, slot time, its last unit, TimerLog end, units)
        self._split_slot: tuple | None = None
        with store.write_lock():  # one process creates and initialises the wheel
            self.wheel = TimerWheel(os.path.join(store.root, "timerwheel"), self.slots,
                                    self.precision)
            self.log = TimerLog(os.path.join(store.root, "timerlog"),
                                cfg.timer_log_file_size_bytes)
            self._sync()

    # ------------------------------------------------------------------ sending
    def rewrite(self, spec: RecordSpec, deliver_ms: int) -> tuple[RecordSpec, int]:
        """Turn a message due at ``deliver_ms`` (in the future) into a timer-topic record.

        Returns the rewritten spec and ``deliver_ms``.  Raises
        :class:`~store.errors.TimerFlowControlError` when per-slot flow control
        (``timer_congest_num_each_slot``) refuses it.
        """
        out = round_fire_time(deliver_ms, self.precision)
        if self.congest < _FLOW_CONTROL_OFF:
            self._check_congestion(out)
        store = self.store
        props = routed_properties(store, spec)
        props[PROPERTY_TIMER_OUT_MS] = str(out)
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
        check_headroom(store, props)
        rewritten = dataclasses.replace(spec, topic=TIMER_TOPIC, queue_id=0, properties=props)
        return rewritten, deliver_ms

    def _check_congestion(self, out: int) -> None:
        """RocketMQ's isReject, with its inverted probability curve."""
        store = self.store
        with store.write_lock():
            st = self._sync()
            _, _, num = self.wheel.get(out)
            cq = store.consume_queue(TIMER_TOPIC, 0)
            qmax = cq.max_offset(store.confirmed_offset())
            if qmax > st.last_timer_queue_offset:  # not yet enqueued: count them too
                tags = read_queue_entries(cq, st.last_timer_queue_offset, qmax)["tags_code"]
                num += int(np.count_nonzero(tags == out)) - int(np.count_nonzero(tags == -out))
        limit = self.congest
        if num <= limit:
            return
        if num >= 2 * limit or self._rng.random() * 1000 > 1000 * (num - limit) / (limit + 0.1):
            raise TimerFlowControlError(
                f"the timer slot of {out} already holds {num} messages; "
                f"timer_congest_num_each_slot={limit} (flow control); retry later or spread "
                "the delivery times")

    def cancel(self, topic: str, msg_id: str) -> bool:
        """Cancel a pending timer message (RocketMQ's delete marker).

        Returns ``True`` when a timer message with ``msg_id`` whose real topic is ``topic`` is
        still pending (its delivery time is in the future): a marker is stored in the same
        slot and the message never surfaces; cancelling it again also returns ``True``.
        Returns ``False`` (and stores nothing) for an unknown id, the id of a message on
        another topic, a message sent with a delay level, or one already due.  The marker
        itself never surfaces.

        Raises
        ------
        InvalidMessageError
            ``topic`` or ``msg_id`` is not a non-empty string.
        """
        for name, value in (("topic", topic), ("msg_id", msg_id)):
            if not isinstance(value, str) or not value:
                raise InvalidMessageError(f"cancel: {name}={value!r}; allowed: a non-empty str")
        store = self.store
        with store.write_lock():
            now = store.now_ms()
            rec = find_timer_record(store, topic, msg_id, now, self.max_delay)
            if rec is None:
                return False
            props = rec.properties
            out = int(props[PROPERTY_TIMER_OUT_MS])
            fire = int(props.get(PROPERTY_TIMER_DELIVER_MS) or out + self.precision)
            if fire <= now:
                return False
            marker = {
                PROPERTY_UNIQ_KEY: msg_id, PROPERTY_TAGS: RECALL_TAG,
                PROPERTY_TIMER_OUT_MS: str(out), PROPERTY_TIMER_DELIVER_MS: str(fire),
                PROPERTY_TIMER_DEL_UNIQKEY: f"{topic}+{msg_id}",
                PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: "0",
            }
            store.append([RecordSpec(topic=TIMER_TOPIC, body=b"0", properties=marker,
                                     queue_id=0, born_timestamp_ms=now)])
            return True

    # ------------------------------------------------------------------ state
    def _sync(self) -> TimerCheckpoint:
        """Load the checkpoint (another process may have moved it); create it when missing.

        The caller holds the store's write lock.
        """
        disk = ckpt.load(self._check_path)
        if disk is None or disk.wheel_slots != self.slots or disk.precision_ms != self.precision \
                or self.wheel.created:
            disk = self._rebuild(disk)
        elif self._state is not None and disk.counter == self._state.counter:
            return self._state  # unchanged since we saved or loaded it
        if self._state is None and disk.deliver_mark < 0:
            # first look in this process: slots pointing past the log are corrupt
            self._repair_wheel(disk)
            self.wheel.release_memory()
        self._state = disk
        return disk

    def _rebuild(self, old: TimerCheckpoint | None) -> TimerCheckpoint:
        """Start the timer files afresh from the timer ConsumeQueue.

        Used for a new store, and when ``timercheck`` or ``timerwheel`` was lost: the wheel is
        emptied, the TimerLog cleared and every queued timer message enqueued again; the mark
        makes the next run skip those already delivered.
        """
        store = self.store
        now = store.now_ms()
        cq = store.consume_queue(TIMER_TOPIC, 0)
        confirmed = store.confirmed_offset()
        qmax = cq.max_offset(confirmed)
        state = TimerCheckpoint(precision_ms=self.precision, wheel_slots=self.slots,
                                last_read_time_ms=now - now % self.precision)
        if qmax > 0 or self.log.files.files or old is not None:
            if old is not None and old.last_read_time_ms > 0:
                state.last_read_time_ms = min(state.last_read_time_ms, old.last_read_time_ms)
            self.wheel.reset()
            self.log.truncate(0)
            qmin = cq.min_offset(store.commit_log.min_offset(), confirmed)
            state.last_timer_queue_offset = qmin
            first = read_queue_entries(cq, qmin, min(qmax, qmin + 1))
            if len(first):
                state.deliver_mark = max(int(first["offset"][0]), store.commit_log.min_offset())
        self.wheel.created = False
        self._save(state)
        return state

    def _save(self, state: TimerCheckpoint) -> None:
        state.counter += 1
        state.timestamp = self.store.now_ms()
        state.master_timer_queue_offset = state.last_timer_queue_offset
        ckpt.save(self._check_path, state)

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
            try:
                return self._run(st, now, None if max_messages is None
                                 else max(1, int(max_messages)))
            finally:
                self.wheel.release_memory()
                self.log.release_memory()
                release_commitlog_pages(store)

    def _run(self, st: TimerCheckpoint, now: int, budget: int | None = None) -> int:
        store = self.store
        work = st.copy()
        if self._split_slot is not None and self._split_slot[0] != st.counter:
            self._split_slot = None  # another process (or a failed run) saved since
        if work.deliver_mark < 0:
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
                d, h = self._enqueue(work, done, now, _left(budget, handled))
                delivered, handled = delivered + d, handled + h
                if budget is not None and handled >= budget:
                    break
                n, rolled, h = self._dequeue(work, done, now, _left(budget, handled))
                delivered, handled = delivered + n, handled + h
                if not rolled or (budget is not None and handled >= budget):
                    break
            # what the new checkpoint claims must be on disk before it
            store.flush()
            self.log.flush()
            self.wheel.flush()
            work.deliver_mark = -1
            self._save(work)
            if self._split_slot is not None:
                self._split_slot = (work.counter, *self._split_slot[1:])
        except BaseException:
            self._state = None  # the next run reloads the file (mark set) and redoes this one
            self._split_slot = None
            raise
        return delivered

    def _recover(self, work: TimerCheckpoint) -> np.ndarray:
        """Undo what a dead run did to the wheel and TimerLog; return the sources it finished."""
        self._repair_wheel(work)
        self.log.truncate(work.last_timer_log_flush_pos)
        return origins_since(self.store, work.deliver_mark)

    def _repair_wheel(self, state: TimerCheckpoint) -> int:
        """Rebuild every slot that points at or past the checkpointed TimerLog end.

        Such a slot was being updated by a run that died, or is corrupt.  It is rebuilt from the
        units below the end (RocketMQ's checkPhyPos): the units whose slot time maps to it give
        its first and last position and its count; a slot with none (or only stale ones) is
        emptied.  Returns how many slots were repaired.
        """
        end = state.last_timer_log_flush_pos
        suspects = self.wheel.slots_pointing_past(end)
        if not len(suspects):
            return 0
        P, S = self.precision, self.slots
        wanted = np.zeros(S, dtype=bool)
        wanted[suspects] = True
        found_pos, found_time, found_magic = [], [], []
        start = self.log.files.min_offset() if self.log.files.refresh() else end
        for positions, units in self.log.valid_units(start, end):
            slot_time = units["enqueue_time"] + units["delay"]
            hit = (slot_time >= state.last_read_time_ms) & wanted[(slot_time // P) % S]
            found_pos.append(positions[hit])
            found_time.append(slot_time[hit])
            found_magic.append(units["magic"][hit])
        self.wheel.clear(suspects)
        if found_pos:
            pos = np.concatenate(found_pos)
            times = np.concatenate(found_time)
            magic = np.concatenate(found_magic)
            if len(pos):
                # per slot time: first and last position and the count (markers subtract)
                order = np.lexsort((pos, times))
                pos, times, magic = pos[order], times[order], magic[order]
                uniq, first_idx, counts = np.unique(times, return_index=True, return_counts=True)
                delta = np.where((magic & MAGIC_DELETE) != 0, -1, 1)
                # one live time per slot: placements stay within a wheel turn of the read time
                self.wheel.put(uniq, pos[first_idx], pos[first_idx + counts - 1],
                               np.add.reduceat(delta, first_idx))
        self.wheel.flush()
        return len(suspects)

    # -- enqueue ----------------------------------------------------------------------------
    def _enqueue(self, work: TimerCheckpoint, done: np.ndarray, now: int,
                 budget: int | None = None) -> tuple[int, int]:
        """Move new timer-queue entries into the wheel (or deliver them when already due).

        Returns ``(delivered, handled)``: handled counts the entries delivered at once (or
        skipped) against ``budget``; with a budget, steps are at most the budget left, and
        the run stops when it is spent.
        """
        store = self.store
        cq = store.consume_queue(TIMER_TOPIC, 0)
        confirmed = store.confirmed_offset()
        qmax = cq.max_offset(confirmed)
        q = work.last_timer_queue_offset
        if q >= qmax:
            return 0, 0
        q = max(q, cq.first_index())
        cl_min = store.commit_log.min_offset()
        P = self.precision
        delete_keys = self._marker_keys(cq, q, qmax, cl_min)
        delivered = handled = 0
        while q < qmax:
            if budget is not None and handled >= budget:
                break
            end = min(qmax, q + ENQUEUE_CHUNK)
            e = read_queue_entries(cq, q, end)
            if not len(e):
                break
            offs, sizes, tags = e["offset"], e["size"], e["tags_code"]
            live = live_mask(e, cl_min) & (tags != 0)
            if len(done):
                live &= ~np.isin(offs, done)
            marker = tags < 0
            fire = np.abs(tags)
            due = live & ~marker & (fire + P <= now)
            if budget is not None:
                due_at = np.flatnonzero(due)
                if len(due_at) > budget - handled:  # the step ends before the first one over
                    cut = int(due_at[budget - handled])
                    e, offs, sizes, live = e[:cut], offs[:cut], sizes[:cut], live[:cut]
                    marker, fire, due = marker[:cut], fire[:cut], due[:cut]
            if due.any():
                units = np.zeros(int(due.sum()), dtype=UNIT_DTYPE.newbyteorder("="))
                units["offset_py"] = offs[due]
                units["size_py"] = sizes[due]
                units["magic"] = MAGIC_DEFAULT
                units["enqueue_time"] = -1
                d, _ = self._deliver_units(units, delete_keys, now, direct=True)
                delivered += d
                handled += len(units)
            place = live & ~due
            if place.any():
                self._place(work, offs[place], sizes[place], fire[place], marker[place], now)
            q = q + len(e)
            work.last_timer_queue_offset = q
        work.last_timer_queue_offset = max(work.last_timer_queue_offset, q)
        return delivered, handled

    def _marker_keys(self, cq, start: int, end: int, cl_min: int) -> set[str]:
        """TIMER_DEL_UNIQKEY of the cancel markers among queue entries ``[start, end)``."""
        keys: set[str] = set()
        for q in range(start, end, ENQUEUE_CHUNK):
            e = read_queue_entries(cq, q, min(end, q + ENQUEUE_CHUNK))
            for offset in e["offset"][(e["tags_code"] < 0) & (e["offset"] >= cl_min)].tolist():
                key = self._read_props(offset).get(PROPERTY_TIMER_DEL_UNIQKEY)
                if key:
                    keys.add(key)
        return keys

    def _read_props(self, offset: int) -> dict[str, str]:
        try:
            return self.store.commit_log.read_record(offset).properties
        except CorruptRecordError:
            return {}

    def _place(self, work: TimerCheckpoint, offs: np.ndarray, sizes: np.ndarray,
               fire: np.ndarray, marker: np.ndarray, now: int) -> None:
        """Append TimerLog units for ``fire`` times and link them into their slots."""
        P, W, S = self.precision, self.window, self.slots
        read_time = work.last_read_time_ms
        floor_now = now - now % P
        # RocketMQ places relative to now; after a long outage that could reach slots still
        # waiting to fire, so then place relative to the read time (and roll once more)
        base = floor_now if floor_now - read_time < (S - W) * P else read_time
        roll = (fire - base) >= W * P
        over = fire - base - W * P
        roll_slot = np.where(over < (W // 3) * P, base + (W // 2) * P, base + W * P)
        slot = np.maximum(np.where(roll, roll_slot, fire), read_time)
        magic = (MAGIC_DEFAULT | np.where(roll, MAGIC_ROLL, 0)
                 | np.where(marker, MAGIC_DELETE, 0)).astype(np.int32)

        order = np.argsort(slot, kind="stable")
        slot, magic = slot[order], magic[order]
        n = len(slot)
        positions, blanks, new_end = self.log.place(work.last_timer_log_flush_pos, n)
        uniq, starts, counts = np.unique(slot, return_index=True, return_counts=True)
        valid, first, last, num = self.wheel.lookup(uniq)
        prev = np.empty(n, dtype=np.int64)
        prev[1:] = positions[:-1]
        prev[starts] = last  # -1 for an empty slot
        delta = np.where((magic & MAGIC_DELETE) != 0, -1, 1)
        units = np.zeros(n, dtype=UNIT_DTYPE)
        units["size"] = UNIT_SIZE
        units["prev_pos"] = prev
        units["magic"] = magic
        units["enqueue_time"] = base
        units["delay"] = slot - base
        units["offset_py"] = offs[order]
        units["size_py"] = sizes[order]
        self.log.write(positions, units, blanks)
        # the slots only after the units they point at are written
        self.wheel.put(uniq, np.where(valid, first, positions[starts]),
                       positions[starts + counts - 1], num + np.add.reduceat(delta, starts))
        work.last_timer_log_flush_pos = new_end

    # -- dequeue ----------------------------------------------------------------------------
    def _dequeue(self, work: TimerCheckpoint, done: np.ndarray, now: int,
                 budget: int | None = None) -> tuple[int, int, int]:
        """Fire the slots due by ``now``; return ``(delivered, rolled, units handled)``.

        With ``budget``, stops after that many units, possibly inside a slot (recorded in
        ``work.slot_done``; see :meth:`deliver_due`).
        """
        P = self.precision
        floor_now = now - now % P
        read_time = work.last_read_time_ms
        if floor_now <= read_time:
            return 0, 0, 0
        delivered = rolled = handled = 0
        parts: list[np.ndarray] = []
        pending = 0
        delete_keys: set[str] = set()
        log_end = work.last_timer_log_flush_pos
        stop_at: tuple[int, int] | None = None  # (slot time, units done in it)
        for slot_time in self.wheel.due_slots(read_time, floor_now).tolist():
            _first, last, _num = self.wheel.get(slot_time)
            split = self._split_slot
            if split is not None and split[1:4] == (slot_time, last, log_end):
                units = split[4]  # walked by the run that split this slot
            else:
                _positions, units = self.log.walk_chain(last, log_end)
                units = units[::-1]  # append order
            self._split_slot = None
            if not len(units):
                continue
            skip = work.slot_done if slot_time == read_time else 0
            rest = units[skip:]
            if budget is not None and handled + len(rest) > budget:
                # a split slot: its markers (anywhere in the slot) take effect first
                self._marker_keys_of(units, delete_keys)
                rest = rest[:budget - handled]
                stop_at = (slot_time, skip + len(rest))
                self._split_slot = (-1, slot_time, last, log_end, units)
            parts.append(self._drop_done(rest, done))
            pending += len(rest)
            handled += len(rest)
            if pending >= DEQUEUE_CHUNK:
                d, r = self._fire(np.concatenate(parts), delete_keys, now)
                delivered, rolled = delivered + d, rolled + r
                parts, pending = [], 0
            if stop_at is not None:
                break
        if parts:
            d, r = self._fire(np.concatenate(parts), delete_keys, now)
            delivered, rolled = delivered + d, rolled + r
        if stop_at is None:
            work.last_read_time_ms, work.slot_done = floor_now, 0
        else:
            work.last_read_time_ms, work.slot_done = stop_at
        return delivered, rolled, handled

    def _marker_keys_of(self, units: np.ndarray, keys: set[str]) -> None:
        """Add the TIMER_DEL_UNIQKEY of the (non-rolled) cancel markers among ``units``."""
        magic = units["magic"]
        is_marker = ((magic & MAGIC_DELETE) != 0) & ((magic & MAGIC_ROLL) == 0)
        for offset in units["offset_py"][is_marker].tolist():
            key = self._read_props(offset).get(PROPERTY_TIMER_DEL_UNIQKEY)
            if key:
                keys.add(key)

    def _drop_done(self, units: np.ndarray, done: np.ndarray) -> np.ndarray:
        keep = units["offset_py"] >= self.store.commit_log.min_offset()
        if len(done):
            keep &= ~np.isin(units["offset_py"], done)
        return units[keep]

    def _fire(self, units: np.ndarray, delete_keys: set[str], now: int) -> tuple[int, int]:
        """Deliver or re-put the units of fired slots (markers first)."""
        magic = units["magic"]
        is_marker = ((magic & MAGIC_DELETE) != 0) & ((magic & MAGIC_ROLL) == 0)
        self._marker_keys_of(units, delete_keys)
        return self._deliver_units(units[~is_marker], delete_keys, now, direct=False)

    def _deliver_units(self, units: np.ndarray, delete_keys: set[str], now: int, *,
                       direct: bool) -> tuple[int, int]:
        """Restore (or, for ROLL units, re-put) the records of ``units``; vectorised appends."""
        enqueue = units["enqueue_time"].astype(np.int64)
        if direct:
            enqueue = np.full(len(units), -1, dtype=np.int64)
        result = restore(self.store, units["offset_py"].astype(np.int64), now=now,
                         enqueue_ms=enqueue, roll=(units["magic"] & MAGIC_ROLL) != 0,
                         delete_keys=delete_keys, timer_precision_ms=self.precision,
                         direct_enqueue_ms=DIRECT_ENQUEUE_MS)
        return result.delivered, result.rolled

    # ------------------------------------------------------------------ housekeeping
    def pending_count(self) -> int:
        """Timer messages not yet delivered (wheel counts plus the un-enqueued queue tail)."""
        store = self.store
        with store.write_lock():
            st = self._sync()
            cq = store.consume_queue(TIMER_TOPIC, 0)
            qmax = cq.max_offset(store.confirmed_offset())
            backlog = 0
            if qmax > st.last_timer_queue_offset:
                tags = read_queue_entries(cq, st.last_timer_queue_offset, qmax)["tags_code"]
                backlog = int(np.count_nonzero(tags > 0)) - int(np.count_nonzero(tags < 0))
            pending = self.wheel.pending_count(st.last_read_time_ms) - st.slot_done
            self.wheel.release_memory()
            return max(0, pending + backlog)

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
            self.wheel.release_memory()
            cq = store.consume_queue(TIMER_TOPIC, 0)
            qmax = cq.max_offset(store.confirmed_offset())
            tags = np.empty(0, np.int64)
            if qmax > st.last_timer_queue_offset:
                tags = read_queue_entries(cq, st.last_timer_queue_offset, qmax)["tags_code"]
                tags = tags[tags != 0].astype(np.int64)
        due = np.concatenate([times + P, np.abs(tags) + P])
        weight = np.concatenate([nums, np.where(tags < 0, -1, 1)]).astype(np.int64)
        return due.astype(np.int64), weight

    def on_retention(self, commitlog_min: int) -> None:
        """Delete TimerLog files whose units all point below the CommitLog minimum."""
        self.log.delete_expired(commitlog_min)

    def close(self) -> None:
        self.wheel.close()
        self.log.close()
