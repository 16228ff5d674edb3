"""Index commits: records appended invisible (*staged*) and made visible later by a marker.

A writer that must make many records visible at once, later and maybe from another process
(the exactly-once sink: tasks stage, the driver commits), appends them *staged*: in their
real topic and queue, with the transaction type PREPARED in SYSFLAG, so that no dispatch,
recovery scan or queue rebuild gives them a ConsumeQueue entry (RocketMQ's dispatcher skips
prepared records the same way).  Committing them appends one *commit marker* naming their
CommitLog ranges; dispatching the marker writes their ConsumeQueue entries, in range order,
at the ends of their queues.  The rows are written once; the commit writes the marker and
20 bytes of queue entry per row.

A staged record (layout :mod:`store.formats.record_codec`) differs from a plain one in three
header fields::

    field                         value
    SYSFLAG                       transaction type PREPARED (0x4)
    QUEUEOFFSET                   -1 (:data:`STAGED_QUEUE_OFFSET`): not known before its
                                  commit; its ConsumeQueue position is its queue offset
    PREPAREDTRANSACTIONOFFSET     the tagsCode its ConsumeQueue entry gets (computed when it
                                  is staged: a delayed row's due time counts from then)

Commit marker (topic :data:`INDEX_COMMIT_TOPIC`, queue 0, a system topic; the body, all
integers big-endian, R ranges, Q queues)::

    off          size   type      field
    0            4      bytes     MARKER_MAGIC "RMQM"
    4            4      i32       R
    8            4      i32       Q
    12           4      i32       L: bytes of the topic names
    16           16R    i64[2R]   start, end of each range (CommitLog offsets, each range
                                  inside one segment; records back to back)
    16+16R       4Q     i32[Q]    where each queue's topic name ends in the names
    16+16R+4Q    4Q     i32[Q]    the queue id
    16+16R+8Q    8Q     i64[Q]    the queue offset its first record takes
    16+16R+16Q   8Q     i64[Q]    how many of the records go to it
    16+16R+24Q   L      utf-8     the topic names back to back

The records of the ranges, in order, take their queue's offsets ``first, first + 1, ...``:
a marker's dispatch writes the same entries every time (it is idempotent).

What a commit reads.  :func:`commit_staged` reads the header of every record of its ranges
(a compiled walk, :func:`walk_staged`).  A stager that kept what it placed (the
exactly-once sink, in its stage notes) commits without reading the records:
:mod:`store.core.placed_commit` writes the entries from its columns, after cheap checks
against the CommitLog (that module says which).  Recovery, a queue rebuild and a follower
always read the records (:func:`marker_entries`).

Crash safety.  The marker is appended like any record; its records' entries are written
only once the marker is *published* (confirmed), so that no reader sees a row of a commit a
crash could still undo.  Before publishing, the append sets the checkpoint's
``index_commit_pending`` to the marker's offset and clears it when every entry is written;
the next writer (or the next open) that finds it set below the confirmed offset writes the
entries again (:func:`finish_pending_commit`: a commit is rolled forward, never back); set
at or past it (the marker's append never completed, recovery cut it), it is cleared.
Recovery's scans and a queue rebuild meet markers as records and add their entries
(:func:`marker_rows`), so a queue rebuilt from the CommitLog holds every committed row once
and no staged row of a commit that never happened.

Queue order.  A queue's entries point at CommitLog offsets that increase, except where a
commit's records were staged before records appended to the same queue meanwhile: the
entries are in the queue's order, the order the rows became visible.  Readers read such a
queue in runs of increasing offsets; recovery cuts a queue at its first entry at or past the
cut (:meth:`~store.files.consume_queue.ConsumeQueue.truncate_physical`).

The appends of one atomic group after a marker must not write to the marker's queues (their
entries would land before the marker's); a commit appends its marker last.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..base.errors import CorruptRecordError
from ..files.consume_queue import ENTRY_DTYPE
from ..formats.record_codec import (
    STAGED_QUEUE_OFFSET,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
    RecordSpec,
)
from ..kernels.staged_walk import (
    BAD_END,
    BAD_RECORD,
    MAX_TOPICS,
    NOT_STAGED,
    TOO_MANY_TOPICS,
    staged_records,
)
from .queue_dispatch import QueueEntries

INDEX_COMMIT_TOPIC = "rmq_sys_index_commit"
MARKER_MAGIC = b"RMQM"
#: Magic, range count, queue count and topic names' length of a marker body.
MARKER_HEAD = struct.Struct(">4siii")


def register_index_commits(core) -> None:
    """The marker topic: one queue of a system topic (hidden from users' topic lists)."""
    core.register_system_topic(INDEX_COMMIT_TOPIC, 1)


# ---------------------------------------------------------------------------- staging
# A stager encodes its records with the PREPARED sys flag and their tagsCodes in their
# headers' PREPAREDTRANSACTIONOFFSET (:meth:`TableChunk.encode
# <store.produce.table_producer.TableChunk.encode>` with ``codes_as_prepared``: set before
# the record kernel copies the headers, no pass over the records); the append writes
# QUEUEOFFSET -1, as for every record without an entry.


# ---------------------------------------------------------------------------- the walk
@dataclass(frozen=True, slots=True)
class StagedColumns:
    """The staged records of a commit's ranges, in order: each one's topic (an index into
    ``topics``), queue id, CommitLog offset, size and tagsCode."""

    topics: list[str]
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    codes: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)


