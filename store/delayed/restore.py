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
* the pairs a restore sets (``__RMQ_DELIVER_MS``, ``__RMQ_DELAY_ORIGIN``, then those of the
  service's :class:`Delivery`: the timer's stamps, a rolled record's roll count) are
  formatted for all records at once and appended; a source already holding one of them has
  the old pair stripped first, so repeated rolls never pile up duplicate keys;
* cancelled messages are found by hashing their ids against the cancel keys; only the
  candidates are compared as text;
* the records go to the core's columnar append (:meth:`StorePort.append_encoded`), which
  places, writes and indexes them, so the crash protocol is the store's own.
"""

from __future__ import annotations

import logging
from contextlib import closing
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from ..files.crash_points import crash_point
from ..formats.record_codec import (STAGED_QUEUE_OFFSET, TRANSACTION_COMMIT_TYPE,
                                    TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE,
                                    TRANSACTION_TYPE_MASK)
from ..core.append_types import AssembledRecords, EncodedRecords
from ..core.pipeline import prepared_in_order
from ..core.ports import StorePort
from ..formats.message import (
    PROPERTY_DELAY_ORIGIN,
    PROPERTY_DELIVER_MS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_UNIQ_KEY,
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

#: The pairs every restore sets, in the order they are appended (the service's follow).
_SET = (PROPERTY_DELIVER_MS, PROPERTY_DELAY_ORIGIN)
_S_DUE, _S_ORIGIN = range(len(_SET))
#: The pairs located in every source: what the restore reads, then the ones it sets (the
#: service's own follow: :attr:`Delivery.reads`, then :attr:`Delivery.sets`).
_KEYS = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TAGS, PROPERTY_TIMER_DEL_UNIQKEY,
         PROPERTY_UNIQ_KEY)
_K_TOPIC, _K_QID, _K_TAGS, _K_DEL, _K_UNIQ = range(len(_KEYS))


class RecordPairs(NamedTuple):
    """Where the pairs located in a chunk's sources are: ``data[start[k, i]:end[k, i]]`` is
    the value of ``keys[k]`` in record ``i`` where ``found[k, i]``."""

    data: np.ndarray
    keys: tuple[str, ...]
    found: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def ranges(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(found, start, end)`` of ``key`` in each record."""
        k = self.keys.index(key)
        return self.found[k], self.start[k], self.end[k]

    def ints(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(value, ok)`` of ``key`` in each record as a decimal int (``ok``: found and
        well-formed)."""
        k = self.keys.index(key)
        value, ok = parse_int_ranges(self.data, self.start[k], self.end[k])
        return value, ok & self.found[k]


class Delivery(Protocol):
    """What a service hands to :func:`restore` about the records it delivers (the delay
    levels' and the timer's own types): :func:`restore` reads these and nothing else of the
    service."""

    #: pairs the service reads of each record (located with the restore's own)
    reads: tuple[str, ...]
    #: pairs the service sets, after ``__RMQ_DELIVER_MS`` and ``__RMQ_DELAY_ORIGIN``, each
    #: replacing a pair of the same name
    sets: tuple[str, ...]
    #: the system topic re-put records go back to (``None``: none is re-put)
    requeue_topic: str | None

    def part(self, rows: slice) -> Delivery:
        """The delivery of records ``rows`` of the run."""

    def requeued(self, n: int) -> np.ndarray:
        """Which of the ``n`` records are re-put to :attr:`requeue_topic` instead of
        delivered (a cancel marker re-put stays one)."""

    def due_ms(self, pairs: RecordPairs, now: int) -> np.ndarray:
        """``__RMQ_DELIVER_MS`` of each record."""

    def set_values(self, pairs: RecordPairs, now: int, requeued: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """``(values, present)``, each ``(len(sets), n)``: the pairs :attr:`sets` of each
        record."""

    def superseded(self, pairs: RecordPairs, keep: np.ndarray) -> np.ndarray | None:
        """Which of the records ``keep`` marks are no longer to be delivered (a keyed
        message replaced since): a mask over all records, or ``None`` for none."""


@dataclass(frozen=True)
class RestoreResult:
    """How many records went to their real topics, and how many were re-put (rolled)."""

    delivered: int
    rolled: int


def restore(store: StorePort, offsets: np.ndarray, delivery: Delivery, *, now: int,
            delete_keys: set[str] | frozenset = frozenset(),
            chunk: int | None = None) -> RestoreResult:
    """Restore the records at ``offsets`` (in order) to their ``REAL_TOPIC`` / ``REAL_QID``.

    The caller holds the store's write lock.  Records that are missing or invalid, cancel
    markers (unless re-put), cancelled messages and messages aimed at the transaction half
    topic are skipped.

    Parameters
    ----------
    offsets : ndarray of int64
        CommitLog offsets of SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer records.
    delivery : Delivery
        What the service (the delay levels, the timer) says of these records: their due
        times, the pairs it sets, which are re-put to its topic, which are superseded.
    now : int
        The run's time (store time of the new records).
    delete_keys : set of str
        ``"{topic}+{msg_id}"`` of cancelled messages.
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
        d, r = _restore_run(store, offsets, lo, hi, chunk, now, delivery, delete_keys)
        delivered += d
        rolled += r
    return RestoreResult(delivered, rolled)


def _restore_run(store, offsets, lo, hi, chunk, now, delivery: Delivery,
                 delete_keys) -> tuple[int, int]:
    """Restore ``offsets[lo:hi]`` (one segment's) in chunks.

    Chunks are prepared (sources read, new records built and encoded: compiled kernels and
    NumPy, which release the GIL) on two threads by :func:`~store.core.pipeline.
    prepared_in_order`, while this thread, which holds the write lock, appends them in the
    order of the offsets.  Preparing only reads the CommitLog.
    """
    starts = list(range(lo, hi, chunk))

    def prepare(k: int) -> tuple[AssembledRecords | None, int, int]:
        sl = slice(starts[k], min(hi, starts[k] + chunk))
        records, d, r = _prepare_chunk(store, offsets[sl], delivery.part(sl), now=now,
                                       delete_keys=delete_keys)
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
def _prepare_chunk(store: StorePort, offsets: np.ndarray, delivery: Delivery, *, now: int,
                   delete_keys) -> tuple[EncodedRecords | None, int, int]:
    """The restored records of one chunk (``None``: nothing to append), and how many of
    them are delivered and re-put (rolled).  Reads the CommitLog only."""
    n = len(offsets)
    src = SourceRecords(store.commit_log, offsets)
    props = src.properties
    sets = _SET + delivery.sets
    keys = _KEYS + delivery.reads + sets
    pairs = RecordPairs(props.data, keys, *scan_properties(props, keys))
    roll = delivery.requeued(n)
    keep, topic_ids, topics = _targets(src, offsets, pairs, roll, delivery, delete_keys)
    selected = np.flatnonzero(keep)
    if not len(selected):
        return None, 0, 0
    n_roll = int(roll[selected].sum())
    found, v0, v1 = pairs.found, pairs.start, pairs.end

    # queues and tagsCodes
    qids, qid_ok = parse_int_ranges(props.data, v0[_K_QID], v1[_K_QID])
    qids = np.where(found[_K_QID] & qid_ok & ~roll, qids, 0)
    codes = tags_codes(store, props, keep, found[_K_TAGS], v0[_K_TAGS], v1[_K_TAGS],
                       topic_ids, topics, now)

    # the pairs a restore sets: old ones stripped, new ones appended
    values = np.zeros((len(sets), n), dtype=np.int64)
    present = np.zeros((len(sets), n), dtype=bool)
    values[_S_DUE] = delivery.due_ms(pairs, now)
    present[_S_DUE] = ~roll
    values[_S_ORIGIN] = offsets
    present[_S_ORIGIN] = True
    values[len(_SET):], present[len(_SET):] = delivery.set_values(pairs, now, roll)
    # every row kept (the common case): the columns are used as they are, not copied
    rows = slice(None) if len(selected) == n else selected
    drop = found[len(keys) - len(sets):] & present  # a pair set again replaces the old one
    if drop[:, rows].any():
        props = strip_pairs(props, sets, drop)
    bodies = src.bodies
    if len(selected) != n:
        props, bodies = take_rows(props, selected), take_rows(bodies, selected)
    extras = format_int_pairs(sets, values[:, rows], present[:, rows],
                              closing_separators(props))
    props_len = props.lengths() + extras.lengths()
    records = EncodedRecords(
        headers=_committed(src.headers[rows]), bodies=bodies, properties=props,
        extra_properties=extras, properties_length=props_len, topics=topics,
        topic_ids=topic_ids[rows], queue_ids=qids[rows], tags_codes=codes[rows],
        store_timestamp_ms=now, body_crc_known=True)
    return records, len(selected) - n_roll, n_roll


def _staged(headers: np.ndarray) -> np.ndarray:
    """Which records are staged ones an index commit made visible (PREPARED, queue offset
    -1: :mod:`store.core.index_commit`): delivered like COMMIT records."""
    return (((headers["sys_flag"] & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE)
            & (headers["queue_offset"] == STAGED_QUEUE_OFFSET))


def _committed(headers: np.ndarray) -> np.ndarray:
    """The headers the copies of the records get: a staged record's copy is a COMMIT
    record whose PREPAREDTRANSACTIONOFFSET is the staged record's offset (a copy made in
    place of a prepared one, as a transaction's commit record)."""
    staged = _staged(headers)
    if not staged.any():
        return headers
    headers = headers.copy()
    flags = headers["sys_flag"][staged]
    headers["sys_flag"][staged] = (flags & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE
    headers["prepared_transaction_offset"][staged] = headers["physical_offset"][staged]
    return headers


def _targets(src: SourceRecords, offsets: np.ndarray, pairs: RecordPairs, roll: np.ndarray,
             delivery: Delivery, delete_keys) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(keep, topic_ids, topics)``: which records of the chunk are written, and each one's
    topic (its real topic, each distinct one decoded once; re-put records: the service's)."""
    n = len(offsets)
    found, v0, v1, data = pairs.found, pairs.start, pairs.end, pairs.data
    marker = found[_K_DEL]
    tx_type = src.headers["sys_flag"] & TRANSACTION_TYPE_MASK
    keep = (src.ok & ((tx_type == _TX_OK[0]) | (tx_type == _TX_OK[1]) | _staged(src.headers))
            & found[_K_TOPIC] & (~marker | roll))
    deliver = keep & ~roll
    topic_ids = np.full(n, -1, dtype=np.int64)
    names, inverse = distinct_values(data, v0[_K_TOPIC, deliver], v1[_K_TOPIC, deliver])
    topics = [t.decode("utf-8", "replace") for t in names]
    topic_ids[deliver] = inverse
    if roll.any():
        topic_ids[roll] = len(topics)
        topics.append(delivery.requeue_topic)
    if TRANS_HALF_TOPIC in topics[:len(names)]:
        keep &= topic_ids != topics.index(TRANS_HALF_TOPIC)
    damaged = [i for i, t in enumerate(topics[:len(names)]) if not is_valid_topic_name(t)]
    if damaged:  # a REAL_TOPIC no topic can have: a damaged record, never delivered
        bad = deliver & np.isin(topic_ids, damaged)
        log.warning("delayed records at CommitLog offsets %s name no valid topic (damaged); "
                    "skipped", offsets[bad][:10].tolist())
        keep &= ~bad
    if delete_keys:
        keep &= ~_cancelled(data, v0, v1, found, marker, topic_ids, delete_keys)
    superseded = delivery.superseded(pairs, keep)
    if superseded is not None:  # keyed messages their key no longer names
        keep &= ~superseded
    return keep, topic_ids, topics


def _cancelled(data, v0, v1, found, marker, topic_ids, delete_keys) -> np.ndarray:
    """Rows holding a message named in ``delete_keys`` (``"{topic}+{msg_id}"``, the topic
    its REAL_TOPIC, re-put or not).

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
        topic = data[v0[_K_TOPIC, i]:v1[_K_TOPIC, i]].tobytes().decode("utf-8", "replace")
        out[i] = f"{topic}+{msg_id}" in delete_keys
    return out


def _append_restored(store: StorePort, records: AssembledRecords) -> None:
    """Place, write and index restored records through the core's columnar append."""
    store.append_assembled(records)
