"""The bookkeeping of a check round as columns: decide for many half messages at once, then
append their put-back copies and discards in one columnar append.

:func:`walk_chunk` takes a run of open half offsets (all in one CommitLog segment) and:

1. gathers the half records in place (:class:`~store.files.record_gather.SourceRecords`) and
   locates, in one compiled pass over their properties, ``TRANSACTION_CHECK_TIMES``,
   ``TRAN_PREPARED_QUEUE_OFFSET``, ``CHECK_IMMUNITY_TIME_IN_SECONDS``, ``TAGS``, the sink
   mark and the routing pairs the views need;
2. decides every record with NumPy, by the rules of :mod:`store.transaction.check_loop` (the
   first record that stops the walk, or that the ``max_checks`` budget does not reach, cuts
   the chunk there);
3. appends the copies before the cut: discards to ``TRANS_CHECK_MAX_TIME_TOPIC`` unchanged,
   immunity put-backs with ``TRAN_PREPARED_QUEUE_OFFSET`` (the first half offset) added when
   missing, check put-backs with ``TRANSACTION_CHECK_TIMES`` set to the new count (an old
   pair stripped).  Headers are the sources' with the prepared offset cleared; bodies and
   their CRCs are copied as they are.

No Python runs per record; the views of the transactions to ask about are built later, and
only when someone looks at them (:mod:`store.transaction.check_views`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..files.crash_points import crash_point
from ..core.append_types import EncodedRecords
from ..core.ports import StorePort
from ..formats.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
)
from ..kernels.property_scan import (
    distinct_values,
    format_int_pairs,
    parse_int_ranges,
    scan_properties,
    strip_pairs,
    take_rows,
)
from ..core.topic_copies import closing_separators, tags_codes
from ..files.record_gather import SourceRecords
from ..formats.message import PROPERTY_SINK, SINK_TX_PREFIX

#: What each half offset of the walk comes to.
SKIP, DISCARD, STOP, IMMUNE, CHECK = range(5)

_KEYS = (PROPERTY_TRANSACTION_CHECK_TIMES, PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
         PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_TAGS, PROPERTY_SINK,
         PROPERTY_TRANSACTION_ID, PROPERTY_UNIQ_KEY, PROPERTY_REAL_TOPIC,
         PROPERTY_REAL_QUEUE_ID, PROPERTY_PRODUCER_GROUP)
(_K_TIMES, _K_FIRST, _K_IMMUNITY, _K_TAGS, _K_SINK, _K_TX, _K_UNIQ, _K_TOPIC, _K_QID,
 _K_GROUP) = range(len(_KEYS))
#: The pairs a put-back sets (old values stripped first).
_SET = (PROPERTY_TRANSACTION_CHECK_TIMES, PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
_SINK_PREFIX = np.frombuffer(SINK_TX_PREFIX.encode("ascii"), dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class Rules:
    """The round's time and settings (see :func:`~store.transaction.check_loop.run_bookkeeping`)."""

    started_ms: int
    timeout_ms: int
    check_max: int
    interval_ms: int
    reserved_ms: int


@dataclass(frozen=True, slots=True)
class ChunkChecks:
    """The check put-backs one chunk appended, as columns (one row per transaction to ask
    about): where each copy landed, its check count, its real topic / queue and producer
    group (``topics[topic_ids]`` / ``groups[group_ids]``), and whether it is a sink half."""

    commitlog_offsets: np.ndarray
    queue_offsets: np.ndarray
    store_timestamp_ms: int
    check_times: np.ndarray
    topics: list[str]
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    groups: list[str]
    group_ids: np.ndarray
    sink: np.ndarray
    transaction_ids: pa.Array


@dataclass(frozen=True, slots=True)
class ChunkResult:
    """What :func:`walk_chunk` did: ``cut`` rows decided (``cut < len`` means the walk
    stops at that row), counts, and the checks."""

    cut: int
    discarded: int
    immune: int
    checks: ChunkChecks | None


def decide(src: SourceRecords, found, v0, v1, rules: Rules) -> tuple[np.ndarray, np.ndarray]:
    """``(kind, check count)`` of every record (kinds: :data:`SKIP` ... :data:`CHECK`)."""
    data = src.properties.data
    h = src.headers
    born = h["born_timestamp"].astype(np.int64)
    stored = h["store_timestamp"].astype(np.int64)
    times, times_ok = parse_int_ranges(data, v0[_K_TIMES], v1[_K_TIMES])
    times = np.where(found[_K_TIMES] & times_ok, times, 0)
    custom = found[_K_IMMUNITY]
    seconds, seconds_ok = parse_int_ranges(data, v0[_K_IMMUNITY], v1[_K_IMMUNITY])
    immunity = np.where(custom & seconds_ok & (seconds != -1), seconds * 1000, rules.timeout_ms)
    age = rules.started_ms - born
    made_by_loop = found[_K_TIMES] | found[_K_FIRST]

    ok = src.ok
    discard = ok & ((times >= rules.check_max) | (age > rules.reserved_ms))
    live = ok & ~discard
    stop = live & ((stored >= rules.started_ms)
                   | (made_by_loop & (rules.started_ms - stored < rules.interval_ms))
                   | (~custom & (age >= 0) & (age <= rules.timeout_ms)))
    immune = live & ~stop & custom & (age <= immunity)
    kind = np.full(len(ok), CHECK, dtype=np.int8)
    kind[~ok] = SKIP
    kind[discard] = DISCARD
    kind[stop] = STOP
    kind[immune] = IMMUNE
    return kind, times + 1


