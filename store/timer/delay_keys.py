"""Replace by key: a delay key names at most one pending timer message.

``producer.send(message, delay_ms=..., key=K)`` (and ``producer.replace_table``) stores a
timer message carrying the property ``RMQ_DELAY_KEY=K``; it replaces the message sent before
with the same key.  ``producer.cancel(key=K)`` stores a *keys-cancel record*: a timer-topic
cancel marker (so the timer and RocketMQ pass over it) whose body lists the keys it cancels
and whose property ``__RMQ_DELAY_KEYS_CANCELLED`` says so.  Keys are one namespace per store.

Nothing is looked up or rewritten at send time: the timer topic's ConsumeQueue, in its
order, is the truth.  :class:`DelayKeys` keeps the :class:`~store.timer.delay_key_table.
DelayKeyTable` (key -> the hash of the id of the message it names now, and that message's
fire time) up to date by applying the keyed and keys-cancel records appended since it last
looked (:meth:`DelayKeys.sync`), and the timer's delivery, holding the write lock, syncs it
and then drops every keyed message whose id is not the one its key names
(:meth:`DelayKeys.superseded`).  So once a replacing send or a cancel has returned, its record
is in the queue and no later delivery lets the old message through, whichever process
delivers, across crashes: a delivery that was killed is redone after a sync.  A keyed
message already delivered when the replace came stays delivered (it was due first).

Costs: no Python step per message (the properties of new timer records are scanned by the
compiled property pass, the table is probed vectorised); no process heap per key (the table
is file-backed).  The table exists from a store's first keyed send; stores that never use
keys pay nothing.  A missing or damaged table is rebuilt from the timer topic.
"""

from __future__ import annotations

import logging
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..files.crash_points import crash_point
from ..core.ports import StorePort
from ..delayed.delivery import origins_since, read_queue_entries
from ..base.errors import CorruptRecordError, InvalidMessageError, UnknownTopicError
from ..files.fileio import move_aside
from ..formats.record_codec import RecordSpec
from ..files.record_gather import SourceRecords
from ..kernels.property_scan import hash_ranges, parse_int_ranges, scan_properties
from ..formats.byte_columns import ByteColumn
from ..kernels.segment_walk import body_crcs
from ..formats.message import (
    PROPERTY_DELAY_KEY,
    PROPERTY_DELAY_KEYS_CANCELLED,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_UNIQ_KEY,
    TIMER_TOPIC,
    MAX_DELAY_KEY_BYTES,
    validate_delay_key,
)
from .delay_key_table import FILE_NAME, DelayKeyTable
from .timer_queue import RECALL_TAG

log = logging.getLogger("store")

#: Most keys one keys-cancel record lists (its body stays well under the 4 MiB limit).
CANCEL_RECORD_KEYS = 65_536
#: Timer-queue entries read per step of a sync.
SYNC_CHUNK = 65_536
#: What a keys-cancel record names as its target (no message has it).
_CANCEL_TARGET = "RMQ_SYS_DELAY_KEYS"
_NAMES = (PROPERTY_DELAY_KEY, PROPERTY_UNIQ_KEY, PROPERTY_TIMER_DELIVER_MS,
          PROPERTY_TIMER_OUT_MS, PROPERTY_DELAY_KEYS_CANCELLED)
_K_KEY, _K_UNIQ, _K_DELIVER, _K_OUT, _K_CANCELLED = range(len(_NAMES))
_U32 = struct.Struct(">I")
#: Events of one record sort by ``record * _ROW + position in the record``.
_ROW = 1 << 22