def walk_staged(core, ranges: list[tuple[int, int]]) -> StagedColumns:
    """The staged records of ``ranges`` (structural checks of every record, no body CRC: the
    records were checked when staged), by one compiled walk per segment
    (:func:`~store.kernels.staged_walk.staged_records`); :class:`CorruptRecordError` when a
    range does not hold back-to-back staged records exactly."""
    log = core.commit_log
    names: dict[str, int] = {}
    parts = []
    by_segment: dict[int, list[tuple[int, int]]] = {}
    for start, end in ranges:
        f = log.files.find(start)
        if end <= start or f is None or end > f.end:
            raise CorruptRecordError(log.directory, start, f"staged range up to {end} is not "
                                     "inside one stored CommitLog segment (removed by "
                                     "retention, or never written)")
        by_segment.setdefault(f.start, []).append((start - f.start, end - f.start))
    for base, pieces in by_segment.items():
        f = log.files.find(base)
        raw = np.frombuffer(f.buffer(), dtype=np.uint8)
        bounds = np.array(pieces, dtype=np.int64)
        cols, topics, problem, where = staged_records(raw, bounds[:, 0], bounds[:, 1])
        if problem:
            raise CorruptRecordError(f.path, base + where, _PROBLEMS.get(problem, "?"))
        local = np.array([names.setdefault(t.decode("utf-8", "replace"), len(names))
                          for t in topics], dtype=np.int64)
        parts.append((local[cols[4]] if len(local) else cols[4], cols[2], cols[0] + base,
                      cols[1], cols[3]))
    if not parts:
        empty = np.empty(0, np.int64)
        return StagedColumns([], empty, empty, empty, empty, empty)
    cols = [np.concatenate(c) if len(parts) > 1 else c[0] for c in zip(*parts)]
    return StagedColumns(list(names), *cols)


_PROBLEMS = {BAD_RECORD: "not a whole record in a staged range (damaged, or not a staged "
                         "range)",
             NOT_STAGED: "record in a staged range that is not staged (its sys flag is not "
                         "PREPARED or its queue offset is not -1)",
             BAD_END: "staged range that does not end at a record's end",
             TOO_MANY_TOPICS: f"staged range of records of more than {MAX_TOPICS} topics "
                              "in one segment; allowed: fewer topics per commit"}



#: More runs of one queue than this in a commit: the records are grouped by a sort.
_MAX_RUNS = 1024


@dataclass(frozen=True, slots=True)
class QueueRuns:
    """The records of a commit by queue: the queues in the order the records meet them,
    each one's record count and its records (a slice when they are consecutive: a chunk of
    staged records is usually one run of one queue, and nothing is sorted or copied; a list
    of slices for several runs; an index array after a sort)."""

    keys: list[tuple[str, int]]
    counts: np.ndarray
    picks: list


