"""Index commits from what the stager placed: a commit that does not read its records.

Whoever stages records (:mod:`store.core.index_commit`) encoded them and kept where the
append put them, so it knows each one's topic, queue id, size and tagsCode without reading
them back.  It hands those columns to the commit as :class:`StagedRuns` (the exactly-once
sink keeps them in its stage notes, :mod:`store.sink.staged_format`), and
:func:`commit_placed` writes the ConsumeQueue entries from them: the cost of a commit is the
columns (about 4 bytes a record) and the 20 bytes of queue entry a record, never the
records.

The columns come in *runs*: a run is records of one queue, back to back inside one *range*
(a stretch of one CommitLog segment holding staged records only), and the runs of a range
follow one another and cover it; tagsCodes come in runs of records of one tagsCode.  A
chunk of staged rows is usually one run of one queue and one tagsCode, so a commit does a
few steps of Python per chunk and the rest in NumPy, per run (in pieces that stay in the
CPU's caches).

What :func:`check_placed` checks against the CommitLog before anything is appended, and what
it takes on trust:

* checked: the ranges do not overlap, each lies inside one stored segment below the log's
  end; the sizes of each range's records add up to its length; the first and the last record
  of each range are whole staged records (magic code, sizes, PREPARED sys flag, QUEUEOFFSET
  -1, by the compiled walk of :func:`~store.core.index_commit.walk_staged`) whose size,
  queue id, tagsCode and topic are what the columns say;
* trusted: the records between the first and the last of a range (their sizes, queues and
  tagsCodes are the stager's word, written by the call that appended them; the sink's note
  holding them is covered by its body CRC).  Recovery, a queue rebuild and a follower read
  the records themselves (:func:`~store.core.index_commit.marker_entries`).

A commit whose columns fail a check raises :class:`CorruptRecordError` and appends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base.errors import CorruptRecordError
from ..files.consume_queue import ENTRY_DTYPE
from .index_commit import (
    IndexCommit,
    StagedColumns,
    append_marker,
    commit_columns,
    walk_staged,
)

#: More runs than this in one commit: the records are expanded to one row each and grouped
#: by a sort (:func:`~store.core.index_commit.commit_staged`'s way) rather than run by run.
MAX_RUNS = 4096


# ---------------------------------------------------------------------------- rows
def joined_columns(parts: list[StagedColumns]) -> StagedColumns:
    """The rows of ``parts`` one after the other (their topics numbered anew)."""
    names: dict[str, int] = {}
    ids = []
    for p in parts:
        local = [names.setdefault(t, len(names)) for t in p.topics]
        topic_ids = np.asarray(p.topic_ids, dtype=np.int64)
        if local != list(range(len(local))):  # (numbered as before: kept)
            topic_ids = np.array(local, dtype=np.int64)[topic_ids]
        ids.append(topic_ids)
    if not parts:
        empty = np.empty(0, np.int64)
        return StagedColumns([], empty, empty, empty, empty, empty)
    return StagedColumns(list(names), np.concatenate(ids), *(
        np.concatenate([np.asarray(getattr(p, name), dtype=np.int64) for p in parts])
        for name in ("queue_ids", "offsets", "sizes", "codes")))


def sliced_columns(cols: StagedColumns, lo: int, hi: int) -> StagedColumns:
    """Rows ``lo:hi`` of ``cols`` (views)."""
    return StagedColumns(cols.topics, cols.topic_ids[lo:hi], cols.queue_ids[lo:hi],
                         cols.offsets[lo:hi], cols.sizes[lo:hi], cols.codes[lo:hi])


# ---------------------------------------------------------------------------- runs
@dataclass(frozen=True, slots=True)
class StagedRuns:
    """Staged records as their stager placed them, in runs (see the module doc); every
    array int64.

    ``ranges`` (R, 2): start and end of each range, by start; ``range_runs`` (R): how many
    runs each one holds (a range's runs follow one another in run order and cover it back
    to back).  Per run (U): ``run_topics`` (an index into ``topics``), ``run_queues``,
    ``run_first`` (its first record, an index into ``sizes``) and ``run_counts``.  ``sizes``
    (N): each record's size.  ``code_values`` and ``code_ends`` (C): record ``i`` has the
    tagsCode ``code_values[k]`` of the first ``k`` with ``i < code_ends[k]``.
    """

    ranges: np.ndarray
    range_runs: np.ndarray
    topics: list[str]
    run_topics: np.ndarray
    run_queues: np.ndarray
    run_first: np.ndarray
    run_counts: np.ndarray
    sizes: np.ndarray
    code_values: np.ndarray
    code_ends: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)


def _starts(changed: np.ndarray) -> np.ndarray:
    """Where each run starts, ``changed[i]`` saying whether record ``i + 1`` starts one."""
    return np.concatenate(([0], np.flatnonzero(changed) + 1))


def staged_runs(cols: StagedColumns, file_size: int) -> StagedRuns:
    """The runs of the records ``cols`` (rows by CommitLog offset, in a log of ``file_size``
    segments): a range ends where the next record does not follow back to back or lies in
    another segment; a run where the queue changes or a range ends."""
    offsets, sizes = cols.offsets, cols.sizes
    n = len(offsets)
    if n == 0:
        e = np.empty(0, np.int64)
        return StagedRuns(np.empty((0, 2), np.int64), e, list(cols.topics), e, e, e, e, e, e, e)
    new_range = ((offsets[1:] != offsets[:-1] + sizes[:-1])
                 | (offsets[1:] // file_size != offsets[:-1] // file_size))
    key = (cols.topic_ids << 32) | (cols.queue_ids & 0xFFFFFFFF)
    range_first = _starts(new_range)
    run_first = _starts(new_range | (key[1:] != key[:-1]))
    range_last = np.append(range_first[1:], n) - 1
    ranges = np.stack([offsets[range_first], offsets[range_last] + sizes[range_last]], axis=1)
    range_runs = np.diff(np.append(np.searchsorted(run_first, range_first), len(run_first)))
    code_first = _starts(cols.codes[1:] != cols.codes[:-1])
    return StagedRuns(ranges, range_runs, list(cols.topics), cols.topic_ids[run_first],
                      cols.queue_ids[run_first], run_first,
                      np.diff(np.append(run_first, n)), np.asarray(sizes, np.int64),
                      cols.codes[code_first], np.append(code_first[1:], n))


def merged_runs(parts: list[StagedRuns]) -> StagedRuns:
    """The staged records of ``parts`` (several stagers' notes) in one, their ranges
    sorted by start: the order a marker's dispatch takes them in."""
    parts = [p for p in parts if len(p.ranges)]
    if len(parts) == 1:
        return parts[0]
    names: dict[str, int] = {}
    topic_ids, run_first, code_ends = [], [], []
    rows = 0
    for p in parts:
        local = np.array([names.setdefault(t, len(names)) for t in p.topics], dtype=np.int64)
        topic_ids.append(local[p.run_topics])
        run_first.append(p.run_first + rows)
        code_ends.append(p.code_ends + rows)
        rows += len(p.sizes)
    e = np.empty(0, np.int64)

    def cat(arrays: list) -> np.ndarray:
        return np.concatenate(arrays) if arrays else e

    ranges = np.concatenate([p.ranges for p in parts]) if parts else np.empty((0, 2), np.int64)
    range_runs = cat([p.range_runs for p in parts])
    runs = (cat(topic_ids), cat([p.run_queues for p in parts]), cat(run_first),
            cat([p.run_counts for p in parts]))
    order = np.argsort(ranges[:, 0], kind="stable")
    if len(order) and not (np.diff(order) == 1).all():
        # each range's block of runs, in the ranges' new order
        before = np.cumsum(range_runs) - range_runs
        counts = range_runs[order]
        pick = np.arange(int(counts.sum())) + np.repeat(
            before[order] - (np.cumsum(counts) - counts), counts)
        ranges, range_runs, runs = ranges[order], counts, tuple(r[pick] for r in runs)
    return StagedRuns(ranges, range_runs, list(names), *runs, cat([p.sizes for p in parts]),
                      cat([p.code_values for p in parts]), cat(code_ends))


# ---------------------------------------------------------------------------- checks
def _codes_at(staged: StagedRuns, rows: np.ndarray) -> np.ndarray:
    return staged.code_values[np.searchsorted(staged.code_ends, rows, side="right")]


def check_placed(core, staged: StagedRuns) -> np.ndarray:
    """The checks of the module doc; returns the CommitLog offset each run starts at.

    Raises
    ------
    CorruptRecordError
        At the first check that fails.
    """
    log = core.commit_log
    ranges, range_runs = staged.ranges, staged.range_runs
    starts, ends = ranges[:, 0], ranges[:, 1]
    file_size = core.config.commitlog_file_size_bytes

    def refuse(at, what: str):
        return CorruptRecordError(log.directory, int(at), f"staged records {what}; the "
                                  "commit is refused (nothing was made visible)")

    if not len(starts):
        raise refuse(-1, f"counted as {len(staged.sizes)} records in no range")

    u, n = len(staged.run_first), len(staged.sizes)
    shape = (int(range_runs.sum()) != u or (range_runs < 1).any() or (staged.run_counts < 1).any()
             or int(staged.run_counts.sum()) != n or (staged.sizes < 1).any()
             or len(staged.code_ends) == 0 or int(staged.code_ends[-1]) != n
             or (staged.run_first < 0).any() or (staged.run_first + staged.run_counts > n).any()
             or (staged.run_topics < 0).any() or (staged.run_topics >= len(staged.topics)).any())
    if shape:
        raise refuse(starts[0], f"whose {u} runs do not cover the {n} records of their "
                     f"{len(starts)} ranges")
    bad = np.flatnonzero((ends <= starts) | (starts // file_size != (ends - 1) // file_size))
    if len(bad):
        k = int(bad[0])
        raise refuse(starts[k], f"in range [{int(starts[k])}, {int(ends[k])}) (allowed: a "
                     "nonempty range inside one segment)")
    if len(starts) > 1 and (starts[1:] < ends[:-1]).any():
        k = int(np.flatnonzero(starts[1:] < ends[:-1])[0]) + 1
        raise refuse(starts[k], "in ranges that overlap or are out of order")
    write_end = core.appender.write_offset
    if int(ends.max()) > write_end:
        raise refuse(ends.max(), f"in a range past the log's end ({write_end})")
    # each run's bytes, then where it starts: its range's start plus the runs before it there
    total = np.concatenate(([0], np.cumsum(staged.sizes)))
    run_bytes = total[staged.run_first + staged.run_counts] - total[staged.run_first]
    first_run = np.cumsum(range_runs) - range_runs
    before = np.cumsum(run_bytes) - run_bytes
    run_starts = before + np.repeat(starts - before[first_run], range_runs)
    last_run = first_run + range_runs - 1
    sums = run_starts[last_run] + run_bytes[last_run]
    if (sums != ends).any():
        k = int(np.flatnonzero(sums != ends)[0])
        raise refuse(starts[k], f"whose sizes add up to {int(sums[k] - starts[k])} bytes in "
                     f"range [{int(starts[k])}, {int(ends[k])})")
    # the first and the last record of each range, read
    last_row = staged.run_first[last_run] + staged.run_counts[last_run] - 1
    rows = np.stack([staged.run_first[first_run], last_row], axis=1).ravel()
    runs = np.stack([first_run, last_run], axis=1).ravel()
    at = np.stack([starts, ends - staged.sizes[last_row]], axis=1).ravel()
    keep = np.ones(len(rows), bool)
    keep[1::2] = staged.run_counts[last_run] + (range_runs > 1) > 1  # (one record: once)
    rows, runs, at = rows[keep], runs[keep], at[keep]
    sizes = staged.sizes[rows]
    seen = walk_staged(core, list(zip(at.tolist(), (at + sizes).tolist())))
    said = [staged.topics[t] for t in staged.run_topics[runs].tolist()]
    named = [seen.topics[t] for t in seen.topic_ids.tolist()]
    differ = ((seen.sizes != sizes) | (seen.queue_ids != staged.run_queues[runs])
              | (seen.codes != _codes_at(staged, rows))
              | np.array([a != b for a, b in zip(named, said)], dtype=bool))
    if differ.any():
        k = int(np.flatnonzero(differ)[0])
        raise refuse(at[k], "whose record header (size, queue id, tagsCode or topic) is not "
                     "what their stager's columns say")
    return run_starts


# ---------------------------------------------------------------------------- the commit
def commit_placed(core, staged: StagedRuns, *, born_timestamp_ms: int | None = None
                  ) -> IndexCommit:
    """Append the commit marker of the staged records ``staged`` (ranges by start, as
    :func:`merged_runs` gives them) after :func:`check_placed`; their entries, written from
    the columns, once the marker is published (as
    :func:`~store.core.index_commit.commit_staged`, which reads the records).  The caller
    holds the write lock.

    Raises
    ------
    CorruptRecordError
        The columns disagree with the CommitLog where checked (nothing is appended).
    """
    if not len(staged):
        return IndexCommit(-1, 0, 0)
    run_starts = check_placed(core, staged)
    ranges = [(a, b) for a, b in staged.ranges.tolist()]
    if len(run_starts) > MAX_RUNS:  # (rows of many queues interleaved: grouped by a sort)
        return commit_columns(core, ranges, _rows(staged, run_starts), born_timestamp_ms)
    keys, counts, units, spans = _units(staged, run_starts)
    return append_marker(core, ranges, keys, counts, lambda firsts: {
        key: (int(firsts[g]), units[a:b]) for g, (key, (a, b)) in enumerate(zip(keys, spans))},
        born_timestamp_ms)


def _units(staged: StagedRuns, run_starts: np.ndarray):
    """The queues of the runs in the order they meet them, each one's record count, the
    ConsumeQueue units of every record (queue by queue, each queue's in run order) and each
    queue's span of them."""
    index: dict[tuple[int, int], int] = {}
    group = []
    for key in zip(staged.run_topics.tolist(), staged.run_queues.tolist()):
        group.append(index.setdefault(key, len(index)))  # one step per run
    group = np.array(group, dtype=np.int64)
    counts = np.bincount(group, weights=staged.run_counts, minlength=len(index)
                         ).astype(np.int64)
    base = np.cumsum(counts) - counts
    # each run's first unit: the runs laid out queue by queue, each queue's in run order
    order = np.argsort(group, kind="stable")
    ran = staged.run_counts[order]
    dest = np.empty(len(group), np.int64)
    dest[order] = np.cumsum(ran) - ran
    units = np.empty(len(staged.sizes), dtype=ENTRY_DTYPE)
    ends = staged.code_ends
    lo_code = np.searchsorted(ends, staged.run_first, side="right")
    hi_code = np.searchsorted(ends, staged.run_first + staged.run_counts - 1, side="right")
    for d, a, n, start, k0, k1 in zip(dest.tolist(), staged.run_first.tolist(),
                                      staged.run_counts.tolist(), run_starts.tolist(),
                                      lo_code.tolist(), hi_code.tolist()):  # one per run
        sizes = staged.sizes[a:a + n]
        out = units[d:d + n]
        out["size"] = sizes
        offsets = np.empty(n, np.int64)
        offsets[0] = start
        np.cumsum(sizes[:-1], out=offsets[1:])
        offsets[1:] += start
        out["offset"] = offsets
        if k0 == k1:
            out["tags_code"] = staged.code_values[k0]
        else:
            cuts = np.clip(ends[k0:k1 + 1], a, a + n)
            out["tags_code"] = np.repeat(staged.code_values[k0:k1 + 1],
                                         np.diff(np.concatenate(([a], cuts))))
    names = staged.topics
    keys = [(names[t], q) for t, q in index]
    return keys, counts, units, list(zip(base.tolist(), (base + counts).tolist()))


def _rows(staged: StagedRuns, run_starts: np.ndarray) -> StagedColumns:
    """The records of ``staged`` one row each, in run order."""
    n = staged.run_counts
    take = np.arange(int(n.sum())) + np.repeat(staged.run_first - (np.cumsum(n) - n), n)
    sizes = staged.sizes[take]
    before = np.cumsum(sizes) - sizes
    offsets = before + np.repeat(run_starts - before[np.cumsum(n) - n], n)
    return StagedColumns(staged.topics, np.repeat(staged.run_topics, n),
                         np.repeat(staged.run_queues, n), offsets, sizes,
                         _codes_at(staged, take))


__all__ = [
    "MAX_RUNS",
    "StagedRuns",
    "check_placed",
    "commit_placed",
    "joined_columns",
    "merged_runs",
    "sliced_columns",
    "staged_runs",
]
