"""Sending a whole table of messages at once: the columnar write path.

:meth:`Producer.send_table <store.produce.producer.Producer.send_table>` takes a ``pyarrow.Table``,
``pyarrow.RecordBatch`` or ``pandas.DataFrame`` whose columns are, by name:

=============  ====================================  ==========================================
column         type                                  meaning
=============  ====================================  ==========================================
topic          string                                the destination (or ``topic=`` for all)
body           binary or string (``value`` too)      the payload (required)
tags           string                                one tag, nullable
keys           string or list<string>                business keys, nullable
properties     map<string, string>                   user properties, nullable
delay_ms       integer                               deliver after this many ms (timer wheel)
deliver_at     timestamp or integer (epoch ms)       deliver at this time (timer wheel)
delay_level    integer                               a 4.x delay level
=============  ====================================  ==========================================

At most one of the three delay columns may be set in a row (null: not delayed).  Any other
column is refused with an error naming it.  Every row is validated as a single send would
validate it (the same typed errors) before anything is written: a bad row means nothing of the
table is stored.

The rows are encoded as columns and appended with the core's columnar append
(:meth:`StoreCore.append_encoded <store.core.store_core.StoreCore.append_encoded>`) in chunks
of :data:`CHUNK_ROWS`: headers as one NumPy array, the properties strings built in one
compiled pass, the CommitLog bytes written with one ``pwrite`` per segment and chunk, the
ConsumeQueue entries in one block per queue.  As in a RocketMQ batch, the rows of one topic in
one chunk go to one queue (the next of the topic's round robin) and keep their order; delayed
rows are routed to their real queue now, as single sends are.  The bytes on disk are exactly what
:meth:`~store.produce.producer.Producer.send` writes for the same message.

The result is a ``pyarrow.Table`` with one row per input row: ``msg_id``, ``topic`` (the
user's), ``queue_id`` (the queue it surfaces in), ``queue_offset`` (null for a delayed row:
its offset is known once delivered), ``commitlog_offset`` (of the stored record) and
``deliver_at_ms`` (null unless delayed).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import pyarrow as pa

from ..formats.batch_encoding import paused_gc
from ..formats.record_codec import (
    LOCALHOST,
    MESSAGE_MAGIC_CODE_V1,
    PROPERTIES_SEPARATOR,
    PROPERTY_SEPARATOR,
)
from ..core.append_types import AssembledRecords, EncodedRecords, Presume
from ..core.pipeline import prepared_in_order
from ..core.ports import StorePort
from ..core.write_placement import Allocate, batch_template
from ..delayed.delivery import DELIVERY_HEADROOM
from ..base.errors import MessageTooLargeError
from ..formats.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
)
from ..kernels.property_scan import format_int_pairs
from ..formats.byte_columns import ByteColumn, ByteSlices
from .table_keys import keyed_table
from .table_rows import COLUMNS, PreparedRows, as_table, prepare_rows

#: Rows per chunk at most: the rows of one topic in one chunk go to one queue (a RocketMQ
#: batch), and each chunk is one append.
CHUNK_ROWS = 8192
#: Body bytes per chunk at most (RocketMQ's limit for a batch): rows of large bodies make
#: chunks of fewer rows, so that a chunk's records stay a few MB whatever the rows hold.
CHUNK_BODY_BYTES = 4 * 1024 * 1024
RESULT_SCHEMA = pa.schema([
    ("msg_id", pa.string()), ("topic", pa.string()), ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()), ("commitlog_offset", pa.int64()),
    ("deliver_at_ms", pa.int64()),
])


def send_table(store: StorePort, data, *, topic: str | None = None) -> pa.Table:
    """Validate and append a table of messages; see the module docstring."""
    with paused_gc():
        rows = prepare_rows(store, data, topic=topic)
        return append_prepared(store, rows)


def append_prepared(store: StorePort, rows: PreparedRows, *, sys_flag: int = 0,
                    prepared_offsets: np.ndarray | None = None,
                    chunk_rows: int = CHUNK_ROWS) -> pa.Table:
    """Append prepared rows, each chunk of :data:`CHUNK_ROWS` in the next queue of its
    topics; return the results table.

    ``sys_flag`` and ``prepared_offsets`` (PREPAREDTRANSACTIONOFFSET per row) are for the
    records a transaction commit writes; ``born_ms`` of the rows may then be an array (one
    born time per row).  Each chunk is one append; inside
    :meth:`~store.core.store_core.StoreCore.atomic_append` they all land together.  Their
    records are encoded on two threads (:func:`~store.core.pipeline.prepared_in_order`)
    while this one appends them in order.
    """
    n = len(rows)
    if n == 0:
        return RESULT_SCHEMA.empty_table()
    bounds = _chunk_bounds(rows, chunk_rows)
    # the queues first, in order: each chunk takes the next of its topics' round robins
    queues = _table_queues(store, rows, bounds)
    chain = (_placement_chain(store, rows, queues, bounds)
             if len(bounds) > 1 and prepared_offsets is None else None)

    def prepare(k: int):
        lo, hi = bounds[k]
        try:
            return _encode_chunk(store, rows.slice(lo, hi), queues[lo:hi], sys_flag,
                                 None if prepared_offsets is None else prepared_offsets[lo:hi],
                                 presume=None if chain is None else partial(chain.presume, k))
        finally:
            if chain is not None:
                chain.release(k)  # (a chunk that failed: the chunks after it are not presumed)

    queue_offsets = np.empty(n, dtype=np.int64)
    commitlog_offsets = np.empty(n, dtype=np.int64)
    deliver_ms = np.empty(n, dtype=np.int64)
    lo = 0
    with closing(prepared_in_order(len(bounds), prepare, threads=store.encode_threads)) as encoded:
        for records, deliver in encoded:
            placed = store.append_assembled(records)
            hi = lo + len(deliver)
            queue_offsets[lo:hi] = placed.queue_offsets
            commitlog_offsets[lo:hi] = placed.commitlog_offsets
            deliver_ms[lo:hi] = deliver
            lo = hi
    # one results table for every chunk (built once: per chunk it cost a tenth of the append)
    delayed = deliver_ms >= 0
    return pa.table({
        "msg_id": (rows.id_values if rows.id_values is not None  # ids of their own
                   else rows.msg_ids.to_arrow(pa.string(), copy=False)),
        "topic": rows.topic_array(),
        "queue_id": pa.array(queues, pa.int32()),
        "queue_offset": pa.array(queue_offsets, pa.int64(), mask=delayed),
        "commitlog_offset": pa.array(commitlog_offsets, pa.int64()),
        "deliver_at_ms": pa.array(deliver_ms, pa.int64(), mask=~delayed),
    }, schema=RESULT_SCHEMA)


@dataclass(frozen=True, slots=True)
class TableChunk:
    """Chunk ``index`` of :func:`append_table_chunks`, rows ``lo:hi``, as the caller's ``make``
    sees it (on either of two threads): ``rows``, the chunk's prepared rows (``None`` when
    only placement columns were given); each row goes to ``queue_ids[i]`` (the queue its
    topic takes for the chunk, or the one it kept; ``None`` when chosen only as the chunk is
    appended)."""

    store: StorePort
    rows: PreparedRows | None
    index: int
    lo: int
    hi: int
    queue_ids: np.ndarray | None
    #: with ``presume="headers"``: what :meth:`encode` presumes the chunk's placement by
    presume: Presume | None = None

    def encode(self, *, sys_flag: int = 0, magic: int = MESSAGE_MAGIC_CODE_V1,
               allocate: Allocate | None = None, codes_as_prepared: bool = False
               ) -> AssembledRecords:
        """The chunk's records as :func:`append_prepared` would write them (delayed rows
        routed to their real queues), assembled but not placed.  ``magic``: their MAGICCODE
        (the sink stages them with a zero one); ``allocate``: where they are assembled (see
        :meth:`~store.core.store_core.StoreCore.assemble_encoded`); ``codes_as_prepared``:
        each record's tagsCode written in its PREPAREDTRANSACTIONOFFSET (a staged record,
        :mod:`store.core.index_commit`), set in the headers before they are assembled."""
        return _encode_chunk(self.store, self.rows, self.queue_ids, sys_flag, None, allocate,
                             magic, self.presume, codes_as_prepared)[0]


def append_table_chunks(store: StorePort, rows, make: Callable[[TableChunk], tuple], *,
                        topic: str | None = None, bounds: Callable | None = None,
                        create_topics: bool = True, presume: bool | str = False,
                        placements: bool = False) -> list:
    """Encode and append rows in chunks, one append each; return what ``make`` said of each
    chunk (with ``placements``: ``(what make said, the chunk's EncodedAppend)``).  The door
    of the exactly-once sink (:mod:`store.sink`) to the producer.

    ``rows``: a table as for :func:`send_table` (validated here: with a ``key`` column, as
    ``replace_table`` takes it), prepared rows, or only their placement columns (a named
    tuple of ``topic_names``, ``topic_ids`` and ``queue_ids``, one per row, -1: the round
    robin).
    ``bounds(rows)``: the rows ``(lo, hi)`` of each chunk (default: :data:`CHUNK_ROWS` rows).
    ``make(chunk)`` returns ``(records, result)`` for each :class:`TableChunk` on either of two
    threads (:func:`~store.core.pipeline.prepared_in_order`), and this one appends the
    records in order.  Each chunk's rows take the next queue of their topic's round robin (as
    a RocketMQ batch) or the queue they kept: chosen for every chunk first, in order, when
    ``create_topics`` is false (missing topics are then only counted) or when ``presume``
    places chunks of one topic that keep no queue by a
    :class:`~store.core.placement_chain.PlacementChain` as soon as they are made (``make``
    then assembles records of one queue, stored at their ``store_timestamp_ms``; with
    ``presume="headers"``, ``make`` encodes them by :meth:`TableChunk.encode`, which writes
    the presumed fields into their headers before they are assembled); else as
    each chunk is appended (its records' ``queue_ids`` are then set there), creating missing
    topics.
    """
    with paused_gc():
        if not isinstance(rows, (PreparedRows, tuple)):  # a table, not yet validated
            rows = _validated(store, rows, topic)
        n = len(rows.topic_ids)
        if n == 0:
            return []
        cuts = (bounds(rows) if bounds is not None
                else [(lo, min(n, lo + CHUNK_ROWS)) for lo in range(0, n, CHUNK_ROWS)])
        names, kept = rows.topic_names, rows.queue_ids

        def queues(lo: int, hi: int) -> np.ndarray:
            return queues_for_chunk(store, names, rows.topic_ids[lo:hi],
                                    None if kept is None else kept[lo:hi], create=create_topics)

        one_queue = len(names) == 1 and (kept is None or bool((kept < 0).all()))
        chain = first = None
        if presume and one_queue and len(cuts) > 1:
            first = [queues(lo, hi) for lo, hi in cuts]
            # (topics that may be missing, not created: their queues' ends are not asked)
            chain = store.placement_chain(len(cuts), sorted({(names[0], int(q[0]))
                                                             for q in first})
                                          if create_topics else [])
        elif not create_topics:
            first = [queues(lo, hi) for lo, hi in cuts]

        prepared = isinstance(rows, PreparedRows)
        in_headers = chain is not None and presume == "headers"

        def prepare(k: int):  # reads the rows, writes only its own buffer
            lo, hi = cuts[k]
            try:
                records, result = make(TableChunk(
                    store, rows.slice(lo, hi) if prepared else None, k, lo, hi,
                    None if first is None else first[k],
                    partial(chain.presume, k) if in_headers else None))
                if chain is not None and not in_headers:  # written while the records are cached
                    records = replace(records, presumed=chain.presume_assembled(
                        k, records.data, records.starts, records.sizes,
                        (names[0], int(first[k][0])), records.store_timestamp_ms))
                return records, result
            finally:
                if chain is not None:
                    chain.release(k)  # (a chunk that failed: the chunks after it are not presumed)

        results = []
        with closing(prepared_in_order(len(cuts), prepare, threads=store.encode_threads)) as made:
            for k, (records, result) in enumerate(made):
                if first is None:  # chosen as the chunk is appended (its topic created then)
                    records = replace(records, queue_ids=queues(*cuts[k]))
                placed = store.append_assembled(records)
                results.append((result, placed) if placements else result)
        return results


def _validated(store: StorePort, data, topic: str | None) -> PreparedRows:
    """``data`` validated as :func:`send_table` does, or as ``replace_table`` does when it has
    a ``key`` column (each row then replaces its key's pending message)."""
    table = as_table(data)
    if "key" in table.column_names:
        table = keyed_table(table, store.now_ms())
        store.timer.keys.ensure()
    return prepare_rows(store, table, topic=topic)


def _chunk_bounds(rows: PreparedRows, chunk_rows: int) -> list[tuple[int, int]]:
    """The rows ``[lo, hi)`` of each chunk: ``chunk_rows`` rows, fewer where their bodies
    pass :data:`CHUNK_BODY_BYTES` (always one row at least)."""
    n = len(rows)
    bounds = [(lo, min(n, lo + chunk_rows)) for lo in range(0, n, chunk_rows)]
    bodies = rows.bodies
    before = getattr(bodies, "offsets", None)  # body bytes before each row (and the total)
    if before is None:
        before = np.concatenate(([0], np.cumsum(bodies.lengths())))
    lo_at = np.array([lo for lo, _ in bounds])
    if (before[lo_at + np.diff([*lo_at, n])] - before[lo_at] <= CHUNK_BODY_BYTES).all():
        return bounds
    bounds, lo = [], 0
    while lo < n:  # chunks of large bodies: as many rows as fit (one at least)
        fit = int(np.searchsorted(before, int(before[lo]) + CHUNK_BODY_BYTES,
                                  side="right")) - 1
        hi = min(n, lo + chunk_rows, max(fit, lo + 1))
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _one_topic_round_robin(rows: PreparedRows) -> bool:
    """Whether every row is of one topic and none asked for a queue (each chunk then
    writes one queue of the topic, the next of its round robin)."""
    return len(rows.topic_names) == 1 and rows.queue_ids is None


def _table_queues(store: StorePort, rows: PreparedRows, bounds: list) -> np.ndarray:
    """Each row's queue when each chunk ``bounds[k]`` is one append (:func:`chunk_queues`
    per chunk; rows of one topic, none ordered: one queue per chunk, repeated)."""
    names = rows.topic_names
    if not _one_topic_round_robin(rows):
        return np.concatenate([chunk_queues(store, rows.slice(lo, hi)) for lo, hi in bounds])
    per_chunk = round_robin_queues(store, names[0], len(bounds))
    return np.repeat(np.array(per_chunk, dtype=np.int64), [hi - lo for lo, hi in bounds])


def round_robin_queues(store: StorePort, topic: str, chunks: int) -> list[int]:
    """The queues of ``chunks`` consecutive chunks of ``topic`` (creating it if missing):
    each the next of the topic's round robin, as each chunk's append would take it."""
    count = store.ensure_topic(topic)
    return [store.next_queue(topic, count) for _ in range(chunks)]


def _placement_chain(store: StorePort, rows: PreparedRows, queues: np.ndarray, bounds: list):
    """The chunks' :class:`~store.core.placement_chain.PlacementChain` (each chunk's encoding
    writes the fields the append would write, when it lands as presumed), for a table of
    one topic without ordered rows (a chunk then writes one queue, or one delay queue when
    all its rows are delayed alike); ``None`` for other tables."""
    names = rows.topic_names
    if not _one_topic_round_robin(rows):
        return None
    keys = {(names[0], q) for q in queues[[lo for lo, _ in bounds]].tolist()}
    if (rows.deliver_ms >= 0).any():
        keys.add((TIMER_TOPIC, 0))
    if rows.levels.any():
        keys.update((SCHEDULE_TOPIC, level - 1) for level in np.unique(rows.levels).tolist()
                    if level > 0)
    return store.placement_chain(len(bounds), sorted(keys))


def chunk_queues(store: StorePort, rows: PreparedRows, *, create: bool = True) -> np.ndarray:
    """Each row's queue: the one its topic takes for this chunk (the next of the topic's
    round robin, as a RocketMQ batch), or the queue an ordered row asked for.  Missing
    topics are created, unless ``create`` is false (then they are only counted)."""
    return queues_for_chunk(store, rows.topic_names, rows.topic_ids, rows.queue_ids,
                            create=create)


def queues_for_chunk(store: StorePort, names, topic_ids: np.ndarray,
                     queue_ids: np.ndarray | None, *, create: bool = True) -> np.ndarray:
    """:func:`chunk_queues` over plain columns: row ``i`` of topic ``names[topic_ids[i]]``
    keeps ``queue_ids[i]`` when it is >= 0, else takes its topic's queue for the chunk."""
    count = store.ensure_topic if create else store.queue_count_for
    queue_of = np.zeros(len(names), dtype=np.int64)
    present = [0] if len(names) == 1 and len(topic_ids) else np.unique(topic_ids).tolist()
    for t in present:
        queue_of[t] = store.next_queue(names[t], count(names[t]))
    real_qid = queue_of[topic_ids]
    if queue_ids is not None:  # ordered rows: the queue each asked for
        real_qid = np.where(queue_ids >= 0, queue_ids, real_qid)
    return real_qid


def _encode_chunk(store: StorePort, rows: PreparedRows, real_qid: np.ndarray, sys_flag: int,
                  prepared: np.ndarray | None, allocate: Allocate | None = None,
                  magic: int = MESSAGE_MAGIC_CODE_V1, presume: Presume | None = None,
                  codes_as_prepared: bool = False):
    """The assembled records of one chunk, and each row's due time (-1: not delayed).
    Reads only the rows and the config (runs on either thread); ``presume``: see
    :meth:`~store.core.store_core.StoreCore.assemble_encoded`; ``codes_as_prepared``: see
    :meth:`TableChunk.encode`."""
    config = store.config
    now = rows.born_ms
    names = rows.topic_names
    levels, deliver = rows.levels, rows.deliver_ms
    n = len(rows)
    user_topic_ids = rows.topic_ids
    by_level, by_timer = levels > 0, deliver >= 0
    delayed = by_level | by_timer
    # the rows' own columns, copied only where delayed rows change them
    codes = np.asarray(rows.tags_codes, dtype=np.int64)
    target_topics = list(names)
    target_ids, queue_ids = user_topic_ids, real_qid
    suffix = None
    props_len = rows.properties.lengths()
    if delayed.any():
        codes, target_ids, queue_ids = codes.copy(), target_ids.copy(), queue_ids.copy()
        suffix = _with_routing(n, names, user_topic_ids, real_qid, levels, deliver, by_level,
                               by_timer, config.timer_precision_ms)
        props_len = props_len + suffix.lengths()
        if by_level.any():
            target_topics.append(SCHEDULE_TOPIC)
            target_ids[by_level] = len(target_topics) - 1
            queue_ids[by_level] = levels[by_level] - 1
            level_ms = np.array(config.delay_levels_ms, dtype=np.int64)
            born = now[by_level] if isinstance(now, np.ndarray) else now
            codes[by_level] = born + level_ms[levels[by_level] - 1]
        if by_timer.any():
            target_topics.append(TIMER_TOPIC)
            target_ids[by_timer] = len(target_topics) - 1
            queue_ids[by_timer] = 0
    headroom = config.max_properties_size_bytes - DELIVERY_HEADROOM
    too_long = delayed & (props_len > headroom)
    if too_long.any():
        raise MessageTooLargeError(
            f"properties of a delayed message are {int(props_len[np.argmax(too_long)])} bytes; "
            f"allowed: at most {headroom} (max_properties_size_bytes minus {DELIVERY_HEADROOM} "
            "for delivery bookkeeping)")
    # from the batch template: half the time of zeros and six fields set one by one
    headers = np.repeat(batch_template(sys_flag, LOCALHOST, 0), n)
    if magic != MESSAGE_MAGIC_CODE_V1:
        headers["magic"] = magic
    headers["born_timestamp"] = now
    headers["body_length"] = rows.bodies.lengths()  # BODYCRC: filled by the record kernel
    if prepared is not None:
        headers["prepared_transaction_offset"] = prepared
    elif codes_as_prepared:
        headers["prepared_transaction_offset"] = codes
    records = store.assemble_encoded(EncodedRecords(
        headers=headers, bodies=rows.bodies, properties=rows.properties_column(),
        properties_length=props_len, topics=target_topics, topic_ids=target_ids,
        queue_ids=queue_ids, tags_codes=codes, extra_properties=suffix,
        store_timestamp_ms=None if prepared is not None else now), allocate=allocate,
        presume=presume)
    if not by_level.any():
        return records, deliver
    level_due = now + np.array((0, *config.delay_levels_ms), dtype=np.int64)[levels]
    return records, np.where(by_level, level_due, deliver)


def _with_routing(n: int, names: list, topic_ids: np.ndarray, real_qid: np.ndarray,
                  levels: np.ndarray, deliver: np.ndarray, by_level: np.ndarray,
                  by_timer: np.ndarray, precision_ms: int) -> ByteColumn:
    """The routing properties of delayed rows, as the services' ``rewrite`` adds them (a
    suffix column: empty for rows that are not delayed).

    Level rows get ``REAL_TOPIC``, ``REAL_QID`` and ``DELAY``; timer rows ``REAL_TOPIC``,
    ``REAL_QID``, ``TIMER_OUT_MS`` (the rounded fire time, see
    :func:`store.timer.timer_service.round_fire_time`) and ``TIMER_DELIVER_MS``.  (Level
    rows' tagsCode is their due time; timer rows keep the tag hash, as in RocketMQ 5.)
    """
    out = np.where(deliver % precision_ms == 0, deliver - precision_ms,
                   deliver - deliver % precision_ms)
    # REAL_TOPIC from a pair per distinct topic, then the int pairs, one compiled pass
    routes = ByteColumn.of([f"{PROPERTY_REAL_TOPIC}{PROPERTY_SEPARATOR}{name}{PROPERTIES_SEPARATOR}".encode("utf-8")
                            for name in names])
    delayed = by_level | by_timer
    starts = np.where(delayed, routes.starts[topic_ids], 0)
    ends = np.where(delayed, routes.ends[topic_ids], 0)
    values = np.stack([real_qid, levels, out, deliver]).astype(np.int64)
    present = np.stack([delayed, by_level, by_timer, by_timer])
    return format_int_pairs(_ROUTING_PAIRS, values, present,
                            ByteSlices(routes.data, starts, ends))


#: The int pairs of a delayed row's routing, in the order the services' ``rewrite`` adds them.
_ROUTING_PAIRS = (PROPERTY_REAL_QUEUE_ID, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_OUT_MS,
                  PROPERTY_TIMER_DELIVER_MS)


__all__ = ["CHUNK_ROWS", "COLUMNS", "RESULT_SCHEMA", "PreparedRows", "TableChunk",
           "append_prepared", "append_table_chunks", "as_table", "chunk_queues", "prepare_rows",
           "queues_for_chunk", "round_robin_queues", "send_table"]
