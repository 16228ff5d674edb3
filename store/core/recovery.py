"""Recovery: make the CommitLog tail and the ConsumeQueues agree after a crash.

When it runs:

* at open, when this process is the only one with the store open and the ``abort`` marker is
  still there (the last process did not close cleanly): scan from ``flushed_phy_offset``;
* whenever a writer takes the append lock and finds ``write_in_progress`` set (a writer died
  mid-append, in this or another process): scan from ``confirm_phy_offset``.

The scan validates every record (magic, recomputed length, body CRC), re-dispatches the valid
ones (idempotent: entry ``n`` of a queue is rewritten with the same bytes), stops at the torn
tail, zeroes the CommitLog from there and cuts every ConsumeQueue entry that points at or past
it.  The tail is the first invalid record after which nothing valid follows: damage before the
checkpoint's confirmed end, or followed by a segment that begins with a valid record, is
skipped (:meth:`~store.files.commit_log.CommitLog.scan_batches`), never cut.  A clean close does
not rescan anything.

The staged records a commit marker in the scan names are indexed with it, at the queue
offsets the marker gives (:func:`~store.core.index_commit.marker_rows`).

Records are re-dispatched through the store's one :class:`~store.core.queue_dispatch.Dispatcher`.
A scan without a limit (after a reboot, or on a clean open) may keep part of an append: the
recovery listeners the services registered are told what was kept (a
:class:`~store.core.ports.RecoveryScan`) before the recovered end is published; the
transaction service notes commit records kept without their op that way.

Where a recovery starts and where it may cut, read from the checkpoint (a clean open's tail
check, a dead writer's append, a crash, an untrusted checkpoint), is
:mod:`store.core.recovery_start`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..formats.record_codec import (
    FIXED_SIZE,
    HEADER_SIZE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
    decode_properties,
)
from ..kernels.recovery_scan import INDEX_COLUMNS, RecordIndex, index_records
from ..formats.message import is_valid_topic_name
from ..kernels.segment_walk import STOP_FULL, first_record_start
from .index_commit import INDEX_COMMIT_TOPIC, marker_rows
from .pipeline import prepared_in_order
from .ports import CoreParts, RecoveryListener, RecoveryScan

logger = logging.getLogger("store")


@dataclass(slots=True)
class ScannedEntries:
    """What :func:`scan_entries` read: queue entries of the indexed records by queue (rows of
    ``(queue offset, CommitLog offset, size, tagsCode)``), every valid record's offset and
    sys flag, the last store time, and where a limit cut the scan."""

    rows: dict[tuple[str, int], np.ndarray]
    offsets: np.ndarray
    sys_flags: np.ndarray
    last_timestamp_ms: int | None
    cut: int | None


def scan_entries(store: CoreParts, start: int, *, limit: int | None = None,
                 resync_until: int | None = None, progress=None) -> ScannedEntries:
    """Validate records from ``start`` (magic, size, CRC) up to the torn tail (or ``limit``;
    damage before ``resync_until`` is skipped) and collect the queue entry of every indexed
    record, as the dispatcher would write it.  Shared by recovery and the queue rebuild
    (:mod:`store.core.queue_rebuild`).

    ``progress(offset)``, when given, is called with the CommitLog offset reached after each
    run of records.

    Vectorised: one compiled walk validates a run of records and reads the columns of their
    queue entries (:func:`~store.kernels.recovery_scan.index_records`: each distinct topic and tag
    decoded once), on two threads (:func:`checked_walk`).  Only
    records of a topic with a registered tagsCode rule are decoded one by one, for the rule.
    """
    log = store.commit_log
    rows: dict[tuple[str, int], list[np.ndarray]] = {}
    offsets: list[np.ndarray] = []
    flags: list[np.ndarray] = []
    last_ts: int | None = None
    cut: int | None = None
    buffers = WalkBuffers()
    runs = ((f, index) for f, parts in log.scan_runs(
                start, lambda raw, pos, end: checked_walk(raw, pos, end, buffers),
                resync_until=resync_until, populate_bytes=WALK_WINDOW)
            for index in parts if len(index))
    for f, index in runs:
        absolute = index.positions + f.start
        if limit is not None and absolute[-1] >= limit:
            keep = absolute < limit
            index, absolute = index.take(keep), absolute[keep]
            cut = limit
        if len(index):
            offsets.append(absolute)
            flags.append(index.sys_flags.copy())  # (the index views reused buffers)
            last_ts = int(index.store_timestamps[-1])
            _collect_rows(store, np.frombuffer(f.buffer(), dtype=np.uint8), index, absolute,
                          rows)
            if progress is not None:
                progress(int(absolute[-1]))
        if cut is not None:
            break
    tables, dropped = _plausible_rows(store, {key: np.concatenate(parts)
                                              for key, parts in rows.items()})
    if dropped:
        logger.warning("%d CommitLog record(s) whose header names an impossible queue or queue "
                       "offset (damaged; their body CRC does not cover it) were not indexed",
                       dropped)
    markers = tables.get((INDEX_COMMIT_TOPIC, 0))
    if markers is not None:  # the staged records each commit marker made visible
        for key, table in marker_rows(store, markers[:, 1]).items():
            if key in tables:
                table = np.concatenate((tables[key], table))
                table = table[np.argsort(table[:, 0], kind="stable")]
            tables[key] = table
    return ScannedEntries(
        tables, np.concatenate(offsets) if offsets else np.empty(0, np.int64),
        np.concatenate(flags) if flags else np.empty(0, np.int64), last_ts, cut)


def index_entries(store: CoreParts, raw: np.ndarray, index: RecordIndex, absolute: np.ndarray
                  ) -> tuple[dict[tuple[str, int], np.ndarray], int]:
    """The queue entries of the indexed records of one run of valid records (``index`` of
    ``raw``, the records at CommitLog offsets ``absolute``), by queue, as :func:`scan_entries`
    collects them, and how many entries were dropped as implausible: the records a
    follower receives from its leader (:mod:`store.core.replica_log`) are dispatched as a
    recovery scan's are."""
    rows: dict[tuple[str, int], list[np.ndarray]] = {}
    _collect_rows(store, raw, index, absolute, rows)
    return _plausible_rows(store, {key: np.concatenate(parts) for key, parts in rows.items()})


