"""Reading the transaction fields of many records at once (vectorised per CommitLog segment).

Half messages carry their transaction id as the first property (``__transactionId__``, 32
characters); :func:`gather_records` reads it, with born and store times, for many records at
once, for the :class:`~store.transaction.transaction_index.TransactionIndex`.
"""

from __future__ import annotations

import numpy as np

from ..core.ports import StorePort
from ..formats.message import PROPERTY_TRANSACTION_ID
from ..files.record_gather import gather_segments

#: Transaction ids written by the store are 32 upper-case hex characters (UNIQ_KEY).
KEY_DTYPE = np.dtype("S32")
_KEY_WIDTH = KEY_DTYPE.itemsize
_TX_PREFIX = (PROPERTY_TRANSACTION_ID + "\x01").encode("ascii")
_TX_PREFIX_ARR = np.frombuffer(_TX_PREFIX, dtype=np.uint8)
_PAIR_END = 0x02


def gather_records(store: StorePort, offsets: np.ndarray, *, want_body: bool = False):
    """Read fields of many records at CommitLog ``offsets`` (through
    :func:`store.files.record_gather.gather_segments`; records failing the layout checks are left
    with ``segment`` -1).

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
    for part in gather_segments(store.commit_log, offsets):
        sel, buf = part.sel, part.raw
        out["segment"][sel] = len(out["buffers"])
        out["buffers"].append(buf)
        out["born"][sel] = part.headers["born_timestamp"]
        out["store_ts"][sel] = part.headers["store_timestamp"]
        out["body_len"][sel] = part.body_length
        out["body_start"][sel] = part.body_start
        props = part.properties_start
        # the transaction id is the first pair: "__transactionId__" 0x01 (32 chars) 0x02
        fits = part.properties_length >= len(_TX_PREFIX) + _KEY_WIDTH + 1
        props_safe = np.where(fits, props, 0)
        head = buf[props_safe[:, None] + np.arange(len(_TX_PREFIX))[None, :]]
        ok = fits & (head == _TX_PREFIX_ARR).all(axis=1)
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