def fingerprints(data: np.ndarray, starts: np.ndarray, ends: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(key_hash, key_check)`` of the byte ranges (see :mod:`store.timer.delay_key_table`)."""
    h = hash_ranges(data, starts, ends).view(np.int64)
    h = np.where(h == 0, 1, h)
    check = (body_crcs(data, starts, ends) << 32) | (np.asarray(ends) - np.asarray(starts))
    return h, check


def message_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The table's ``msg_hash`` of message ids (never 0: 0 marks a cancelled key)."""
    h = hash_ranges(data, starts, ends).view(np.int64)
    return np.where(h == 0, 1, h)


def key_list(keys) -> list:
    """Keys as a list of str, from a list, an Arrow array or a pandas Series (a single str
    is refused: it names one key, which ``cancel(key=...)`` takes)."""
    if isinstance(keys, str):
        raise InvalidMessageError(f"keys={keys!r}; allowed: a list of keys (for one key: "
                                  "cancel(key=...))")
    if hasattr(keys, "to_pylist"):
        return keys.to_pylist()
    return list(keys)


def key_column(keys) -> ByteColumn:
    """A column of validated keys (a sequence of str, or an Arrow string array: checked as
    a whole column)."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return ByteColumn.from_arrow(checked_key_array(keys))
    if not isinstance(keys, (list, tuple)):
        keys = list(keys)
    return ByteColumn.of([validate_delay_key(k).encode("utf-8", "surrogatepass") for k in keys])


def checked_key_array(keys) -> pa.Array:
    """An Arrow string column of keys, checked whole (no nulls, 1 to 1,024 bytes, no
    separators); :class:`InvalidMessageError` names the first bad row."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        raise InvalidMessageError(f"keys of type {keys.type}; allowed: strings")
    lengths = pc.binary_length(keys)
    bad = pc.or_kleene(pc.or_kleene(pc.is_null(keys), pc.less(lengths, 1)),
                       pc.greater(lengths, MAX_DELAY_KEY_BYTES))
    bad = pc.or_kleene(bad, pc.match_substring_regex(keys, "[\\x00\\x01\\x02]"))
    bad = bad.fill_null(True).to_numpy(zero_copy_only=False)
    if bad.any():
        row = int(np.argmax(bad))
        validate_delay_key(keys[row].as_py())  # raises with what is wrong
        raise InvalidMessageError(f"key in row {row}; allowed: a non-empty str")
    return keys


def key_owners(keys, members: int) -> np.ndarray:
    """The member (``0 .. members - 1``) that owns each key in a store group: the key's
    hash modulo the member count (a group's members are fixed when it is made, so a key's
    owner never changes)."""
    col = key_column(keys)
    h = fingerprints(col.data, col.starts, col.ends)[0]
    return (h.view(np.uint64) % np.uint64(members)).astype(np.int64)


def key_shares(keys, members: int) -> list[tuple[int, np.ndarray]]:
    """``[(member, positions of its keys)]`` for the members that own any of ``keys``."""
    owners = key_owners(keys, members)
    shares = [(i, np.flatnonzero(owners == i)) for i in range(members)]
    return [(i, rows) for i, rows in shares if len(rows)]


def cancel_bodies(col: ByteColumn) -> list[tuple[bytes, int]]:
    """The bodies of the keys-cancel records listing ``col`` and how many keys each lists:
    ``count``, ``count + 1`` offsets (big-endian uint32), then the keys' bytes; at most
    :data:`CANCEL_RECORD_KEYS` keys each."""
    out = []
    for lo in range(0, len(col), CANCEL_RECORD_KEYS):
        part = col.slice(lo, min(len(col), lo + CANCEL_RECORD_KEYS))
        offsets = (part.offsets - part.offsets[0]).astype(">u4")
        data = part.data[int(part.offsets[0]):int(part.offsets[-1])]
        out.append((_U32.pack(len(part)) + offsets.tobytes() + data.tobytes(), len(part)))
    return out


def parse_cancel_body(body: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(data, starts, ends)`` of the keys a keys-cancel record's body lists (``None``:
    not such a body, a damaged record)."""
    raw = body.tobytes() if not isinstance(body, bytes) else body
    if len(raw) < 8:
        return None
    n = _U32.unpack_from(raw, 0)[0]
    head = 4 + 4 * (n + 1)
    if len(raw) < head:
        return None
    offsets = np.frombuffer(raw, dtype=">u4", count=n + 1, offset=4).astype(np.int64)
    if offsets[0] != 0 or (np.diff(offsets) < 0).any() or head + offsets[-1] != len(raw):
        return None
    data = np.frombuffer(raw, dtype=np.uint8, offset=head)
    return data, offsets[:-1], offsets[1:]


class DelayKeys:
    """The delay keys of one store (see the module docstring).

    Parameters
    ----------
    store : StorePort
        The store; every method but :meth:`active` is called with its write lock held, or
        takes it.
    precision_ms : int
        The timer's precision.
    progress : callable
        ``progress() -> (last_read_time_ms, enqueued_to, deliver_mark)``: how far the timer
        has fired and enqueued, and the mark of a delivery run a killed process left (-1:
        none; the caller holds the write lock); keys whose message is done are dropped from
        the table when it is rebuilt.
    """

    def __init__(self, store: StorePort, precision_ms: int, progress) -> None:
        self.store = store
        self.precision = precision_ms
        self._progress = progress
        self.path = os.path.join(store.root, FILE_NAME)
        self._table: DelayKeyTable | None = None

    def active(self) -> bool:
        """Whether this store has used delay keys (its table exists)."""
        return self._table is not None or os.path.exists(self.path)

    # ------------------------------------------------------------------ the table
    def ensure(self) -> None:
        """Create the table before a store's first keyed send (a full scan of the timer
        topic, which holds no keyed record yet unless the table was lost)."""
        if self._table is not None:
            return
        with self.store.write_lock():
            self.sync(create=True)

    def take_over(self) -> None:
        """A replica starting to lead: the table as its own log says (a follower never
        updates it, and a cut or a change of role set its file aside: rebuilt from the
        timer topic, one scan)."""
        with self.store.write_lock():
            self.sync(create=True)

    def sync(self, *, create: bool = False) -> DelayKeyTable | None:
        """The table, with every record of the timer topic applied (``None``: keys never
        used and ``create`` not asked).  The caller holds the write lock."""
        table = self._open(create)
        if table is None:
            return None
        qmin, qmax = self._queue_bounds()
        start = max(table.indexed_to, qmin)
        if start < qmax:
            self._apply(table, start, qmax)
        return table

    def _open(self, create: bool) -> DelayKeyTable | None:
        table = self._table
        if table is not None:
            try:
                table.refresh()
                return table
            except FileNotFoundError:  # set aside (a cut, a change of role): rebuilt
                table.close()
                self._table = None
                create = True
        if not os.path.exists(self.path):
            if not create:
                return None
            DelayKeyTable.create(self.path, indexed_to=0)
        try:
            table = DelayKeyTable(self.path)
        except CorruptRecordError as exc:
            where = move_aside(self.path)
            log.warning("%s; set aside as %s and rebuilt from the timer topic", exc, where)
            DelayKeyTable.create(self.path, indexed_to=0)
            table = DelayKeyTable(self.path)
        self._table = table
        return table

    def _queue_bounds(self) -> tuple[int, int]:
        store = self.store
        try:
            store.max_offset(TIMER_TOPIC, 0)
        except UnknownTopicError:
            return 0, 0
        queue = store.consume_queue(TIMER_TOPIC, 0)
        confirmed = store.confirmed_offset()
        return (queue.min_offset(store.commit_log.min_offset(), confirmed),
                queue.max_offset(confirmed))

    def _apply(self, table: DelayKeyTable, start: int, end: int) -> None:
        """Apply the keyed and keys-cancel records of timer-queue offsets ``[start, end)``."""
        queue = self.store.consume_queue(TIMER_TOPIC, 0)
        for lo in range(start, end, SYNC_CHUNK):
            hi = min(end, lo + SYNC_CHUNK)
            entries = read_queue_entries(queue, lo, hi)
            real = entries["size"] > 0
            events = self._events(entries["offset"][real].astype(np.int64),
                                  lo + np.flatnonzero(real))
            if events is not None:
                self._upsert(table, *events)
            table.set_indexed_to(hi)

    def _events(self, offsets: np.ndarray, queue_offsets: np.ndarray):
        """``(key_hash, key_check, msg_hash, fire_ms, queue_offset, is_cancel)`` of the
        records at CommitLog ``offsets`` (timer-queue ``queue_offsets``), in their order
        (``None``: no keyed record among them)."""
        if not len(offsets):
            return None
        log_ = self.store.commit_log
        segment = offsets // self.store.config.commitlog_file_size_bytes
        bounds = np.flatnonzero(segment[1:] != segment[:-1]) + 1
        parts = []
        for lo, hi in zip(np.concatenate(([0], bounds)).tolist(),
                          np.concatenate((bounds, [len(offsets)])).tolist()):
            src = SourceRecords(log_, offsets[lo:hi])
            found, v0, v1 = scan_properties(src.properties, _NAMES)
            ok = src.ok
            keyed = np.flatnonzero(ok & found[_K_KEY] & ~found[_K_CANCELLED])
            cancels = np.flatnonzero(ok & found[_K_CANCELLED])
            if not len(keyed) and not len(cancels):
                continue
            data = src.properties.data
            if len(keyed):
                h, c = fingerprints(data, v0[_K_KEY, keyed], v1[_K_KEY, keyed])
                m = message_hashes(data, v0[_K_UNIQ, keyed], v1[_K_UNIQ, keyed])
                deliver, d_ok = parse_int_ranges(data, v0[_K_DELIVER, keyed], v1[_K_DELIVER, keyed])
                out, o_ok = parse_int_ranges(data, v0[_K_OUT, keyed], v1[_K_OUT, keyed])
                d_ok &= found[_K_DELIVER, keyed]
                o_ok &= found[_K_OUT, keyed]
                fire = np.where(d_ok, deliver, np.where(o_ok, out + self.precision, 0))
                parts.append((h, c, m, np.maximum(fire, 0), queue_offsets[lo + keyed],
                              np.zeros(len(h), bool), (lo + keyed) * _ROW))
            bodies = src.bodies
            for r in cancels.tolist():
                parsed = parse_cancel_body(bodies.data[bodies.starts[r]:bodies.ends[r]])
                if parsed is None:
                    log.warning("a keys-cancel record at CommitLog offset %d has a damaged "
                                "body; skipped", int(offsets[lo + r]))
                    continue
                kd, ks, ke = parsed
                h, c = fingerprints(kd, ks, ke)
                n = len(h)
                parts.append((h, c, np.zeros(n, np.int64), np.full(n, -1, np.int64),
                              np.full(n, -1, np.int64), np.ones(n, bool),
                              (lo + r) * _ROW + np.arange(n)))
        if not parts:
            return None
        cols = [np.concatenate([p[i] for p in parts]) for i in range(7)]
        order = np.argsort(cols[6], kind="stable")
        return tuple(col[order] for col in cols[:6])

    def _upsert(self, table: DelayKeyTable, h, c, m, fire, qoff, is_cancel) -> None:
        """Apply events in order: per key the last one decides; a cancel keeps the fire
        time and queue offset of the message it cancels (so that the slot can be forgotten
        once that message is done)."""
        n = len(h)
        seq = np.arange(n)
        order = np.lexsort((seq, c, h))
        hs, cs = h[order], c[order]
        new_group = np.empty(n, dtype=bool)
        new_group[0] = True
        new_group[1:] = (hs[1:] != hs[:-1]) | (cs[1:] != cs[:-1])
        last = np.empty(n, dtype=bool)
        last[:-1] = new_group[1:]
        last[-1] = True
        group_start = np.maximum.accumulate(np.where(new_group, seq, 0))
        keyed_at = np.maximum.accumulate(np.where(~is_cancel[order], seq, -1))
        final = order[last]
        prior = keyed_at[last]
        take = is_cancel[final] & (prior >= group_start[last])
        fire_final, qoff_final = fire[final].copy(), qoff[final].copy()
        fire_final[take] = fire[order[prior[take]]]
        qoff_final[take] = qoff[order[prior[take]]]
        msg_final = np.where(is_cancel[final], 0, m[final])
        if table.needs_room(len(final)):
            table.rebuild(len(final), self._done)
        crash_point("timer.key_table", "before")
        table.upsert(h[final], c[final], msg_final, fire_final, qoff_final)
        crash_point("timer.key_table", "after")

    def _fired(self, fire_ms: np.ndarray, queue_offset: np.ndarray) -> np.ndarray:
        """Which of these messages the timer is past: taken into the wheel and their slot
        read (delivered, or dropped as cancelled).  The caller holds the write lock.

        A delivery run a killed process left (its mark still set) delivered messages its
        checkpoint does not show yet: those whose record is the origin of a record appended
        since the mark (a message it rolled is named by its rolled copy, which the table
        has taken in its place, so its origin does not count)."""
        last_read, enqueued_to, mark = self._progress()
        fire = np.asarray(fire_ms, dtype=np.int64)
        qoff = np.asarray(queue_offset, dtype=np.int64)
        out_ms = np.where(fire % self.precision == 0, fire - self.precision,
                          fire - fire % self.precision)
        fired = (qoff < enqueued_to) & (out_ms < last_read)
        rest = np.flatnonzero(~fired & (qoff >= 0))
        if mark >= 0 and len(rest):
            origins = origins_since(self.store, mark)
            if len(origins):
                fired[rest] = np.isin(self._record_offsets(qoff[rest]), origins)
        return fired

    def _record_offsets(self, queue_offsets: np.ndarray) -> np.ndarray:
        """The CommitLog offsets of the timer-queue entries ``queue_offsets`` (-1: gone)."""
        queue = self.store.consume_queue(TIMER_TOPIC, 0)
        out = np.full(len(queue_offsets), -1, dtype=np.int64)
        for i, q in enumerate(queue_offsets.tolist()):
            entry = read_queue_entries(queue, q, q + 1)
            if len(entry):
                out[i] = int(entry["offset"][0])
        return out

    def _done(self, slots: np.ndarray) -> np.ndarray:
        """Slots the table may forget when it is rebuilt: their message is fired."""
        return self._fired(slots["fire_ms"], slots["queue_offset"])

    # ------------------------------------------------------------------ delivery
    def superseded(self, data: np.ndarray, key_start: np.ndarray, key_end: np.ndarray,
                   id_start: np.ndarray, id_end: np.ndarray) -> np.ndarray:
        """Which of these keyed messages (key and id as byte ranges of ``data``) their key no
        longer names: replaced or cancelled.  Reads the table as the last :meth:`sync` left
        it (the delivery syncs first, under the write lock)."""
        table = self._table
        if table is None or not len(key_start):
            return np.zeros(len(key_start), dtype=bool)
        h, c = fingerprints(data, key_start, key_end)
        at = table.find(h, c)
        known = at >= 0
        out = np.zeros(len(key_start), dtype=bool)
        if known.any():
            m = message_hashes(data, id_start[known], id_end[known])
            out[known] = table.slots["msg_hash"][at[known]] != m
        return out

    # ------------------------------------------------------------------ cancel
    def pending(self, keys) -> np.ndarray:
        """Per key: whether it names a message not yet delivered (as far as the timer's
        progress shows)."""
        col = key_column(keys)
        with self.store.write_lock():
            table = self.sync()
            return self._pending(table, col)

    def _pending(self, table: DelayKeyTable | None, col: ByteColumn) -> np.ndarray:
        if table is None or not len(col):
            return np.zeros(len(col), dtype=bool)
        h, c = fingerprints(col.data, col.starts, col.ends)
        at = table.find(h, c)
        out = np.zeros(len(col), dtype=bool)
        known = np.flatnonzero(at >= 0)
        if len(known):
            slots = table.slots[at[known]]
            out[known] = (slots["msg_hash"] != 0) & ~self._fired(slots["fire_ms"],
                                                                slots["queue_offset"])
        return out

    def cancel(self, keys) -> np.ndarray:
        """Cancel the pending messages these keys name; per key, whether it named one.

        One keys-cancel record per :data:`CANCEL_RECORD_KEYS` keys that named a pending
        message; keys naming none store nothing.
        """
        col = key_column(keys)
        store = self.store
        with store.write_lock():
            table = self.sync()
            found = self._pending(table, col)
            if not found.any():
                return found
            take = np.flatnonzero(found)
            chosen = ByteColumn.of([col.data[col.offsets[i]:col.offsets[i + 1]].tobytes()
                                    for i in take.tolist()]) if len(take) != len(col) else col
            now = store.now_ms()
            specs = [self._cancel_spec(body, len_, now) for body, len_ in
                     cancel_bodies(chosen)]
            store.append(specs)
            self.sync()
            self.release_memory()
            return found

    def _cancel_spec(self, body: bytes, n: int, now: int) -> RecordSpec:
        msg_id = self.store.id_generator.next_id(now)
        out = now - now % self.precision
        props = {
            PROPERTY_UNIQ_KEY: msg_id, PROPERTY_TAGS: RECALL_TAG,
            PROPERTY_TIMER_OUT_MS: str(out), PROPERTY_TIMER_DELIVER_MS: str(now),
            PROPERTY_TIMER_DEL_UNIQKEY: f"{_CANCEL_TARGET}+{msg_id}",
            PROPERTY_REAL_TOPIC: _CANCEL_TARGET, PROPERTY_REAL_QUEUE_ID: "0",
            PROPERTY_DELAY_KEYS_CANCELLED: str(n),
        }
        return RecordSpec(topic=TIMER_TOPIC, body=body, properties=props, queue_id=0,
                          born_timestamp_ms=now)

    def release_memory(self) -> None:
        """Drop the process's resident pages of the table (after a sync or a delivery)."""
        if self._table is not None:
            self._table.release_memory()

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None
