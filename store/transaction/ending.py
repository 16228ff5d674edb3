"""Ending many transactions at once, as columns: commit records built from the halves' bytes.

:func:`end_rows` gets the transactions to end (rows of the
:class:`~store.transaction.transaction_index.TransactionIndex`, each open and named once) and whether
each commits.  For every run of newest halves in one CommitLog segment it gathers the records
in place, locates ``REAL_TOPIC``, ``REAL_QID``, ``TAGS``, the sink mark and
``CHECK_IMMUNITY_TIME_IN_SECONDS`` in one compiled pass, and checks every item before
anything is written.  Then, in one atomic group (:meth:`StorePort.atomic_append`: kept or
dropped whole after a crash), it appends

* the commit records: the half's header, body (with its CRC) and properties as stored, in the
  real topic and queue, SYSFLAG transaction type COMMIT, PREPAREDTRANSACTIONOFFSET the
  half's CommitLog offset (see :mod:`store.transaction.half`);
* the op messages naming the newest half offset of every transaction ended.
"""

from __future__ import annotations

import numpy as np

from ..files.crash_points import crash_point
from ..formats.record_codec import TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK
from ..core.append_types import EncodedRecords
from ..core.ports import StorePort
from ..base.errors import (
    CorruptRecordError,
    InvalidMessageError,
    TransactionStateError,
    UnknownMessageError,
)
from ..formats.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    is_valid_topic_name,
)
from ..kernels.property_scan import distinct_values, parse_int_ranges, scan_properties, take_rows
from ..core.topic_copies import tags_codes
from ..files.record_gather import SourceRecords
from ..formats.message import PROPERTY_SINK
from .half import HALF_QUEUE_ID
from .transaction_index import TransactionIndex
from .op import op_specs

_KEYS = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TAGS, PROPERTY_SINK,
         PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
_K_TOPIC, _K_QID, _K_TAGS, _K_SINK, _K_IMMUNITY = range(len(_KEYS))


def end_rows(store: StorePort, index: TransactionIndex, txs: list[str], states: list[str],
             commit: np.ndarray, rows: np.ndarray, *, now: int, timeout_ms: int,
             from_check: bool) -> None:
    """End the transactions of index ``rows`` (``txs`` / ``states``: their ids and state
    names, for messages); ``commit[i]``: commit (else roll back).  The caller holds the
    write lock; see the module docstring.

    Raises
    ------
    UnknownMessageError, TransactionStateError, InvalidMessageError
        As :meth:`~store.transaction.transaction_service.TransactionService.end_transactions` documents;
        nothing is written then.
    """
    if not len(rows):
        return
    latest = index.latest_half_offsets(rows)
    clogs = index.latest_clogs(rows)
    segment = clogs // store.config.commitlog_file_size_bytes
    bounds = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    runs = zip(np.concatenate(([0], bounds)).tolist(),
               np.concatenate((bounds, [len(rows)])).tolist())
    commits = [_commit_records(store, clogs[lo:hi], commit[lo:hi], txs[lo:hi], states[lo:hi],
                               now=now, timeout_ms=timeout_ms, from_check=from_check)
               for lo, hi in runs]
    with store.atomic_append():  # commits first, then the op(s): kept or dropped whole
        for records in commits:
            if records is not None:
                crash_point("transaction.commit_copy", "before")
                store.append_encoded(records)
                crash_point("transaction.commit_copy", "after")
        crash_point("transaction.op", "before")
        store.append(op_specs(latest.tolist(), now, HALF_QUEUE_ID), batch=True)
        crash_point("transaction.op", "after")
    index.mark_ended(rows)