#: No topic rmq creates has more queues (StoreConfig.default_queue_count's limit).
MAX_QUEUE_ID = 1024


def _plausible_rows(store: CoreParts, rows: dict[tuple[str, int], np.ndarray]
                    ) -> tuple[dict[tuple[str, int], np.ndarray], int]:
    """Drop queue entries whose record header cannot be right (the body CRC does not cover
    the header, so a flipped queue id or offset passes the record checks).

    * A topic name no topic can have (it would also name a directory outside the store).
    * A negative queue id, or one at or above the topic's queue count and
      :data:`MAX_QUEUE_ID`.
    * A queue offset above ``physical offset // FIXED_SIZE`` (every earlier message of the
      queue precedes the record in the CommitLog, each at least ``FIXED_SIZE`` long).
    * A queue's records follow each other in the CommitLog at offsets n, n+1, ...: an
      offset that breaks the run while its successor continues it, or that is not above
      every offset before it, belongs to a damaged header.

    Returns the kept rows (by queue) and how many were dropped.
    """
    kept, dropped = {}, 0
    valid: dict[str, bool] = {}
    for (topic, queue_id), table in rows.items():
        if topic not in valid:
            valid[topic] = is_valid_topic_name(topic)
        # (the topic table, re-read when it changed, is asked only past MAX_QUEUE_ID: a
        # follower's every chunk comes here, and most queue ids are below it)
        if not valid[topic] or queue_id < 0 or (
                queue_id >= MAX_QUEUE_ID
                and queue_id >= (store.topic_table.queue_count(topic) or 0)):
            dropped += len(table)
            continue
        ok = plausible_queue_offsets(table[:, 0], table[:, 1])
        if ok is None:
            kept[(topic, queue_id)] = table
            continue
        dropped += int(len(ok) - ok.sum())
        if ok.any():
            kept[(topic, queue_id)] = table[ok]
    return kept, dropped