def _groups(cols: StagedColumns) -> QueueRuns:
    key = (cols.topic_ids << 32) | (cols.queue_ids & 0xFFFFFFFF)
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    if len(cuts) >= _MAX_RUNS:  # (rows of many queues interleaved)
        uniq, first_at, group = np.unique(key, return_index=True, return_inverse=True)
        order = np.argsort(first_at, kind="stable")
        renum = np.empty(len(order), np.int64)
        renum[order] = np.arange(len(order))
        group = renum[group.ravel()]
        by = np.argsort(group, kind="stable")
        counts = np.bincount(group, minlength=len(order))
        ends = np.cumsum(counts).tolist()
        return QueueRuns([(cols.topics[int(uniq[g]) >> 32], int(cols.queue_ids[first_at[g]]))
                          for g in order.tolist()], counts,
                         [by[e - c:e] for e, c in zip(ends, counts.tolist())])
    starts = np.concatenate(([0], cuts)).tolist()
    stops = np.concatenate((cuts, [len(key)])).tolist()
    index: dict[int, int] = {}
    keys: list[tuple[str, int]] = []
    runs: list[list[tuple[int, int]]] = []
    for a, b in zip(starts, stops):  # one step per run of one queue (fewer than _MAX_RUNS)
        g = index.setdefault(int(key[a]), len(keys))
        if g == len(keys):
            keys.append((cols.topics[int(cols.topic_ids[a])], int(cols.queue_ids[a])))
            runs.append([])
        runs[g].append((a, b))
    counts = np.array([sum(b - a for a, b in r) for r in runs], dtype=np.int64)
    picks = [slice(*r[0]) if len(r) == 1 else [slice(a, b) for a, b in r] for r in runs]
    return QueueRuns(keys, counts, picks)


def _entries(cols: StagedColumns, groups: QueueRuns, firsts: np.ndarray) -> QueueEntries:
    """Each queue's entries as units (laid out once for every record, then a view of them
    for a queue of one run, the runs joined for another)."""
    units = np.empty(len(cols), dtype=ENTRY_DTYPE)
    units["offset"] = cols.offsets
    units["size"] = cols.sizes
    units["tags_code"] = cols.codes
    return {key: (int(firsts[g]), _joined(units, pick) if isinstance(pick, list)
                  else units[pick])
            for g, (key, pick) in enumerate(zip(groups.keys, groups.picks))}


def _joined(units: np.ndarray, picks: list[slice]) -> np.ndarray:
    """The units of ``picks`` one after the other (not ``np.concatenate``: it would give
    the big-endian fields native byte order)."""
    out = np.empty(sum(p.stop - p.start for p in picks), dtype=ENTRY_DTYPE)
    at = 0
    for p in picks:
        out[at:at + p.stop - p.start] = units[p]
        at += p.stop - p.start
    return out


# ---------------------------------------------------------------------------- the marker
@dataclass(frozen=True, slots=True)
class Marker:
    """A decoded commit marker (see the module doc)."""

    ranges: list[tuple[int, int]]
    keys: list[tuple[str, int]]
    firsts: np.ndarray
    counts: np.ndarray


def encode_marker(marker: Marker) -> bytes:
    names = [t.encode("utf-8") for t, _ in marker.keys]
    ends = np.cumsum([len(n) for n in names], dtype=np.int64)
    text = b"".join(names)
    return b"".join([
        MARKER_HEAD.pack(MARKER_MAGIC, len(marker.ranges), len(marker.keys), len(text)),
        np.asarray(marker.ranges, dtype=">i8").reshape(-1).tobytes(),
        ends.astype(">i4").tobytes(),
        np.array([q for _, q in marker.keys], dtype=">i4").tobytes(),
        np.asarray(marker.firsts, dtype=">i8").tobytes(),
        np.asarray(marker.counts, dtype=">i8").tobytes(), text])


def decode_marker(body, file: str = INDEX_COMMIT_TOPIC, position: int = -1) -> Marker:
    """The marker of a body; :class:`CorruptRecordError` when it is not one."""
    view = memoryview(body)

    def refuse(what: str):
        return CorruptRecordError(file, position, f"commit marker whose body {what}")

    if len(view) < MARKER_HEAD.size:
        raise refuse(f"of {len(view)} bytes is shorter than its head")
    magic, r, q, length = MARKER_HEAD.unpack_from(view, 0)
    need = MARKER_HEAD.size + 16 * r + 24 * q + length
    if magic != MARKER_MAGIC or min(r, q, length) < 0 or need != len(view):
        raise refuse(f"is not a marker (magic {magic!r}, {r} ranges, {q} queues, {length} "
                     f"bytes of names in {len(view)} bytes)")
    raw = np.frombuffer(view, np.uint8)
    at = MARKER_HEAD.size
    ranges = raw[at:at + 16 * r].view(">i8").astype(np.int64).reshape(-1, 2)
    at += 16 * r
    ends = raw[at:at + 4 * q].view(">i4").astype(np.int64)
    queue_ids = raw[at + 4 * q:at + 8 * q].view(">i4").astype(np.int64)
    firsts = raw[at + 8 * q:at + 16 * q].view(">i8").astype(np.int64)
    counts = raw[at + 16 * q:at + 24 * q].view(">i8").astype(np.int64)
    text = bytes(raw[at + 24 * q:])
    starts = np.concatenate(([0], ends[:-1])) if q else ends
    if q and (ends[0] < 0 or (np.diff(ends) < 0).any() or ends[-1] != length):
        raise refuse("has topic names that do not add up")
    try:
        topics = [text[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist())]
    except UnicodeDecodeError:
        raise refuse("has a topic name that is not UTF-8") from None
    return Marker([(int(a), int(b)) for a, b in ranges.tolist()],
                  list(zip(topics, queue_ids.tolist())), firsts, counts)