def _commit_records(store: StorePort, clogs: np.ndarray, commit: np.ndarray, txs, states, *,
                    now: int, timeout_ms: int, from_check: bool) -> EncodedRecords | None:
    """Check the halves at ``clogs`` (one segment); the commit records of those that commit."""
    src = SourceRecords(store.commit_log, clogs)
    found, v0, v1 = scan_properties(src.properties, _KEYS)
    data = src.properties.data
    gone = np.flatnonzero(~src.ok)
    if len(gone):
        i = int(gone[0])
        raise UnknownMessageError(
            f"transaction id {txs[i]!r}: its half message at CommitLog offset {int(clogs[i])} "
            "can no longer be read; it was probably removed by retention")
    sink = np.flatnonzero(commit & found[_K_SINK])
    if len(sink):
        i = int(sink[0])
        raise TransactionStateError(
            f"transaction {txs[i]!r} is a half of the rmq sink "
            f"{_text(data, v0[_K_SINK, i], v1[_K_SINK, i])!r}; allowed: ROLLBACK only (its "
            "rows become visible when the sink commits its batch)")
    if not from_check and found[_K_IMMUNITY].any():
        seconds, ok = parse_int_ranges(data, v0[_K_IMMUNITY], v1[_K_IMMUNITY])
        limit = np.where(found[_K_IMMUNITY] & ok & (seconds != -1),
                         np.maximum(seconds * 1000, timeout_ms), timeout_ms)
        age = now - src.headers["born_timestamp"].astype(np.int64)
        late = np.flatnonzero(found[_K_IMMUNITY] & (age > limit))
        if len(late):
            i = int(late[0])
            custom = _text(data, v0[_K_IMMUNITY, i], v1[_K_IMMUNITY, i])
            raise TransactionStateError(
                f"end_transaction({txs[i]!r}, {states[i]}) comes {int(age[i])} ms after the "
                f"half message was born, past its immunity of {int(limit[i])} ms "
                f"({PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS}={custom}); allowed: answers to "
                "the check loop (from_check=True) once the immunity is over (RocketMQ "
                "refuses such late requests, code 604)")
    sel = np.flatnonzero(commit)
    if not len(sel):
        return None
    qids, qid_ok = parse_int_ranges(data, v0[_K_QID, sel], v1[_K_QID, sel])
    routed = found[_K_TOPIC, sel] & found[_K_QID, sel] & qid_ok
    if not routed.all():
        i = int(sel[np.flatnonzero(~routed)[0]])
        topic = _text(data, v0[_K_TOPIC, i], v1[_K_TOPIC, i]) if found[_K_TOPIC, i] else None
        qid = _text(data, v0[_K_QID, i], v1[_K_QID, i]) if found[_K_QID, i] else None
        raise InvalidMessageError(
            f"half message at CommitLog offset {int(clogs[i])} has REAL_TOPIC={topic!r}, "
            f"REAL_QID={qid!r}; allowed: a topic and an integer queue id")
    names, topic_ids = distinct_values(data, v0[_K_TOPIC, sel], v1[_K_TOPIC, sel])
    topics = [t.decode("utf-8", "replace") for t in names]
    damaged = [i for i, t in enumerate(topics) if not is_valid_topic_name(t)]
    if damaged:  # a damaged half: committing it would write to no valid topic
        i = int(sel[np.flatnonzero(topic_ids == damaged[0])[0]])
        raise CorruptRecordError("commitlog", int(clogs[i]), f"half message: REAL_TOPIC="
                                 f"{topics[damaged[0]]!r} names no valid topic (damaged); "
                                 "allowed: roll it back")
    wanted = np.zeros(len(clogs), dtype=bool)
    wanted[sel] = True
    all_ids = np.zeros(len(clogs), dtype=np.int64)
    all_ids[sel] = topic_ids
    codes = tags_codes(store, src.properties, wanted, found[_K_TAGS], v0[_K_TAGS], v1[_K_TAGS],
                       all_ids, topics, now)[sel]
    headers = src.headers[sel]
    headers["sys_flag"] = (headers["sys_flag"] & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE
    headers["prepared_transaction_offset"] = clogs[sel]
    props = take_rows(src.properties, sel)
    return EncodedRecords(
        headers=headers, bodies=take_rows(src.bodies, sel), properties=props,
        properties_length=props.lengths(), topics=topics, topic_ids=topic_ids,
        queue_ids=qids, tags_codes=codes, store_timestamp_ms=now, body_crc_known=True)


def _text(data: np.ndarray, start, end) -> str:
    return data[int(start):int(end)].tobytes().decode("utf-8", "replace")