def plausible_queue_offsets(q: np.ndarray, phys: np.ndarray) -> np.ndarray | None:
    """Which of one queue's entries (queue offsets ``q`` of records at CommitLog offsets
    ``phys``, in CommitLog order) pass :func:`_plausible_rows`'s offset checks: None when
    all do, else a mask.

    The usual case, one unbroken run ``n, n+1, ...`` whose first offset is plausible, is
    told by one comparison: every later offset is then plausible too (record ``i`` lies at
    least ``i * FIXED_SIZE`` bytes after the first), nothing breaks the run and nothing goes
    back.
    """
    if not len(q):
        return None
    if 0 <= q[0] <= phys[0] // FIXED_SIZE and q[-1] - q[0] == len(q) - 1 and (
            len(q) < 2 or bool((q[1:] - q[:-1] == 1).all())):
        return None
    ok = (q >= 0) & (q <= phys // FIXED_SIZE)
    if len(q) >= 3:  # a break in the run that its successor does not follow
        ok[1:-1] &= ~((q[1:-1] != q[:-2] + 1) & (q[2:] == q[:-2] + 2))
    good = np.flatnonzero(ok)
    if len(good) > 1:  # never back: above every offset kept before it
        g = q[good]
        ok[good[1:]] &= g[1:] > np.maximum.accumulate(g)[:-1]
    return None if ok.all() else ok


#: Bytes of a segment one :func:`checked_walk` covers, in two halves walked on two threads.
WALK_WINDOW = 64 << 20
#: A shorter range is walked on one thread.
MIN_SPLIT_BYTES = 4 << 20


class WalkBuffers:
    """The column arrays of the two halves, reused by every walk of one scan (fresh memory
    costs a page fault per 4 KiB: 96 bytes per record, 0.1-0.3 s per GiB of small records
    on the machine of docs/benchmarks.md)."""

    def __init__(self) -> None:
        self._arrays: list[np.ndarray | None] = [None, None]

    def get(self, half: int, rows: int) -> np.ndarray:
        a = self._arrays[half]
        if a is None or a.shape[1] < rows:
            a = self._arrays[half] = np.empty((INDEX_COLUMNS, rows), dtype=np.int64)
        return a


def checked_walk(raw: np.ndarray, pos: int, limit: int, buffers: WalkBuffers | None = None
                 ) -> tuple[list[RecordIndex], int, int, int]:
    """A walk for :meth:`~store.files.commit_log.CommitLog.scan_runs`: the records from ``pos``
    validated, body CRCs included, and indexed (:func:`~store.kernels.recovery_scan.index_records`),
    up to :data:`WALK_WINDOW` bytes at a time, on two threads.

    The records before the window's middle are walked on one thread; on the other, the first
    record starting at or after the middle is found (its magic code, then every check) and
    walked from there.  The second half is kept only when the first walk ends exactly at that
    record: then both are the one chain of records the plain walk follows.  Otherwise (the
    record found was one embedded in a body, or the first walk stopped at damage) the first
    walk's result is returned alone and the next call goes on where it stopped.  Returns
    ``(indexes, count, end, stop)``: the index of each half kept, in order.  With
    ``buffers``, the indexes view its arrays: valid until the next walk with them.
    """
    stop_at = min(limit, pos + WALK_WINDOW)
    mid = pos + (stop_at - pos) // 2
    rows = (stop_at - pos) // FIXED_SIZE + 1  # every record at least FIXED_SIZE long
    buffers = buffers or WalkBuffers()
    if stop_at - pos < MIN_SPLIT_BYTES:
        index, end, stop = index_records(raw, pos, limit, stop_at=stop_at, max_records=rows,
                                         out=buffers.get(0, rows))
        return [index], len(index), end, stop

    def half(k: int):
        out = buffers.get(k, rows // 2 + 1)
        if k == 0:
            return index_records(raw, pos, limit, stop_at=mid, max_records=rows // 2 + 1,
                                 out=out)
        start = _record_start(raw, mid, limit, stop_at)
        if start is None:
            return None
        return start, index_records(raw, start, limit, stop_at=stop_at,
                                    max_records=rows // 2 + 1, out=out)

    first, second = prepared_in_order(2, half)
    index, end, stop = first
    if second is None or stop != STOP_FULL or end != second[0]:
        return [index], len(index), end, stop
    rest, end, stop = second[1]
    return [index, rest], len(index) + len(rest), end, stop


def _record_start(raw: np.ndarray, begin: int, limit: int, until: int) -> int | None:
    """The first position in ``[begin, until)`` where a record passing every check starts."""
    return first_record_start(raw, begin, until, limit, lambda p: len(
        index_records(raw, p, limit, stop_at=p + 1, max_records=1)[0]) > 0)


def _collect_rows(store: CoreParts, raw: np.ndarray, index: RecordIndex, absolute: np.ndarray,
                  rows: dict[tuple[str, int], list[np.ndarray]]) -> None:
    """Add the queue entries of the indexed records among one run of valid records.

    Whole columns are used as they are when every record of the run is indexed (the usual
    run: no half or rollback records), and the rows are grouped by queue with a stable
    radix sort of small queue numbers (a few passes over the run, whatever its size).
    """
    tx = index.sys_flags & TRANSACTION_TYPE_MASK
    indexed = (tx == TRANSACTION_NOT_TYPE) | (tx == TRANSACTION_COMMIT_TYPE)
    every = bool(indexed.all())
    sel = slice(None) if every else np.flatnonzero(indexed)  # (a slice: views, no copies)
    n = len(index) if every else len(sel)
    if not n:
        return
    topics = [t.decode("ascii", "replace") for t in index.topics]
    topic_ids = index.topic_ids[sel]
    rule_of_topic = np.array([store.dispatcher.has_rule(t) for t in topics], dtype=bool)
    ruled = rule_of_topic[topic_ids] if rule_of_topic.any() else None
    codes = np.zeros(n, dtype=np.int64)
    if index.tags:
        tag_ids = index.tag_ids[sel]
        hashes = np.append(store.dispatcher.tag_hashes(
            [t.decode("utf-8", "replace") for t in index.tags]), 0)
        # untagged rows (-1) take the 0 appended last; a ruled topic's rows get the rule's
        codes = hashes[tag_ids]
        if ruled is not None:
            codes[ruled] = 0
    unreadable = None
    ruled_rows = np.flatnonzero(ruled) if ruled is not None else ()
    if len(ruled_rows):  # a service's rule reads the properties
        r = ruled_rows if every else sel[ruled_rows]
        tpos = index.positions[r] + HEADER_SIZE + index.body_lengths[r]
        ppos = tpos + 1 + raw[tpos]
        pend = ppos + 2 + ((raw[ppos].astype(np.int64) << 8) | raw[ppos + 1])
        stored = index.store_timestamps[r]
        unreadable = np.zeros(n, dtype=bool)
        for j, i in enumerate(ruled_rows.tolist()):
            text = raw[ppos[j] + 2:pend[j]].tobytes()
            try:
                codes[i] = store.dispatcher.tags_code(topics[topic_ids[i]],
                                                      decode_properties(text), int(stored[j]))
            except (ValueError, KeyError, TypeError):  # damaged properties (the CRC covers
                unreadable[i] = True                   # the body only): never index a due time
        if unreadable.any():
            logger.warning("%d CommitLog record(s) of a system topic have damaged properties "
                           "(e.g. at offset %d): not indexed", int(unreadable.sum()),
                           int(absolute[sel][unreadable][0]))
        else:
            unreadable = None
    queue_ids = index.queue_ids[sel]
    groups, order = _queue_groups(topic_ids, queue_ids, unreadable)
    queue_offsets, offsets, sizes = index.queue_offsets[sel], absolute[sel], index.sizes[sel]
    for topic_id, queue_id, a, b in groups:
        mine = order[a:b]  # rows of the run, in CommitLog order
        table = np.empty((b - a, 4), dtype=np.int64)
        table[:, 0] = queue_offsets[mine]
        table[:, 1] = offsets[mine]
        table[:, 2] = sizes[mine]
        table[:, 3] = codes[mine]
        rows.setdefault((topics[topic_id], queue_id), []).append(table)


def _queue_groups(topic_ids: np.ndarray, queue_ids: np.ndarray, unreadable: np.ndarray | None
                  ) -> tuple[list[tuple[int, int, int, int]], np.ndarray]:
    """Rows grouped by queue: ``(topic id, queue id, start, end)`` per queue and the row
    numbers in group order, each group's rows in their own order at ``order[start:end]``
    (rows ``unreadable`` in no group)."""
    t0, q0 = topic_ids[0], queue_ids[0]
    if unreadable is None and bool((topic_ids == t0).all()) and bool((queue_ids == q0).all()):
        # one queue (a follower's chunk of one single send): no sort
        return [(int(t0), int(q0), 0, len(topic_ids))], np.arange(len(topic_ids))
    q_lo = int(queue_ids.min())
    span = int(queue_ids.max()) - q_lo + 1
    m = (int(topic_ids.max()) + 1) * span
    if q_lo >= 0 and m < (1 << 16) - 1:
        # small numbers: NumPy's stable sort of 16-bit keys is a radix sort (unreadable
        # rows take key m, after every group)
        key = (topic_ids.astype(np.int64) * span + (queue_ids - q_lo)).astype(np.uint16)
        if unreadable is not None:
            key[unreadable] = m
        order = np.argsort(key, kind="stable")
        counts = np.bincount(key, minlength=m + 1)
        ends = np.cumsum(counts)
        return [(k // span, k % span + q_lo, int(ends[k] - counts[k]), int(ends[k]))
                for k in np.flatnonzero(counts[:m]).tolist()], order
    # any queue ids (a damaged header's may be huge or negative): 64-bit keys
    key = (topic_ids.astype(np.int64) << 32) | (queue_ids.astype(np.int64) & 0xFFFFFFFF)
    if unreadable is not None:
        key[unreadable] = -1
    order = np.argsort(key, kind="stable")
    key = key[order]
    cuts = [0, *(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), len(key)]
    return [(int(key[a]) >> 32, ((int(key[a]) & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000, a, b)
            for a, b in zip(cuts[:-1], cuts[1:]) if key[a] >= 0], order


def recover_tail(store: CoreParts, start_offset: int, *, limit: int | None = None,
                 listeners: Sequence[RecoveryListener] = ()) -> int:
    """Rescan the CommitLog from ``start_offset``; return the offset where the valid log ends.

    ``limit``: where an append that never completed began (``write_in_progress``); the log
    is cut there even if some of that append's records are whole, so an unacknowledged
    batch is dropped entirely rather than half kept.
    """
    log = store.commit_log
    log.files.refresh()
    start = max(start_offset, log.min_offset(), 0)
    if log.files.find(start) is None and start > log.min_offset():
        # the start lies in a segment that no longer (or never) existed: nothing to rescan
        start = max(log.min_offset(), min(start, _log_end_guess(store)))
    # damage before the confirmed end is skipped, not cut (the records after it are valid)
    confirmed = store.checkpoint.get("confirm_phy_offset") if store.checkpoint.trusted else None
    found = scan_entries(store, start, limit=limit, resync_until=confirmed)
    rows, last_ts, cut = found.rows, found.last_timestamp_ms, found.cut
    for topic in {topic for topic, _ in rows}:
        store.ensure_topic(topic)
    kept_offsets, kept_flags = found.offsets, found.sys_flags
    end = log.scan_end if log.files.files else 0
    if cut is not None or (limit is not None and end > limit >= start):
        end = max(start, limit)
    scan = RecoveryScan(start=start, end=end, limited=limit is not None,
                        offsets=kept_offsets, sys_flags=kept_flags)
    for listener in listeners:  # durably, before the checkpoint moves
        listener(store, scan)
    store.dispatcher.dispatch_rows(rows)
    log.truncate(end)
    for topic, queue_id in store.all_consume_queues():
        store.consume_queue(topic, queue_id).truncate_physical(end)
    cp = store.checkpoint
    cp.set("confirm_phy_offset", end)
    if cp.get("last_append_offset") > end:
        cp.set("last_append_offset", start)
    if cp.get("flushed_phy_offset") > end:
        cp.set("flushed_phy_offset", end)
    if last_ts is not None:
        cp.set("physic_msg_timestamp", last_ts)
    cp.set("write_generation", cp.get("write_generation") + 1)
    cp.set("write_in_progress", -1)
    cp.flush()
    store.appender.queue_next.clear()
    return end


def _log_end_guess(store: CoreParts) -> int:
    last = store.commit_log.files.last_file()
    return last.start if last is not None else 0