@dataclass(frozen=True, slots=True)
class IndexCommit:
    """What :func:`commit_staged` did: the marker's CommitLog offset and how many records it
    made visible in how many queues."""

    marker_offset: int
    rows: int
    queues: int


def commit_staged(core, ranges: list[tuple[int, int]], *, born_timestamp_ms: int | None = None
                  ) -> IndexCommit:
    """Append the commit marker of the staged records of ``ranges``, read by a walk over
    their headers (see the module doc; :func:`commit_placed` does not read them); their
    entries are written once the marker is published (at the end of the caller's atomic
    group, or at once).  The caller holds the write lock.

    Raises
    ------
    CorruptRecordError
        A range does not hold staged records only (nothing is appended).
    """
    ranges = sorted((int(a), int(b)) for a, b in ranges)
    return commit_columns(core, ranges, walk_staged(core, ranges), born_timestamp_ms)


def commit_columns(core, ranges: list[tuple[int, int]], cols: StagedColumns,
                    born_timestamp_ms: int | None) -> IndexCommit:
    """Append the marker of the records ``cols`` of ``ranges`` (one row each, in range
    order), grouped by queue (as :func:`commit_staged` after its walk)."""
    if not len(cols):
        return IndexCommit(-1, 0, 0)
    groups = _groups(cols)
    return append_marker(core, ranges, groups.keys, groups.counts,
                         lambda firsts: _entries(cols, groups, firsts), born_timestamp_ms)


def append_marker(core, ranges: list[tuple[int, int]], keys: list[tuple[str, int]],
                  counts: np.ndarray, entries: Callable[[np.ndarray], QueueEntries],
                  born_timestamp_ms: int | None) -> IndexCommit:
    """Append the marker of ``ranges`` whose records go ``counts[g]`` to queue ``keys[g]``
    (creating their topics), and have their entries written once it is published:
    ``entries(firsts)``, given each queue's first queue offset (the caller holds the write
    lock and has checked the records)."""
    appender = core.appender
    for topic, _ in keys:
        core.ensure_topic(topic)
    firsts = np.array([appender.next_queue_offset(k) for k in keys], dtype=np.int64)
    body = encode_marker(Marker(ranges, keys, firsts, counts))
    now = core.now_ms() if born_timestamp_ms is None else born_timestamp_ms
    with appender.atomic_group():  # (joins the caller's): pending is set before publishing
        [result] = core.append([RecordSpec(topic=INDEX_COMMIT_TOPIC, body=body, queue_id=0,
                                           properties={}, born_timestamp_ms=now)])
        offset = int(result.commitlog_offset)
        written = entries(firsts)
        for g, key in enumerate(keys):  # later appends of this process go after them
            appender.queue_next[key] = int(firsts[g] + counts[g])
        appender.after_publish(offset, lambda: _dispatch(core, offset, written))
    return IndexCommit(offset, int(np.sum(counts)), len(keys))


def _dispatch(core, offset: int, entries: QueueEntries) -> None:
    """Write a published marker's entries and clear ``index_commit_pending`` (which its
    append set, before publishing, to ``offset``)."""
    core.dispatcher.dispatch(entries)
    cp = core.checkpoint
    if cp.get("index_commit_pending") == offset:
        cp.set("index_commit_pending", 0)


def marker_entries(core, offset: int) -> QueueEntries:
    """The entries of the marker record at ``offset`` (read from its records again)."""
    record = core.commit_log.read_record(offset)
    marker = decode_marker(record.body, core.commit_log.directory, offset)
    cols = walk_staged(core, marker.ranges)
    groups = _groups(cols)
    if groups.keys != marker.keys or not np.array_equal(groups.counts, marker.counts):
        raise CorruptRecordError(core.commit_log.directory, offset, "commit marker whose "
                                 "ranges do not hold the records it counts")
    return _entries(cols, groups, marker.firsts)


