"""``config/transactionIndex.npz``: a snapshot of the transaction index, so a new process reads
the half, op and discard queues from where the snapshot stopped instead of from their start.

An uncompressed NumPy ``.npz`` archive (``allow_pickle=False``); arrays, all little-endian
native NumPy files inside the zip:

    name            dtype    length        meaning
    meta            int64    9             version, base, half_scanned, op_base, op_scanned,
                                           discard_scanned, and the CommitLog offset of the
                                           last entry read from each of the three queues
                                           (-1 when none)
    half_row        int64    half entries  transaction row per half queue offset (from base)
    half_clog       int64    half entries  CommitLog offset per half queue offset
    op_max          int64    op entries    largest half offset each op names (-1: none)
    row_latest      int64    rows          newest half offset of the transaction
    row_born        int64    rows          born time of its first half
    row_ended       bool     rows          an op names one of its halves
    row_discarded   bool     rows          copied to TRANS_CHECK_MAX_TIME_TOPIC
    row_key         S32      rows          transaction id (b"" for ids of another shape)
    odd_ids, odd_rows  str, int64          those other ids and their rows

Written atomically (temp file, fsync, rename).  The snapshot is derived data: on load it is
checked against the ConsumeQueues (each queue must still hold, at the last offset read, an
entry pointing at the recorded CommitLog offset, and must not have shrunk below it); a
snapshot that does not match (a crash after a reboot cut the log, a different store) is
ignored and the index is rebuilt from the queues.
"""

from __future__ import annotations

import os

import numpy as np

from ..core.ports import StorePort
from ..files.fileio import atomic_write
from ..formats.message import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from .transaction_index import KEY_DTYPE, Growable, TransactionIndex

VERSION = 1
FILE_NAME = "transactionIndex.npz"
#: Save at close when the index read at least this many entries (and 10 % more than the last
#: snapshot held) since it was loaded or saved.
SAVE_AFTER_ENTRIES = 4096


def _path(store: StorePort) -> str:
    return os.path.join(store.root, "config", FILE_NAME)


def _last_clog(index: TransactionIndex, topic: str, scanned: int) -> int:
    if scanned <= 0:
        return -1
    entry = index.store.consume_queue(topic, 0).entry(scanned - 1)
    return -1 if entry is None else entry[0]


def save_index(index: TransactionIndex) -> None:
    """Write the snapshot of ``index`` (caller holds the index lock or owns the index)."""
    with index.lock:
        path = _path(index.store)
        meta = np.array([
            VERSION, index.base, index.half_scanned, index.op_base, index.op_scanned,
            index.discard_scanned,
            _last_clog(index, TRANS_HALF_TOPIC, index.half_scanned),
            _last_clog(index, TRANS_OP_HALF_TOPIC, index.op_scanned),
            _last_clog(index, TRANS_CHECK_MAX_TIME_TOPIC, index.discard_scanned),
        ], np.int64)
        odd = sorted(index._odd.items(), key=lambda kv: kv[1])
        atomic_write(path, lambda fh: np.savez(
            fh, meta=meta, half_row=index.half_row.view, half_clog=index.half_clog.view,
            op_max=index.op_max.view, row_latest=index.row_latest.view,
            row_born=index.row_born.view, row_ended=index.row_ended.view,
            row_discarded=index.row_discarded.view, row_key=index.row_key.view,
            odd_ids=np.array([k for k, _ in odd], dtype=str),
            odd_rows=np.array([r for _, r in odd], np.int64)))
        index.saved_entries = index.half_scanned + index.op_scanned + index.discard_scanned


def save_index_if_grown(index: TransactionIndex) -> bool:
    """Save when the index read :data:`SAVE_AFTER_ENTRIES` entries since the last save."""
    read = index.half_scanned + index.op_scanned + index.discard_scanned
    grown = read - index.saved_entries
    if index.base < 0 or grown < max(SAVE_AFTER_ENTRIES, index.saved_entries // 10):
        return False
    save_index(index)
    return True


def load_index(store: StorePort) -> TransactionIndex | None:
    """The index from the snapshot, or ``None`` when there is none or it does not match."""
    path = _path(store)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, KeyError):
        return None
    meta = arrays.get("meta")
    if meta is None or len(meta) != 9 or int(meta[0]) != VERSION:
        return None
    (_, base, half_scanned, op_base, op_scanned, discard_scanned,
     half_last, op_last, disc_last) = (int(v) for v in meta)
    limit = store.confirmed_offset()
    for topic, scanned, last in ((TRANS_HALF_TOPIC, half_scanned, half_last),
                                 (TRANS_OP_HALF_TOPIC, op_scanned, op_last),
                                 (TRANS_CHECK_MAX_TIME_TOPIC, discard_scanned, disc_last)):
        queue = store.consume_queue(topic, 0)
        if queue.max_offset(limit) < scanned:
            return None
        if scanned > 0 and last >= 0:
            entry = queue.entry(scanned - 1)
            if entry is None or entry[0] != last:
                return None
    try:
        index = TransactionIndex(store)
        index.base, index.half_scanned = base, half_scanned
        index.op_base, index.op_scanned = op_base, op_scanned
        index.discard_scanned = discard_scanned
        index.half_row = Growable.of(arrays["half_row"].astype(np.int64))
        index.half_clog = Growable.of(arrays["half_clog"].astype(np.int64))
        index.op_max = Growable.of(arrays["op_max"].astype(np.int64))
        index.row_latest = Growable.of(arrays["row_latest"].astype(np.int64))
        index.row_born = Growable.of(arrays["row_born"].astype(np.int64))
        index.row_ended = Growable.of(arrays["row_ended"].astype(bool))
        index.row_discarded = Growable.of(arrays["row_discarded"].astype(bool))
        index.row_key = Growable.of(arrays["row_key"].astype(KEY_DTYPE))
        rows = index.row_latest.n
        if (index.half_row.n != half_scanned - base or index.op_max.n != op_scanned - op_base
                or not (index.row_born.n == index.row_ended.n == index.row_discarded.n
                        == index.row_key.n == rows)):
            return None
        keys = index.row_key.view
        normal = np.flatnonzero(keys != b"")
        order = np.argsort(keys[normal], kind="stable")
        index._sorted_keys = keys[normal][order]
        index._sorted_rows = normal[order].astype(np.int64)
        for tx, row in zip(arrays["odd_ids"].tolist(), arrays["odd_rows"].tolist()):
            index._odd[tx] = int(row)
            index._odd_by_row[int(row)] = tx
    except (KeyError, ValueError):
        return None
    index.saved_entries = half_scanned + op_scanned + discard_scanned
    return index
