"""Reading the transaction fields of many records at once (vectorised per CommitLog segment).

Half messages carry their transaction id as the first property (``__transactionId__``, 32
characters); :func:`gather_records` reads it, with born and store times, for many records at
once, for the :class:`~store.transaction.index.TransactionIndex`.
"""

from __future__ import annotations

import numpy as np

from ..codec import FIELD_OFFSET, HEADER_SIZE
from ..core.ports import StorePort
from ..message import PROPERTY_TRANSACTION_ID

#: Transaction ids written by the store are 32 upper-case hex characters (UNIQ_KEY).
KEY_DTYPE = np.dtype("S32")
_KEY_WIDTH = KEY_DTYPE.itemsize
_TX_PREFIX = (PROPERTY_TRANSACTION_ID + "\x01").encode("ascii")
_TX_PREFIX_ARR = np.frombuffer(_TX_PREFIX, dtype=np.uint8)
_PAIR_END = 0x02


def _be(buf: np.ndarray, pos: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian integers of ``width`` bytes at positions ``pos`` of ``buf`` (gathered)."""
    raw = buf[pos[:, None] + np.arange(width)[None, :]]
    return np.ascontiguousarray(raw).view(dtype).ravel().astype(np.int64)


def gather_records(store: StorePort, offsets: np.ndarray, *, want_body: bool = False):
    """Read fields of many records at CommitLog ``offsets`` (vectorised per segment).

    Returns a dict of arrays aligned with ``offsets``: ``born`` (int64), ``store_ts``,
    ``key`` (``S32`` transaction id when the record has the half-record shape, else empty),
    ``key_ok`` (bool) and, with ``want_body``, ``body_start``/``body_len`` into the per-record
    ``segment`` buffers (``buffers`` list, ``segment`` index array).
    """
    n = len(offsets)
    out = {
        "born": np.zeros(n, np.int64), "store_ts": np.zeros(n, np.int64),
        "key": np.zeros(n, KEY_DTYPE), "key_ok": np.zeros(n, bool),
        "body_len": np.zeros(n, np.int64), "body_start": np.zeros(n, np.int64),
        "segment": np.full(n, -1, np.int64), "buffers": [],
    }
    if n == 0:
        return out
    log = store.commit_log
    size = log.file_size
    seg_of = offsets // size
    for seg in np.unique(seg_of):
        sel = np.flatnonzero(seg_of == seg)
        f = log.files.find(int(seg) * size)
        if f is None:
            continue  # removed by retention: key_ok stays False, segment -1
        buf = np.frombuffer(f.buffer(), dtype=np.uint8)
        pos = offsets[sel] - f.start
        out["segment"][sel] = len(out["buffers"])
        out["buffers"].append(buf)
        out["born"][sel] = _be(buf, pos + FIELD_OFFSET["born_timestamp"], 8, ">i8")
        out["store_ts"][sel] = _be(buf, pos + FIELD_OFFSET["store_timestamp"], 8, ">i8")
        body_len = _be(buf, pos + FIELD_OFFSET["body_length"], 4, ">i4")
        out["body_len"][sel] = body_len
        out["body_start"][sel] = pos + HEADER_SIZE
        tpos = pos + HEADER_SIZE + body_len
        ppos = tpos + 1 + buf[tpos].astype(np.int64)
        plen = _be(buf, ppos, 2, ">i2")
        props = ppos + 2
        fits = plen >= len(_TX_PREFIX) + _KEY_WIDTH + 1
        limit = len(buf) - (len(_TX_PREFIX) + _KEY_WIDTH + 1)
        props_safe = np.where(fits & (props <= limit), props, 0)
        head = buf[props_safe[:, None] + np.arange(len(_TX_PREFIX))[None, :]]
        ok = fits & (props <= limit) & (head == _TX_PREFIX_ARR).all(axis=1)
        end = buf[props_safe + len(_TX_PREFIX) + _KEY_WIDTH]
        ok &= end == _PAIR_END
        key_bytes = buf[(props_safe + len(_TX_PREFIX))[:, None] + np.arange(_KEY_WIDTH)[None, :]]
        # ids of another alphabet go the slow way (_as_key refuses them too)
        ok &= ((key_bytes >= 48) & (key_bytes <= 57) | (key_bytes >= 65) & (key_bytes <= 90)
               | (key_bytes >= 97) & (key_bytes <= 122)).all(axis=1)
        keys = np.ascontiguousarray(key_bytes).view(KEY_DTYPE).ravel()
        out["key"][sel] = np.where(ok, keys, b"")
        out["key_ok"][sel] = ok
    return out
