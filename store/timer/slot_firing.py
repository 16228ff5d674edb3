"""Firing due wheel slots: walking their TimerLog chains and delivering what they hold.

Every slot T with ``T + P <= now`` is read, newest unit first through ``prevPos`` and then in
append order; cancel markers in the slot drop their targets; the rest are restored to their
real topic and queue (:mod:`store.delayed.restore`), or re-put to the timer topic when rolled.
A bounded run may stop inside a slot: :attr:`SlotFiring.split_slot` keeps the walked units for
the next run of this process (see :meth:`TimerService.deliver_due
<store.timer.timer_service.TimerService.deliver_due>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..core.ports import StorePort
from ..delayed.restore import restore
from ..base.errors import CorruptRecordError
from ..formats.message import (
    PROPERTY_DELAY_KEY,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_DEQUEUE_MS,
    PROPERTY_TIMER_ENQUEUE_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_TIMES,
    PROPERTY_UNIQ_KEY,
    TIMER_TOPIC,
)
from .timer_checkpoint import TimerCheckpoint
from .timer_log import MAGIC_DELETE, MAGIC_ROLL, TimerLog
from .wheel import TimerWheel

#: TIMER_ENQUEUE_MS of a message delivered straight from the queue (RocketMQ: Long.MAX).
DIRECT_ENQUEUE_MS = 9223372036854775807
#: Units delivered per step.
DEQUEUE_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class TimerDelivery:
    """What the timer hands to :func:`~store.delayed.restore.restore` for fired units:
    ``enqueue_ms`` per record (TIMER_ENQUEUE_MS; negative: delivered straight from the queue,
    :data:`DIRECT_ENQUEUE_MS`), ``roll`` (re-put to the timer topic, TIMER_ROLL_TIMES + 1),
    the precision (a record without TIMER_DELIVER_MS is due at TIMER_OUT_MS + it) and the
    store's delay keys (synced by the caller; a keyed message its key no longer names is
    superseded), or ``None``."""

    enqueue_ms: np.ndarray
    roll: np.ndarray
    precision_ms: int
    keys: object = None

    reads = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_OUT_MS, PROPERTY_DELAY_KEY)
    sets = (PROPERTY_TIMER_DEQUEUE_MS, PROPERTY_TIMER_ENQUEUE_MS, PROPERTY_TIMER_ROLL_TIMES)
    requeue_topic = TIMER_TOPIC

    def part(self, rows: slice) -> TimerDelivery:
        return TimerDelivery(np.asarray(self.enqueue_ms[rows], dtype=np.int64),
                             np.asarray(self.roll[rows], dtype=bool), self.precision_ms,
                             self.keys)

    def requeued(self, n: int) -> np.ndarray:
        return self.roll

    def due_ms(self, pairs, now: int) -> np.ndarray:
        deliver_ms, deliver_ok = pairs.ints(PROPERTY_TIMER_DELIVER_MS)
        out_ms, out_ok = pairs.ints(PROPERTY_TIMER_OUT_MS)
        return np.where(deliver_ok, deliver_ms,
                        np.where(out_ok, out_ms + self.precision_ms, now))

    def set_values(self, pairs, now: int, requeued: np.ndarray):
        n = len(requeued)
        values = np.zeros((len(self.sets), n), dtype=np.int64)
        present = np.zeros((len(self.sets), n), dtype=bool)
        values[0] = now  # TIMER_DEQUEUE_MS
        values[1] = np.where(self.enqueue_ms < 0, DIRECT_ENQUEUE_MS, self.enqueue_ms)
        present[0] = present[1] = True
        if requeued.any():
            times, times_ok = pairs.ints(PROPERTY_TIMER_ROLL_TIMES)
            values[2] = np.where(times_ok, times, 0) + 1
            present[2] = requeued
        return values, present

    def superseded(self, pairs, keep: np.ndarray) -> np.ndarray | None:
        if self.keys is None:
            return None
        has_key, key_start, key_end = pairs.ranges(PROPERTY_DELAY_KEY)
        keyed = np.flatnonzero(keep & has_key)
        if not len(keyed):
            return None
        _, id_start, id_end = pairs.ranges(PROPERTY_UNIQ_KEY)
        out = np.zeros(len(keep), dtype=bool)
        out[keyed[self.keys.superseded(pairs.data, key_start[keyed], key_end[keyed],
                                       id_start[keyed], id_end[keyed])]] = True
        return out


class SplitSlot(NamedTuple):
    """The units of a slot a bounded run split, kept for the next run of this process."""

    #: counter of the checkpoint this process saved last (-1: not saved yet)
    counter: int
    #: the slot's time
    slot_time: int
    #: its last unit (the head of its TimerLog chain)
    last: int
    #: the TimerLog end the units were walked to
    log_end: int
    #: the slot's units, in append order
    units: np.ndarray

    def holds(self, slot_time: int, last: int, log_end: int) -> bool:
        """Whether these are the units of that slot, walked to that TimerLog end."""
        return (self.slot_time, self.last, self.log_end) == (slot_time, last, log_end)


class SlotFiring:
    """Fires due slots of one store's wheel (the dequeue half of the timer service)."""

    def __init__(self, store: StorePort, wheel: TimerWheel, log: TimerLog,
                 precision_ms: int) -> None:
        self.store = store
        self.wheel = wheel
        self.log = log
        self.precision = precision_ms
        #: the units of a slot a bounded run split, for the next run
        self.split_slot: SplitSlot | None = None
        #: the store's delay keys (:class:`store.timer.delay_keys.DelayKeys`), set by the service
        self.keys = None

    def read_props(self, offset: int) -> dict[str, str]:
        try:
            return self.store.commit_log.read_record(offset).properties
        except CorruptRecordError:
            return {}

    def dequeue(self, work: TimerCheckpoint, done: np.ndarray, now: int,
                 budget: int | None = None) -> tuple[int, int, int]:
        """Fire the slots due by ``now``; return ``(delivered, rolled, units handled)``.

        With ``budget``, stops after that many units, possibly inside a slot (recorded in
        ``work.slot_done``; see :meth:`TimerService.deliver_due`).
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
            _first, last, num = self.wheel.get(slot_time)
            split = self.split_slot
            if split is not None and split.holds(slot_time, last, log_end):
                units = split.units  # walked by the run that split this slot
            else:
                _positions, units = self.log.walk_chain(last, log_end, num)
                units = units[::-1]  # append order
            self.split_slot = None
            if not len(units):
                continue
            skip = work.slot_done if slot_time == read_time else 0
            rest = units[skip:]
            if budget is not None and handled + len(rest) > budget:
                # a split slot: its markers (anywhere in the slot) take effect first
                self._marker_keys_of(units, delete_keys)
                rest = rest[:budget - handled]
                stop_at = (slot_time, skip + len(rest))
                self.split_slot = SplitSlot(-1, slot_time, last, log_end, units)
            parts.append(self._drop_done(rest, done))
            pending += len(rest)
            handled += len(rest)
            if pending >= DEQUEUE_CHUNK:
                d, r = self._fire(_joined(parts), delete_keys, now)
                delivered, rolled = delivered + d, rolled + r
                parts, pending = [], 0
            if stop_at is not None:
                break
        if parts:
            d, r = self._fire(_joined(parts), delete_keys, now)
            delivered, rolled = delivered + d, rolled + r
        if stop_at is None:
            work.last_read_time_ms, work.slot_done = floor_now, 0
        else:
            work.last_read_time_ms, work.slot_done = stop_at
        # this run's copies start at its mark (a redo's: the dead run's, earlier still); set
        # with a count of 0 too, so that a count set back to 0 is found by a short scan (and
        # a checkpoint without it is known to be an earlier version's)
        work.slot_done_from = work.deliver_mark + 1 if work.deliver_mark >= 0 else 0
        return delivered, rolled, handled

    def _marker_keys_of(self, units: np.ndarray, keys: set[str]) -> None:
        """Add the TIMER_DEL_UNIQKEY of the (non-rolled) cancel markers among ``units``."""
        is_marker = _markers(units)
        for offset in units["offset_py"][is_marker].tolist():
            key = self.read_props(offset).get(PROPERTY_TIMER_DEL_UNIQKEY)
            if key:
                keys.add(key)

    def _drop_done(self, units: np.ndarray, done: np.ndarray) -> np.ndarray:
        offsets = units["offset_py"]
        keep = offsets >= self.store.commit_log.min_offset()
        if len(done):
            keep &= ~np.isin(offsets, done)
        return units if keep.all() else units[keep]

    def _fire(self, units: np.ndarray, delete_keys: set[str], now: int) -> tuple[int, int]:
        """Deliver or re-put the units of fired slots (markers first)."""
        is_marker = _markers(units)
        if is_marker.any():
            self._marker_keys_of(units, delete_keys)
            units = units[~is_marker]
        return self.deliver_units(units, delete_keys, now, direct=False)

    def deliver_units(self, units: np.ndarray, delete_keys: set[str], now: int, *,
                       direct: bool) -> tuple[int, int]:
        """Restore (or, for ROLL units, re-put) the records of ``units``; vectorised appends."""
        enqueue = units["enqueue_time"].astype(np.int64)
        if direct:
            enqueue = np.full(len(units), -1, dtype=np.int64)
        delivery = TimerDelivery(
            enqueue, (units["magic"] & MAGIC_ROLL) != 0, self.precision,
            self.keys if self.keys is not None and self.keys.active() else None)
        result = restore(self.store, units["offset_py"].astype(np.int64), delivery, now=now,
                         delete_keys=delete_keys)
        return result.delivered, result.rolled


def _markers(units: np.ndarray) -> np.ndarray:
    """Which units are cancel markers (DELETE without ROLL: a rolled marker is re-put)."""
    return (units["magic"] & (MAGIC_DELETE | MAGIC_ROLL)) == MAGIC_DELETE


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The units of ``parts`` as one array (a single part as it is: no copy of a burst)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