def walk_chunk(store: StorePort, qoffs: np.ndarray, clogs: np.ndarray, rules: Rules,
               check_budget: int | None) -> ChunkResult:
    """Decide the half offsets ``qoffs`` (records at ``clogs``, one segment) and append their
    copies; ``check_budget``: how many more checks the round may make (``None``: no limit)."""
    src = SourceRecords(store.commit_log, clogs)
    found, v0, v1 = scan_properties(src.properties, _KEYS)
    kind, counts = decide(src, found, v0, v1, rules)
    is_check = kind == CHECK
    halt = kind == STOP
    if check_budget is not None:
        before = np.cumsum(is_check) - is_check
        halt |= before >= check_budget
    stops = np.flatnonzero(halt)
    cut = int(stops[0]) if len(stops) else len(kind)
    kind = kind[:cut]
    rows = np.flatnonzero((kind == DISCARD) | (kind == IMMUNE) | (kind == CHECK))
    discarded = int((kind == DISCARD).sum())
    immune = int((kind == IMMUNE).sum())
    if not len(rows):
        return ChunkResult(cut, discarded, immune, None)

    k = kind[rows]
    values = np.zeros((len(_SET), len(rows)), dtype=np.int64)
    present = np.zeros((len(_SET), len(rows)), dtype=bool)
    values[0] = counts[rows]
    present[0] = k == CHECK
    values[1] = qoffs[rows]
    present[1] = (k == IMMUNE) & ~found[_K_FIRST, rows]  # keeps an existing first offset
    props = take_rows(src.properties, rows)
    drop = np.zeros_like(present)
    drop[0] = present[0] & found[_K_TIMES, rows]
    if drop.any():
        props = strip_pairs(props, _SET, drop)
    extras = format_int_pairs(_SET, values, present, closing_separators(props))
    headers = src.headers[rows]
    headers["prepared_transaction_offset"] = 0
    topics = [TRANS_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC]
    topic_ids = (k == DISCARD).astype(np.int64)
    # tagsCodes: positions of TAGS are into the sources' bytes, so computed on all rows
    wanted = np.zeros(len(kind), dtype=bool)
    wanted[rows] = True
    all_topic_ids = np.zeros(len(kind), dtype=np.int64)
    all_topic_ids[rows] = topic_ids
    codes = tags_codes(store, src.properties, wanted, found[_K_TAGS, :cut], v0[_K_TAGS, :cut],
                       v1[_K_TAGS, :cut], all_topic_ids, topics, rules.started_ms)[rows]
    crash_point("transaction.put_back", "before")
    done = store.append_encoded(EncodedRecords(
        headers=headers, bodies=take_rows(src.bodies, rows), properties=props,
        extra_properties=extras, properties_length=props.lengths() + extras.lengths(),
        topics=topics, topic_ids=topic_ids, queue_ids=np.zeros(len(rows), np.int64),
        tags_codes=codes, body_crc_known=True))
    crash_point("transaction.put_back", "after")
    asked = k == CHECK
    checks = None
    if asked.any():
        checks = _checks(src, found, v0, v1, rows[asked], counts, done.commitlog_offsets[asked],
                         done.queue_offsets[asked], done.store_timestamp_ms)
    return ChunkResult(cut, discarded, immune, checks)


def _checks(src: SourceRecords, found, v0, v1, rows: np.ndarray, counts: np.ndarray,
            clogs: np.ndarray, qoffs: np.ndarray, store_ms: int) -> ChunkChecks:
    """The columns of the check put-backs of ``rows``."""
    data = src.properties.data
    topics, topic_ids = _texts(data, found[_K_TOPIC, rows], v0[_K_TOPIC, rows],
                               v1[_K_TOPIC, rows])
    groups, group_ids = _texts(data, found[_K_GROUP, rows], v0[_K_GROUP, rows],
                               v1[_K_GROUP, rows])
    qids, qid_ok = parse_int_ranges(data, v0[_K_QID, rows], v1[_K_QID, rows])
    qids = np.where(found[_K_QID, rows] & qid_ok, qids, 0)
    # a sink half: the mark, and a transaction id of 32 characters starting with "SINK"
    has_tx = found[_K_TX, rows]
    t0 = np.where(has_tx, v0[_K_TX, rows], v0[_K_UNIQ, rows])
    t1 = np.where(has_tx, v1[_K_TX, rows], v1[_K_UNIQ, rows])
    sink = found[_K_SINK, rows] & (has_tx | found[_K_UNIQ, rows]) & (t1 - t0 == 32)
    if sink.any():
        head = data[np.where(sink, t0, 0)[:, None] + np.arange(len(_SINK_PREFIX))[None, :]]
        sink &= (head == _SINK_PREFIX).all(axis=1)
    return ChunkChecks(clogs, qoffs, int(store_ms), counts[rows], topics, topic_ids, qids,
                       groups, group_ids, sink, _strings(data, t0, t1))


def _strings(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> pa.Array:
    """The ranges ``data[start[i]:end[i]]`` as one Arrow string array (one gather)."""
    lengths = end - start
    offsets = np.zeros(len(start) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    within = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    values = data[np.repeat(start, lengths) + within]
    array = pa.LargeStringArray.from_buffers(len(start), pa.py_buffer(offsets),
                                            pa.py_buffer(values.tobytes()))
    return array.cast(pa.string())


def _texts(data: np.ndarray, found: np.ndarray, start: np.ndarray, end: np.ndarray
           ) -> tuple[list[str], np.ndarray]:
    """The distinct values (decoded; ``""`` for a missing one) and each row's index into
    them."""
    names, inverse = distinct_values(data, np.where(found, start, 0), np.where(found, end, 0))
    texts = [b.decode("utf-8", "replace") for b in names]
    return texts, np.asarray(inverse, dtype=np.int64)
