"""Vectorised restore: copy many system-topic records to their real topics in one append.

A restored record differs from its source only in topic, queue, queue offset, physical
offset, store time and properties (the source's properties with a few pairs set), so it is
built from the source's bytes instead of being decoded and encoded again, with no Python
per record:

* the 88-byte headers of all sources are gathered with one NumPy fancy index; bodies and
  properties are copied out of the segments into byte columns (:class:`SourceRecords`); the
  body and its CRC are kept as they are;
* one compiled pass over the properties (:func:`~store.kernels.property_scan.scan_properties`)
  locates ``REAL_TOPIC``, ``REAL_QID``, ``TAGS``, ``TIMER_DELIVER_MS``, ... of every record;
  topics and tags are grouped by hash, so each distinct one is decoded and hashed once;
  queue ids and times are parsed by a compiled loop;
* the pairs a restore sets (``__RMQ_DELIVER_MS``, ``__RMQ_DELAY_ORIGIN``, the timer's
  ``TIMER_DEQUEUE_MS`` / ``TIMER_ENQUEUE_MS``, and ``TIMER_ROLL_TIMES`` + 1 for a rolled
  record re-put to the timer topic) are formatted for all records at once and appended; a
  source already holding one of them has the old pair stripped first, so repeated rolls
  never pile up duplicate keys;
* cancelled messages are found by hashing their ids against the cancel keys; only the
  candidates are compared as text;
* the records go to the core's columnar append (:meth:`StorePort.append_encoded`), which
  places, writes and indexes them, so the crash protocol is the store's own.
"""

from __future__ import annotations

import logging
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from ..files.crash_points import crash_point
from ..formats.record_codec import (TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE,
                                    TRANSACTION_TYPE_MASK)
from ..core.append_types import AssembledRecords, EncodedRecords
from ..core.pipeline import prepared_in_order
from ..core.ports import StorePort
from ..formats.message import (
    PROPERTY_DELAY_KEY,
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
    is_valid_topic_name,
)
from ..kernels.property_scan import (
    distinct_values,
    format_int_pairs,
    hash_ranges,
    parse_int_ranges,
    scan_properties,
    strip_pairs,
    take_rows,
)
from ..core.topic_copies import closing_separators, tags_codes
from ..files.record_gather import SourceRecords
from ..formats.byte_columns import ByteColumn

log = logging.getLogger("store")

_TX_OK = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
#: Records per append: small enough that the buffers are reused rather than faulted in anew.
RESTORE_CHUNK = 4096

#: The pairs a restore sets, in the order they are appended.
_SET = (PROPERTY_DELIVER_MS, PROPERTY_DELAY_ORIGIN, PROPERTY_TIMER_DEQUEUE_MS,
        PROPERTY_TIMER_ENQUEUE_MS, PROPERTY_TIMER_ROLL_TIMES)
_S_DUE, _S_ORIGIN, _S_DEQUEUE, _S_ENQUEUE, _S_ROLL = range(len(_SET))
#: The pairs located in every source: what the restore reads, then the ones it sets.
_KEYS = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TAGS, PROPERTY_TIMER_DELIVER_MS,
         PROPERTY_TIMER_OUT_MS, PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_UNIQ_KEY) + _SET \
    + (PROPERTY_DELAY_KEY,)
_K_TOPIC, _K_QID, _K_TAGS, _K_DELIVER, _K_OUT, _K_DEL, _K_UNIQ = range(7)
_K_SET = slice(7, 7 + len(_SET))
_K_ROLL = 7 + _S_ROLL
_K_DKEY = 7 + len(_SET)


@dataclass(frozen=True)
class RestoreResult:
    """How many records went to their real topics, and how many were re-put (rolled)."""

    delivered: int
    rolled: int


