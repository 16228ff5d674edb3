"""Firing due wheel slots: walking their TimerLog chains and delivering what they hold.

Every slot T with ``T + P <= now`` is read, newest unit first through ``prevPos`` and then in
append order; cancel markers in the slot drop their targets; the rest are restored to their
real topic and queue (:mod:`store.delayed.restore`), or re-put to the timer topic when rolled.
A bounded run may stop inside a slot: :attr:`SlotFiring.split_slot` keeps the walked units for
the next run of this process (see :meth:`TimerService.deliver_due
<store.timer.timer_service.TimerService.deliver_due>`).
"""

from __future__ import annotations

import numpy as np

from ..core.ports import StorePort
from ..delayed.restore import restore
from ..base.errors import CorruptRecordError
from ..formats.message import PROPERTY_TIMER_DEL_UNIQKEY
from .timer_checkpoint import TimerCheckpoint
from .timer_log import MAGIC_DELETE, MAGIC_ROLL, TimerLog
from .wheel import TimerWheel

#: TIMER_ENQUEUE_MS of a message delivered straight from the queue (RocketMQ: Long.MAX).
DIRECT_ENQUEUE_MS = 9223372036854775807
#: Units delivered per step.
DEQUEUE_CHUNK = 1 << 16


class SlotFiring:
    """Fires due slots of one store's wheel (the dequeue half of the timer service)."""

    def __init__(self, store: StorePort, wheel: TimerWheel, log: TimerLog,
                 precision_ms: int) -> None:
        self.store = store
        self.wheel = wheel
        self.log = log
        self.precision = precision_ms
        # the units of a slot a bounded run split, for the next run: (counter of the
        # checkpoint this process saved last, slot time, its last unit, TimerLog end, units)
        self.split_slot: tuple | None = None
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
            if split is not None and split[1:4] == (slot_time, last, log_end):
                units = split[4]  # walked by the run that split this slot
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
                self.split_slot = (-1, slot_time, last, log_end, units)
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
        result = restore(self.store, units["offset_py"].astype(np.int64), now=now,
                         enqueue_ms=enqueue, roll=(units["magic"] & MAGIC_ROLL) != 0,
                         delete_keys=delete_keys, timer_precision_ms=self.precision,
                         keys=self.keys if self.keys is not None and self.keys.active() else None,
                         direct_enqueue_ms=DIRECT_ENQUEUE_MS)
        return result.delivered, result.rolled


def _markers(units: np.ndarray) -> np.ndarray:
    """Which units are cancel markers (DELETE without ROLL: a rolled marker is re-put)."""
    return (units["magic"] & (MAGIC_DELETE | MAGIC_ROLL)) == MAGIC_DELETE


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The units of ``parts`` as one array (a single part as it is: no copy of a burst)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