def finish_pending_commit(core) -> bool:
    """Write the entries of a marker whose writer died between publishing it and writing
    them (``index_commit_pending`` set below the confirmed offset); clear a pending marker
    that recovery cut.  The caller holds the write lock.  Returns whether it wrote any."""
    cp = core.checkpoint
    pending = cp.get("index_commit_pending")
    if pending <= 0:
        return False
    wrote = False
    if pending < cp.get("confirm_phy_offset"):
        try:
            core.dispatcher.dispatch(marker_entries(core, pending))
            wrote = True
        except CorruptRecordError:  # its records are gone (retention): nothing to show
            pass
    cp.set("index_commit_pending", 0)
    return wrote


def is_staged(sys_flag: int, queue_offset: int) -> bool:
    """Whether a record's header fields say it is a staged one."""
    return (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE \
        and queue_offset == STAGED_QUEUE_OFFSET


class _Committed:
    """The ranges the published markers of one store name, read from the marker queue
    once and then from where the last call stopped (one per store object, see
    :func:`committed`)."""

    def __init__(self) -> None:
        self.read_to = 0
        self.starts = np.empty(0, np.int64)
        self.ends = np.empty(0, np.int64)

    def refresh(self, store) -> None:
        limit = store.confirmed_offset()
        queue = store.consume_queue(INDEX_COMMIT_TOPIC, 0)
        hi = queue.max_offset(limit)
        lo = max(self.read_to, queue.min_offset(store.commit_log.min_offset(), limit))
        if lo >= hi:
            return
        pairs = []
        for off in queue.entries(lo, hi)["offset"].tolist():  # one step per marker
            try:
                record = store.commit_log.read_record(int(off))
                pairs += decode_marker(record.body, store.commit_log.directory, off).ranges
            except CorruptRecordError:  # removed by retention: its records went first
                continue
        self.read_to = hi
        if pairs:
            both = np.array(pairs, dtype=np.int64).reshape(-1, 2)
            starts = np.concatenate((self.starts, both[:, 0]))
            order = np.argsort(starts, kind="stable")
            self.starts = starts[order]
            self.ends = np.concatenate((self.ends, both[:, 1]))[order]


_COMMITTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def committed(store, offsets) -> np.ndarray:
    """Which staged records at CommitLog ``offsets`` a published commit marker names (a
    query by key or id finds staged records through the key index, which indexes every
    record it walks: one no marker names is not shown)."""
    state = _COMMITTED.get(store)
    if state is None:
        state = _COMMITTED[store] = _Committed()
    state.refresh(store)
    offsets = np.asarray(offsets, dtype=np.int64)
    at = np.searchsorted(state.starts, offsets, side="right") - 1
    inside = at >= 0
    inside[inside] &= offsets[inside] < state.ends[at[inside]]
    return inside


def marker_rows(core, offsets: np.ndarray) -> dict[tuple[str, int], np.ndarray]:
    """Queue rows ``(queue offset, CommitLog offset, size, tagsCode)`` of the markers at
    ``offsets`` (a recovery scan's or a rebuild's markers), by queue; a marker whose records
    are gone or damaged adds nothing."""
    rows: dict[tuple[str, int], list[np.ndarray]] = {}
    for offset in np.asarray(offsets, dtype=np.int64).tolist():
        try:
            entries = marker_entries(core, offset)
        except CorruptRecordError:
            continue
        for key, (first, units) in entries.items():
            table = np.empty((len(units), 4), dtype=np.int64)
            table[:, 0] = first + np.arange(len(units))
            table[:, 1] = units["offset"]
            table[:, 2] = units["size"]
            table[:, 3] = units["tags_code"]
            rows.setdefault(key, []).append(table)
    return {key: np.concatenate(parts) for key, parts in rows.items()}


__all__ = [
    "INDEX_COMMIT_TOPIC",
    "STAGED_QUEUE_OFFSET",
    "IndexCommit",
    "Marker",
    "StagedColumns",
    "append_marker",
    "commit_columns",
    "commit_staged",
    "decode_marker",
    "encode_marker",
    "finish_pending_commit",
    "marker_entries",
    "marker_rows",
    "register_index_commits",
    "walk_staged",
]
