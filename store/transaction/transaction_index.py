"""The transaction index: transaction id -> half messages and outcome, derived from the queues.

Everything here is derived from three ConsumeQueues and their CommitLog records, so every
process (and every restart) reaches the same answers:

* ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0: half messages and their put-back copies; one
  transaction may own several half queue offsets, the newest one is the live copy;
* ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0: op messages; an op naming any half offset of a
  transaction ends the transaction (whether it was committed or rolled back);
* ``TRANS_CHECK_MAX_TIME_TOPIC`` queue 0: halves the check loop gave up on (discarded).

The index is kept in memory and refreshed incrementally by queue offset (each queue is read
once, from where the last refresh stopped, up to the store's confirmed offset).  Reads are
vectorised: ConsumeQueue entries give record positions; NumPy gathers the fields needed
straight from the CommitLog mappings.  Half records carry ``__transactionId__`` as their first
property (:mod:`store.transaction.half`), so a transaction id is 32 bytes at a fixed place
after the topic; records that do not match that shape are decoded one by one instead.

A snapshot (:mod:`store.transaction.snapshot`) lets a new process skip re-reading the queues
from their start; it is checked against the ConsumeQueues before use.
"""

from __future__ import annotations

import threading

import numpy as np

from ..files.consume_queue import live_mask
from ..core.ports import StorePort
from ..base.errors import StoreError
from ..formats.message import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from .half import HALF_QUEUE_ID, transaction_id_of
from .half_records import _KEY_WIDTH, KEY_DTYPE, gather_records
from .op import REMOVE_TAG_CODE, parse_op_bodies

#: Entries read per step: bounds the temporary arrays of one refresh.
CHUNK = 1 << 18


class Growable:
    """A NumPy array that grows by doubling (amortised O(1) appends)."""

    __slots__ = ("data", "n")

    def __init__(self, dtype, fill=0) -> None:
        self.data = np.full(1024, fill, dtype=dtype)
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        """Append ``values``, doubling the capacity when it runs out."""
        k = len(values)
        need = self.n + k
        if need > len(self.data):
            cap = max(need, 2 * len(self.data))
            grown = np.empty(cap, dtype=self.data.dtype)
            grown[:self.n] = self.data[:self.n]
            self.data = grown
        self.data[self.n:need] = values
        self.n = need

    @property
    def view(self) -> np.ndarray:
        return self.data[:self.n]

    @classmethod
    def of(cls, values: np.ndarray) -> Growable:
        g = cls(values.dtype)
        g.extend(values)
        return g