def restore(store: StorePort, offsets: np.ndarray, *, now: int,
            due_ms: np.ndarray | None = None, enqueue_ms: np.ndarray | None = None,
            roll: np.ndarray | None = None, delete_keys: set[str] | frozenset = frozenset(),
            timer_precision_ms: int = 1000, direct_enqueue_ms: int = -1,
            chunk: int | None = None, keys=None) -> RestoreResult:
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
    keys : DelayKeys, optional
        Timer only: the store's delay keys (:class:`store.timer.delay_keys.DelayKeys`, synced by
        the caller); a keyed message its key no longer names is skipped.
    """
    delivered = rolled = 0
    offsets = np.asarray(offsets, dtype=np.int64)
    if not len(offsets):
        return RestoreResult(0, 0)
    chunk = chunk or RESTORE_CHUNK
    # chunks never span two CommitLog segments, so the sources are read in place
    segment = offsets // store.config.commitlog_file_size_bytes
    bounds = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    for lo, hi in zip(np.concatenate(([0], bounds)).tolist(),
                      np.concatenate((bounds, [len(offsets)])).tolist()):
        d, r = _restore_run(store, offsets, lo, hi, chunk, now, due_ms, enqueue_ms, roll,
                            delete_keys, timer_precision_ms, direct_enqueue_ms, keys)
        delivered += d
        rolled += r
    return RestoreResult(delivered, rolled)


def _restore_run(store, offsets, lo, hi, chunk, now, due_ms, enqueue_ms, roll, delete_keys,
                 timer_precision_ms, direct_enqueue_ms, keys=None) -> tuple[int, int]:
    """Restore ``offsets[lo:hi]`` (one segment's) in chunks.

    Chunks are prepared (sources read, new records built and encoded: compiled kernels and
    NumPy, which release the GIL) on two threads by :func:`~store.core.pipeline.
    prepared_in_order`, while this thread, which holds the write lock, appends them in the
    order of the offsets.  Preparing only reads the CommitLog.
    """
    starts = list(range(lo, hi, chunk))

    def prepare(k: int) -> tuple[AssembledRecords | None, int, int]:
        sl = slice(starts[k], min(hi, starts[k] + chunk))
        records, d, r = _prepare_chunk(
            store, offsets[sl], now=now,
            due_ms=None if due_ms is None else np.asarray(due_ms[sl], dtype=np.int64),
            enqueue_ms=None if enqueue_ms is None else np.asarray(enqueue_ms[sl], dtype=np.int64),
            roll=None if roll is None else np.asarray(roll[sl], dtype=bool),
            delete_keys=delete_keys, precision=timer_precision_ms,
            direct_enqueue_ms=int(direct_enqueue_ms), keys=keys)
        return (None if records is None else store.assemble_encoded(records)), d, r

    delivered = rolled = 0
    with closing(prepared_in_order(len(starts), prepare, threads=store.encode_threads)) as chunks:
        for records, d, r in chunks:
            if records is not None:
                point = "timer.roll" if r and not d else "delivery.append"
                crash_point(point, "before")
                _append_restored(store, records)
                crash_point(point, "after")
            delivered, rolled = delivered + d, rolled + r
    return delivered, rolled


# ---------------------------------------------------------------------------- one chunk
def _prepare_chunk(store: StorePort, offsets: np.ndarray, *, now: int, due_ms, enqueue_ms,
                   roll, delete_keys, precision: int, direct_enqueue_ms: int, keys=None
                   ) -> tuple[EncodedRecords | None, int, int]:
    """The restored records of one chunk (``None``: nothing to append), and how many of
    them are delivered and re-put (rolled).  Reads the CommitLog only."""
    n = len(offsets)
    src = SourceRecords(store.commit_log, offsets)
    props = src.properties
    found, v0, v1 = scan_properties(props, _KEYS)
    data = props.data
    roll = np.zeros(n, dtype=bool) if roll is None else roll
    marker = found[_K_DEL]
    tx_type = src.headers["sys_flag"] & TRANSACTION_TYPE_MASK
    keep = (src.ok & ((tx_type == _TX_OK[0]) | (tx_type == _TX_OK[1]))
            & found[_K_TOPIC] & (~marker | roll))
    deliver = keep & ~roll

    # real topics: each distinct one decoded once; rolled records go back to the timer topic
    topic_ids = np.full(n, -1, dtype=np.int64)
    names, inverse = distinct_values(data, v0[_K_TOPIC, deliver], v1[_K_TOPIC, deliver])
    topics = [t.decode("utf-8", "replace") for t in names]
    topic_ids[deliver] = inverse
    if roll.any():
        topic_ids[roll] = len(topics)
        topics.append(TIMER_TOPIC)
    if TRANS_HALF_TOPIC in topics[:len(names)]:
        keep &= topic_ids != topics.index(TRANS_HALF_TOPIC)
    damaged = [i for i, t in enumerate(topics[:len(names)]) if not is_valid_topic_name(t)]
    if damaged:  # a REAL_TOPIC no topic can have: a damaged record, never delivered
        bad = deliver & np.isin(topic_ids, damaged)
        log.warning("delayed records at CommitLog offsets %s name no valid topic (damaged); "
                    "skipped", offsets[bad][:10].tolist())
        keep &= ~bad
    if delete_keys:
        keep &= ~_cancelled(data, v0, v1, found, marker, topic_ids, topics, delete_keys)
    if keys is not None:  # keyed messages their key no longer names: replaced or cancelled
        keyed = np.flatnonzero(keep & found[_K_DKEY])
        if len(keyed):
            keep[keyed[keys.superseded(data, v0[_K_DKEY, keyed], v1[_K_DKEY, keyed],
                                       v0[_K_UNIQ, keyed], v1[_K_UNIQ, keyed])]] = False
    selected = np.flatnonzero(keep)
    if not len(selected):
        return None, 0, 0
    roll_sel = roll[selected]
    n_roll = int(roll_sel.sum())

    # queues and tagsCodes
    qids, qid_ok = parse_int_ranges(data, v0[_K_QID], v1[_K_QID])
    qids = np.where(found[_K_QID] & qid_ok & ~roll, qids, 0)
    out_ms, out_ok = parse_int_ranges(data, v0[_K_OUT], v1[_K_OUT])
    codes = tags_codes(store, props, keep, found[_K_TAGS], v0[_K_TAGS], v1[_K_TAGS],
                       topic_ids, topics, now)

    # the pairs a restore sets: old ones stripped, new ones appended
    values = np.zeros((len(_SET), n), dtype=np.int64)
    present = np.zeros((len(_SET), n), dtype=bool)
    if due_ms is not None:
        values[_S_DUE] = due_ms
    else:
        deliver_ms, deliver_ok = parse_int_ranges(data, v0[_K_DELIVER], v1[_K_DELIVER])
        deliver_ok &= found[_K_DELIVER]
        values[_S_DUE] = np.where(deliver_ok, deliver_ms,
                                  np.where(out_ok & found[_K_OUT], out_ms + precision, now))
    present[_S_DUE] = ~roll
    values[_S_ORIGIN] = offsets
    present[_S_ORIGIN] = True
    if enqueue_ms is not None:
        values[_S_DEQUEUE] = now
        values[_S_ENQUEUE] = np.where(enqueue_ms < 0, direct_enqueue_ms, enqueue_ms)
        present[_S_DEQUEUE] = present[_S_ENQUEUE] = True
    if n_roll:
        times, times_ok = parse_int_ranges(data, v0[_K_ROLL], v1[_K_ROLL])
        values[_S_ROLL] = np.where(times_ok & found[_K_ROLL], times, 0) + 1
        present[_S_ROLL] = roll
    # every row kept (the common case): the columns are used as they are, not copied
    rows = slice(None) if len(selected) == n else selected
    drop = found[_K_SET] & present  # a pair set again replaces the old one
    if drop[:, rows].any():
        props = strip_pairs(props, _SET, drop)
    bodies = src.bodies
    if len(selected) != n:
        props, bodies = take_rows(props, selected), take_rows(bodies, selected)
    extras = format_int_pairs(_SET, values[:, rows], present[:, rows],
                              closing_separators(props))
    props_len = props.lengths() + extras.lengths()
    records = EncodedRecords(
        headers=src.headers[rows], bodies=bodies, properties=props,
        extra_properties=extras, properties_length=props_len, topics=topics,
        topic_ids=topic_ids[rows], queue_ids=qids[rows], tags_codes=codes[rows],
        store_timestamp_ms=now, body_crc_known=True)
    return records, len(selected) - n_roll, n_roll


def _cancelled(data, v0, v1, found, marker, topic_ids, topics, delete_keys) -> np.ndarray:
    """Rows holding a message named in ``delete_keys`` (``"{topic}+{msg_id}"``).

    The ids are matched by hash first; only the few candidate rows are compared as text.
    """
    n = len(marker)
    out = np.zeros(n, dtype=bool)
    ids = [k.split("+", 1)[1].encode("utf-8") for k in delete_keys if "+" in k]
    rows = np.flatnonzero(found[_K_UNIQ] & ~marker & (topic_ids >= 0))
    if not ids or not len(rows):
        return out
    key_col = ByteColumn.of(ids)
    wanted = hash_ranges(key_col.data, key_col.offsets[:-1], key_col.offsets[1:])
    hashes = hash_ranges(data, v0[_K_UNIQ, rows], v1[_K_UNIQ, rows])
    for i in rows[np.isin(hashes, wanted)].tolist():
        msg_id = data[v0[_K_UNIQ, i]:v1[_K_UNIQ, i]].tobytes().decode("utf-8", "replace")
        topic = topics[topic_ids[i]]
        if topic == TIMER_TOPIC:  # a rolled record: its real topic
            topic = data[v0[_K_TOPIC, i]:v1[_K_TOPIC, i]].tobytes().decode("utf-8", "replace")
        out[i] = f"{topic}+{msg_id}" in delete_keys
    return out


def _append_restored(store: StorePort, records: AssembledRecords) -> None:
    """Place, write and index restored records through the core's columnar append."""
    store.append_assembled(records)
