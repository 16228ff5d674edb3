"""Vectorised restore: copy many system-topic records to their real topics in one append.

A restored record differs from its source only in topic, queue, queue offset, physical
offset, store time and properties (the source's properties with a few pairs appended), so it
is built from the source's bytes instead of being decoded and encoded again:

* the 88-byte headers of all sources are gathered with one NumPy fancy index and edited as a
  structured array; the body (and so its CRC) is reused as is;
* the properties of all sources are gathered into one byte array and the few pairs a restore
  needs (``REAL_TOPIC``, ``REAL_QID``, ``TAGS``, ``TIMER_DELIVER_MS``, ...) are located for
  all records at once from the pair boundaries; topics and tags are grouped with
  ``np.unique``, so each distinct one is decoded and hashed once;
* the records go to the core's columnar append (:meth:`StorePort.append_encoded`), which
  places, writes and indexes them, so the crash protocol is the store's own.

Sources needing more than appended pairs go through a per-record path: rolled timer records
(re-put to the timer topic with ``TIMER_ROLL_TIMES`` + 1, re-encoded so repeated rolls never
pile up duplicate keys), records already holding a pair a restore sets, and every record of a
chunk that may contain a cancelled message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
    split_properties,
)
from ..core.append_types import EncodedRecords
from ..core.ports import StorePort
from ..message import (
    PROPERTY_DELAY_ORIGIN,
    PROPERTY_DELIVER_MS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_DEQUEUE_MS,
    PROPERTY_TIMER_ENQUEUE_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_TIMES,
    PROPERTY_UNIQ_KEY,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    java_string_hash,
)
from ..record_gather import SourceRecords, as_bytes, parse_ints, unique_values

_TX_OK = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
#: Records per append: small enough that the buffers are reused rather than faulted in anew.
RESTORE_CHUNK = 4096


def _k(name: str) -> bytes:
    return name.encode("ascii")


_REAL_TOPIC, _REAL_QID = _k(PROPERTY_REAL_TOPIC), _k(PROPERTY_REAL_QUEUE_ID)
_TAGS = _k(PROPERTY_TAGS)
_DELIVER, _OUT = _k(PROPERTY_TIMER_DELIVER_MS), _k(PROPERTY_TIMER_OUT_MS)
_DEL, _UNIQ = _k(PROPERTY_TIMER_DEL_UNIQKEY), _k(PROPERTY_UNIQ_KEY)
_ROLL = _k(PROPERTY_TIMER_ROLL_TIMES)
_ORIGIN, _DUE = _k(PROPERTY_DELAY_ORIGIN), _k(PROPERTY_DELIVER_MS)
_DEQUEUE, _ENQUEUE = _k(PROPERTY_TIMER_DEQUEUE_MS), _k(PROPERTY_TIMER_ENQUEUE_MS)
#: Pairs a restore appends; a source already holding one takes the per-record path.
_APPENDED = (_DUE, _ORIGIN, _DEQUEUE, _ENQUEUE)
_TIMER_TOPIC_B = _k(TIMER_TOPIC)
_HALF_TOPIC_B = _k(TRANS_HALF_TOPIC)


@dataclass(frozen=True)
class RestoreResult:
    """How many records went to their real topics, and how many were re-put (rolled)."""

    delivered: int
    rolled: int


def restore(store: StorePort, offsets: np.ndarray, *, now: int,
            due_ms: np.ndarray | None = None, enqueue_ms: np.ndarray | None = None,
            roll: np.ndarray | None = None, delete_keys: set[str] | frozenset = frozenset(),
            timer_precision_ms: int = 1000, direct_enqueue_ms: str = "-1",
            chunk: int | None = None) -> RestoreResult:
    """Restore the records at ``offsets`` (in order) to their ``REAL_TOPIC`` / ``REAL_QID``.

    The caller holds the store's write lock.  Records that are missing or invalid, cancel
    markers (unless rolled), cancelled messages and messages aimed at the transaction half
    topic are skipped.

    Parameters
    ----------
    offsets : ndarray of int64
        CommitLog offsets of SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer records.
    now : int
        The run's time (store time of the new records, ``TIMER_DEQUEUE_MS``).
    due_ms : ndarray, optional
        ``__RMQ_DELIVER_MS`` per record (delay levels: the tagsCode).  Without it (the timer),
        the record's ``TIMER_DELIVER_MS`` is used, or ``TIMER_OUT_MS`` + the precision.
    enqueue_ms : ndarray, optional
        Timer only: ``TIMER_ENQUEUE_MS`` per record (a negative value writes
        ``direct_enqueue_ms``); with it, ``TIMER_DEQUEUE_MS`` = ``now`` is added too.
    roll : ndarray of bool, optional
        Timer only: re-put these to the timer topic (``TIMER_ROLL_TIMES`` + 1) instead.
    delete_keys : set of str
        ``"{topic}+{msg_id}"`` of cancelled messages.
    """
    delivered = rolled = 0
    offsets = np.asarray(offsets, dtype=np.int64)
    if not len(offsets):
        return RestoreResult(0, 0)
    chunk = chunk or RESTORE_CHUNK
    for i in range(0, len(offsets), chunk):
        sl = slice(i, i + chunk)
        d, r = _restore_chunk(
            store, offsets[sl], now=now,
            due_ms=None if due_ms is None else np.asarray(due_ms[sl], dtype=np.int64),
            enqueue_ms=None if enqueue_ms is None else np.asarray(enqueue_ms[sl], dtype=np.int64),
            roll=None if roll is None else np.asarray(roll[sl], dtype=bool),
            delete_keys=delete_keys, precision=timer_precision_ms,
            direct_enqueue_ms=direct_enqueue_ms.encode("ascii"))
        delivered += d
        rolled += r
    return RestoreResult(delivered, rolled)


# ---------------------------------------------------------------------------- one chunk
def _restore_chunk(store: StorePort, offsets: np.ndarray, *, now: int, due_ms, enqueue_ms,
                   roll, delete_keys, precision: int, direct_enqueue_ms: bytes
                   ) -> tuple[int, int]:
    n = len(offsets)
    src = SourceRecords(store.commit_log, offsets)
    h = src.headers
    keep = src.ok & np.isin(h["sys_flag"] & TRANSACTION_TYPE_MASK, _TX_OK)
    roll = np.zeros(n, dtype=bool) if roll is None else roll
    has_topic, t0, t1 = src.find(_REAL_TOPIC)
    keep &= has_topic
    slow = roll.copy()
    if src.blob.find(_DEL + b"\x01") >= 0:  # a cancel marker: never delivered
        keep &= ~src.find(_DEL)[0] | roll
    for key in _APPENDED:
        if src.blob.find(key + b"\x01") >= 0:
            slow |= src.find(key)[0]
    if delete_keys:
        slow[:] = True  # the cancel check needs each record's key
    if due_ms is None:
        has_due, d0, d1 = src.find(_DELIVER)
        slow |= ~has_due
    fast = np.flatnonzero(keep & ~slow)
    slow_idx = np.flatnonzero(keep & slow)

    # per-record columns; fast records get their values vectorised, slow ones one by one
    topic_ids = np.full(n, -1, dtype=np.int64)
    qids = np.zeros(n, dtype=np.int64)
    codes = np.zeros(n, dtype=np.int64)
    topic_index: dict[bytes, int] = {}
    if len(fast):
        names, inverse = unique_values(src, fast, t0, t1)
        ids = np.array([topic_index.setdefault(t, len(topic_index)) for t in names], np.int64)
        topic_ids[fast] = ids[inverse]
        has_qid, q0, q1 = src.find(_REAL_QID)
        q_sel = fast[has_qid[fast]]
        value, ok = parse_ints(src, q_sel, q0, q1)
        qids[q_sel] = np.where(ok, value, 0)
        has_tags, g0, g1 = src.find(_TAGS)
        g_sel = fast[has_tags[fast]]
        if len(g_sel):
            tag_names, tag_inverse = unique_values(src, g_sel, g0, g1)
            tag_codes = np.array([java_string_hash(t.decode("utf-8", "replace"))
                                  for t in tag_names], dtype=np.int64)
            codes[g_sel] = tag_codes[tag_inverse]

    props_col: list = src.raw_props
    extra_col: list = [b""] * n
    slow_keep = np.zeros(n, dtype=bool)
    n_roll = 0
    for i in slow_idx.tolist():
        out = _restore_one(src.raw_props[i], int(offsets[i]), bool(roll[i]), now, delete_keys,
                           None if due_ms is None else int(due_ms[i]),
                           None if enqueue_ms is None else int(enqueue_ms[i]),
                           precision, direct_enqueue_ms)
        if out is None:
            continue
        topic, qid, props, new_props = out
        topic_ids[i] = topic_index.setdefault(topic, len(topic_index))
        qids[i] = qid
        codes[i] = store.tags_code(topic.decode("ascii"), _as_text(props), now)
        if props_col is src.raw_props:
            props_col = list(props_col)
        props_col[i] = new_props
        slow_keep[i] = True
        n_roll += int(roll[i])
    topics = list(topic_index)
    if not topics:
        return 0, 0
    keep_fast = np.zeros(n, dtype=bool)
    keep_fast[fast] = True
    half = np.array([t == _HALF_TOPIC_B for t in topics])
    keep_fast &= ~half[np.maximum(topic_ids, 0)]
    selected = np.flatnonzero(keep_fast | slow_keep)
    if not len(selected):
        return 0, 0

    # the pairs a fast record gets appended, one bytes piece per record
    fsel = np.flatnonzero(keep_fast)
    if len(fsel):
        if due_ms is not None:
            due_pieces = as_bytes(due_ms[fsel])
        else:
            due_pieces = list(map(src.blob.__getitem__,
                                  map(slice, d0[fsel].tolist(), d1[fsel].tolist())))
        parts = [[b"__RMQ_DELIVER_MS\x01"] * len(fsel), due_pieces,
                 [b"\x02__RMQ_DELAY_ORIGIN\x01"] * len(fsel), as_bytes(offsets[fsel])]
        if enqueue_ms is not None:
            enq = enqueue_ms[fsel]
            enq_pieces = as_bytes(enq)
            if (enq < 0).any():
                enq_pieces = [direct_enqueue_ms if e < 0 else p
                              for e, p in zip(enq.tolist(), enq_pieces)]
            parts += [[b"\x02TIMER_DEQUEUE_MS\x01" + str(now).encode("ascii")
                       + b"\x02TIMER_ENQUEUE_MS\x01"] * len(fsel), enq_pieces]
        parts.append([b"\x02"] * len(fsel))
        extras = list(map(b"".join, zip(*parts)))
        if len(fsel) == n:
            extra_col = extras
        else:
            for i, e in zip(fsel.tolist(), extras):
                extra_col[i] = e
    if len(selected) == n:
        props_sel, extra_sel, bodies = props_col, extra_col, src.bodies
    else:
        pick = selected.tolist()
        props_sel = list(map(props_col.__getitem__, pick))
        extra_sel = list(map(extra_col.__getitem__, pick))
        bodies = list(map(src.bodies.__getitem__, pick))
    props_len = (np.fromiter(map(len, props_sel), np.int64, len(selected))
                 + np.fromiter(map(len, extra_sel), np.int64, len(selected)))
    _append_restored(store, h[selected], bodies, props_sel, extra_sel, props_len, topics,
                     topic_ids[selected], qids[selected], codes[selected], now)
    return len(selected) - n_roll, n_roll


def _restore_one(raw_props: bytes, origin: int, is_roll: bool, now: int, delete_keys,
                 due: int | None, enqueue: int | None, precision: int,
                 direct_enqueue_ms: bytes):
    """The per-record path: ``(topic, queue, properties dict, properties)`` or ``None`` to skip.

    The tagsCode is left to the caller, which asks the core's rule for the target topic.
    """
    props = split_properties(bytes(raw_props))
    topic = props.get(_REAL_TOPIC)
    if not topic or (topic == _HALF_TOPIC_B and not is_roll):
        return None
    is_marker = _DEL in props
    if is_marker and not is_roll:
        return None  # a cancel marker never surfaces
    if delete_keys and not is_marker and \
            f"{topic.decode()}+{props.get(_UNIQ, b'').decode()}" in delete_keys:
        return None  # cancelled
    props[_ORIGIN] = str(origin).encode("ascii")
    if enqueue is not None:
        props[_DEQUEUE] = str(now).encode("ascii")
        props[_ENQUEUE] = direct_enqueue_ms if enqueue < 0 else str(enqueue).encode("ascii")
    if is_roll:
        props[_ROLL] = str(int(props.get(_ROLL, b"0")) + 1).encode("ascii")
        return _TIMER_TOPIC_B, 0, props, _encode(props)
    if due is not None:
        props[_DUE] = str(due).encode("ascii")
    else:
        props[_DUE] = props.get(_DELIVER) or str(int(props[_OUT]) + precision).encode("ascii")
    try:
        qid = int(props.get(_REAL_QID, b"0"))
    except ValueError:
        qid = 0
    return topic, qid, props, _encode(props)


def _as_text(props: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in props.items()}


def _encode(props: dict[bytes, bytes]) -> bytes:
    return b"".join(k + b"\x01" + v + b"\x02" for k, v in props.items())


# ---------------------------------------------------------------------------- appending
def _append_restored(store: StorePort, headers: np.ndarray, bodies: list, props: list,
                     extras: list, props_len: np.ndarray, topics: list[bytes],
                     topic_ids: np.ndarray, qids: np.ndarray, codes: np.ndarray, now: int) -> None:
    """Place, encode, write and index restored records through the core's columnar append."""
    store.append_encoded(EncodedRecords(
        headers=headers, bodies=bodies, properties=props, extra_properties=extras,
        properties_length=props_len, topics=[t.decode("ascii") for t in topics],
        topic_ids=topic_ids, queue_ids=qids, tags_codes=codes, store_timestamp_ms=now))