class TransactionIndex:
    """Transaction ids, their half offsets and outcomes (see the module docstring).

    Rows number transactions in the order their first half was indexed.  Per half queue
    offset ``q`` (from :attr:`base`): the row and CommitLog offset.  Per row: newest half
    offset, born time, ended (an op names one of its halves) and discarded.
    """

    def __init__(self, store: StorePort) -> None:
        self.store = store
        self.lock = threading.RLock()
        self.base = -1            # half queue offset of element 0; -1 before the first refresh
        self.half_scanned = 0     # next half queue offset to read
        self.op_base = -1
        self.op_scanned = 0
        self.discard_scanned = 0
        self.half_row = Growable(np.int64)
        self.half_clog = Growable(np.int64)
        self.op_max = Growable(np.int64)      # largest half offset an op names (-1: none)
        self.row_latest = Growable(np.int64)
        self.row_born = Growable(np.int64)
        self.row_ended = Growable(bool)
        self.row_discarded = Growable(bool)
        self.row_key = Growable(KEY_DTYPE)    # b"" for ids of another shape (see _odd)
        self._sorted_keys = np.empty(0, KEY_DTYPE)
        self._sorted_rows = np.empty(0, np.int64)
        self._delta: dict[bytes, int] = {}    # recently added keys not yet in the sorted arrays
        self._odd: dict[str, int] = {}        # ids that are not 32 ASCII characters
        self._odd_by_row: dict[int, str] = {}
        self.saved_entries = 0                # entries read when last snapshotted

    # ------------------------------------------------------------------ lookups
    @property
    def rows(self) -> int:
        """The number of rows (half messages indexed so far)."""
        return self.row_latest.n

    def row_of(self, transaction_id: str) -> int:
        """The row of a transaction id, or -1."""
        with self.lock:
            key = _as_key(transaction_id)
            if key is None:
                return self._odd.get(transaction_id, -1)
            return int(self._lookup(np.array([key], KEY_DTYPE))[0])

    def rows_of(self, transaction_ids) -> list[int]:
        """Rows of many transaction ids at once (-1 for unknown ones)."""
        with self.lock:
            keys = [_as_key(t) for t in transaction_ids]
            normal = [i for i, k in enumerate(keys) if k is not None]
            out = [self._odd.get(t, -1) if k is None else -1
                   for t, k in zip(transaction_ids, keys)]
            if normal:
                found = self._lookup(np.array([keys[i] for i in normal], KEY_DTYPE))
                for i, row in zip(normal, found.tolist()):
                    out[i] = row
            return out

    def transaction_id(self, row: int) -> str:
        """The transaction id of row ``row``."""
        odd = self._odd_by_row.get(row)
        return odd if odd is not None else self.row_key.data[row].decode("ascii")

    def latest_clog(self, row: int) -> int:
        """CommitLog offset of the newest half copy of ``row``."""
        return int(self.half_clog.data[int(self.row_latest.data[row]) - self.base])

    def latest_clogs(self, rows) -> np.ndarray:
        """CommitLog offsets of the newest half copies of ``rows`` (an array of rows)."""
        return self.half_clog.data[self.row_latest.data[rows] - self.base]

    def latest_half_offsets(self, rows) -> np.ndarray:
        """Half queue offsets of the newest half copies of ``rows`` (an array of rows): what
        an op message ending them names."""
        return self.row_latest.data[rows]

    @property
    def half_end(self) -> int:
        """The half queue offset the index has read up to."""
        return self.half_scanned

    def half_clogs(self, half_offsets: np.ndarray) -> np.ndarray:
        """CommitLog offsets of the halves at ``half_offsets`` (read by the index)."""
        return self.half_clog.data[half_offsets - self.base]

    def open_rows_with_prefix(self, prefix: bytes) -> np.ndarray:
        """Rows of open transactions whose id starts with ``prefix`` (ASCII)."""
        n = self.rows
        if n == 0:
            return np.empty(0, np.int64)
        keys = self.row_key.data[:n].view(np.uint8).reshape(n, _KEY_WIDTH)
        mine = (keys[:, :len(prefix)] == np.frombuffer(prefix, np.uint8)).all(axis=1)
        return np.flatnonzero(mine & self.open_rows())

    def oldest_open_clog(self) -> int | None:
        """The CommitLog offset of the oldest open half message (its newest copy), or
        ``None``."""
        n = self.rows
        if n == 0:
            return None
        open_rows = self.open_rows()
        if not open_rows.any():
            return None
        latest = self.row_latest.data[:n][open_rows] - self.base
        latest = latest[(latest >= 0) & (latest < self.half_clog.n)]
        return int(self.half_clog.data[latest].min()) if len(latest) else None

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        rows = np.full(len(keys), -1, np.int64)
        if len(self._sorted_keys):
            pos = np.searchsorted(self._sorted_keys, keys)
            pos_c = np.minimum(pos, len(self._sorted_keys) - 1)
            hit = self._sorted_keys[pos_c] == keys
            rows[hit] = self._sorted_rows[pos_c[hit]]
        if self._delta:
            for i in np.flatnonzero(rows < 0):
                rows[i] = self._delta.get(keys[i].tobytes().rstrip(b"\x00"), -1)
        return rows

    def _add_keys(self, keys: np.ndarray, rows: np.ndarray) -> None:
        limit = max(65536, len(self._sorted_keys) // 8)
        if len(keys) > 4096 or len(self._delta) + len(keys) > limit:
            all_keys = np.concatenate([self._sorted_keys, keys,
                                       np.array(list(self._delta), KEY_DTYPE)])
            delta_rows = np.fromiter(self._delta.values(), np.int64, len(self._delta))
            all_rows = np.concatenate([self._sorted_rows, rows, delta_rows])
            order = np.argsort(all_keys, kind="stable")
            self._sorted_keys = all_keys[order]
            self._sorted_rows = all_rows[order]
            self._delta = {}
        else:
            for k, r in zip(keys.tolist(), rows.tolist()):
                self._delta[k] = r

    # ------------------------------------------------------------------ refreshing
    def refresh(self) -> None:
        """Read what the three queues gained since the last refresh."""
        with self.lock:
            store = self.store
            limit = store.confirmed_offset()
            half_cq = store.consume_queue(TRANS_HALF_TOPIC, HALF_QUEUE_ID)
            op_cq = store.consume_queue(TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID)
            if self.base < 0:
                cl_min = store.commit_log.min_offset()
                self.base = half_cq.min_offset(cl_min, limit)
                self.half_scanned = self.base
                self.op_base = op_cq.min_offset(cl_min, limit)
                self.op_scanned = self.op_base
                disc = store.consume_queue(TRANS_CHECK_MAX_TIME_TOPIC, 0)
                self.discard_scanned = disc.min_offset(cl_min, limit)
            # halves first: an op is always stored after the halves it names
            half_max = half_cq.max_offset(limit)
            while self.half_scanned < half_max:
                end = min(half_max, self.half_scanned + CHUNK)
                self._add_halves(half_cq.entries(self.half_scanned, end), self.half_scanned)
                self.half_scanned = end
            op_max = op_cq.max_offset(limit)
            while self.op_scanned < op_max:
                end = min(op_max, self.op_scanned + CHUNK)
                self._add_ops(op_cq.entries(self.op_scanned, end))
                self.op_scanned = end
            disc_cq = store.consume_queue(TRANS_CHECK_MAX_TIME_TOPIC, 0)
            disc_max = disc_cq.max_offset(limit)
            while self.discard_scanned < disc_max:
                end = min(disc_max, self.discard_scanned + CHUNK)
                self._add_discards(disc_cq.entries(self.discard_scanned, end))
                self.discard_scanned = end

    def _keys_of(self, clogs: np.ndarray, fields) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Keys (S32) for records; ids of another shape come back as (position, id) pairs."""
        keys = fields["key"].copy()
        odd: list[tuple[int, str]] = []
        for i in np.flatnonzero(~fields["key_ok"] & (fields["segment"] >= 0)):
            try:
                tx = transaction_id_of(self.store.read_record(int(clogs[i])))
            except StoreError:  # unreadable record: not indexed
                tx = None
            if not tx:
                continue
            key = _as_key(tx)
            if key is None:
                odd.append((int(i), tx))
            else:
                keys[i] = key
        return keys, odd

    def _add_halves(self, entries: np.ndarray, first: int) -> None:
        clogs = entries["offset"].astype(np.int64)
        n = len(clogs)
        valid = live_mask(entries)
        fields = gather_records(self.store, clogs)
        fields["key_ok"] &= valid
        fields["segment"][~valid] = -1
        keys, odd = self._keys_of(clogs, fields)
        rows = np.full(n, -1, np.int64)
        has = keys != b""
        has[[i for i, _ in odd]] = False
        if has.any():
            uniq, first_pos, inverse = np.unique(keys[has], return_index=True, return_inverse=True)
            urows = self._lookup(uniq)
            new = np.flatnonzero(urows < 0)
            if len(new):
                start = self.rows
                urows[new] = start + np.arange(len(new))
                born = fields["born"][np.flatnonzero(has)[first_pos[new]]]
                self._new_rows(uniq[new], born)
                self._add_keys(uniq[new], urows[new])
            rows[has] = urows[inverse.ravel()]
        for i, tx in odd:
            row = self._odd.get(tx, -1)
            if row < 0:
                row = self.rows
                self._odd[tx] = row
                self._odd_by_row[row] = tx
                self._new_rows(np.array([b""], KEY_DTYPE), fields["born"][i:i + 1])
            rows[i] = row
        self.half_row.extend(rows)
        self.half_clog.extend(clogs)
        known = rows >= 0
        if known.any():
            np.maximum.at(self.row_latest.data, rows[known],
                          first + np.flatnonzero(known).astype(np.int64))

    def _new_rows(self, keys: np.ndarray, born: np.ndarray) -> None:
        k = len(keys)
        self.row_key.extend(keys)
        self.row_born.extend(born)
        self.row_latest.extend(np.full(k, -1, np.int64))
        self.row_ended.extend(np.zeros(k, bool))
        self.row_discarded.extend(np.zeros(k, bool))

    def _add_ops(self, entries: np.ndarray) -> None:
        n = len(entries)
        op_max = np.full(n, -1, np.int64)
        is_remove = (entries["tags_code"] == REMOVE_TAG_CODE) & live_mask(entries)
        sel = np.flatnonzero(is_remove)
        if len(sel):
            clogs = entries["offset"][sel].astype(np.int64)
            fields = gather_records(self.store, clogs)
            values_all, owners_all = [], []
            for s, buf in enumerate(fields["buffers"]):
                part = np.flatnonzero(fields["segment"] == s)
                values, owner = parse_op_bodies(buf, fields["body_start"][part],
                                                fields["body_len"][part])
                values_all.append(values)
                owners_all.append(part[owner])
            if values_all:
                values = np.concatenate(values_all)
                owners = np.concatenate(owners_all)
                np.maximum.at(op_max, sel[owners], values)
                self._mark_ended(values)
        self.op_max.extend(op_max)

    def _mark_ended(self, half_offsets: np.ndarray) -> None:
        rel = half_offsets - self.base
        ok = (rel >= 0) & (rel < self.half_row.n)
        rows = self.half_row.data[rel[ok]]
        self.mark_ended(rows[rows >= 0])

    # ------------------------------------------------------------------ the rows' state
    def open_rows(self) -> np.ndarray:
        """A mask over the rows: transactions neither ended nor discarded, with a half copy."""
        n = self.rows
        return ~self.row_ended.data[:n] & ~self.row_discarded.data[:n] \
            & (self.row_latest.data[:n] >= 0)

    def ended(self, rows) -> np.ndarray:
        """Whether each of ``rows`` (an index, or an array of them) has ended."""
        return self.row_ended.data[rows]

    def mark_ended(self, rows) -> None:
        """Record that the transactions of ``rows`` ended (a commit, a rollback, a sink
        batch): the one place their ended state is written."""
        self.row_ended.data[rows] = True

    def _add_discards(self, entries: np.ndarray) -> None:
        clogs = entries["offset"].astype(np.int64)
        valid = live_mask(entries)
        fields = gather_records(self.store, clogs)
        fields["key_ok"] &= valid
        fields["segment"][~valid] = -1
        keys, odd = self._keys_of(clogs, fields)
        has = keys != b""
        rows = self._lookup(keys[has]) if has.any() else np.empty(0, np.int64)
        rows = list(rows[rows >= 0]) + [self._odd[tx] for _, tx in odd if tx in self._odd]
        if rows:
            self.row_discarded.data[np.array(rows, np.int64)] = True

    # ------------------------------------------------------------------ views for the check loop
    def window(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Half offsets in ``[start, end)`` that still need the check loop, and their rows.

        A half offset is done when its transaction ended, was discarded, or has a newer copy
        (the copy carries the transaction on).
        """
        lo = max(start, self.base) - self.base
        hi = min(end, self.half_scanned) - self.base
        if hi <= lo:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        rows = self.half_row.data[lo:hi]
        qoffs = np.arange(lo, hi, dtype=np.int64) + self.base
        known = rows >= 0
        safe = np.where(known, rows, 0)
        live = known & ~self.row_ended.data[safe] & ~self.row_discarded.data[safe] \
            & (self.row_latest.data[safe] == qoffs)
        return qoffs[live], rows[live]

    def op_progress(self, op_start: int, half_progress: int) -> int:
        """First op offset from ``op_start`` that names a half offset >= ``half_progress``.

        RocketMQ advances the op offset over the contiguous run of ops whose halves are all
        behind the half offset; an op that names nothing counts as done.
        """
        lo = max(op_start, self.op_base) - self.op_base
        arr = self.op_max.data[lo:self.op_max.n]
        pending = np.flatnonzero(arr >= half_progress)
        return self.op_base + (lo + int(pending[0]) if len(pending) else self.op_max.n)

    def pending_stats(self) -> dict:
        """Transactions neither ended nor discarded: how many and the oldest born time."""
        n = self.rows
        live = self.open_rows()
        count = int(live.sum())
        oldest = int(self.row_born.data[:n][live].min()) if count else None
        return {"pending": count, "oldest_born_ms": oldest, "transactions": n,
                "ended": int(self.row_ended.data[:n].sum()),
                "discarded": int(self.row_discarded.data[:n].sum())}


    def oldest_open(self, limit: int) -> list[tuple[str, int, int]]:
        """``(transaction id, born ms, CommitLog offset of its newest half copy)`` of the
        ``limit`` oldest open transactions."""
        n = self.rows
        live = np.flatnonzero(self.open_rows())
        born = self.row_born.data[:n][live]
        rows = live[np.argsort(born, kind="stable")[:limit]]
        return [(self.transaction_id(r), int(self.row_born.data[r]), self.latest_clog(r))
                for r in rows.tolist()]


def _as_key(transaction_id: str) -> bytes | None:
    """The ``S32`` key of an id, or ``None`` when it is not 32 printable ASCII characters."""
    if len(transaction_id) != _KEY_WIDTH:
        return None
    try:
        raw = transaction_id.encode("ascii")
    except UnicodeEncodeError:
        return None
    return raw if raw.isalnum() else None
