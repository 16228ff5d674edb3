"""Exactly-once batches of rows: stage them invisible, commit them all at once.

This is what the Spark sink (``df.write.format("rmq")``) runs on; Python users can call it
through :meth:`MessageStore.sink <store.facade.message_store.MessageStore.sink>` as well.  A *sink*
is identified by a string (the Spark sink uses the query's checkpoint location); each of its
batches by an integer (Spark's batch id).

Two ways to commit, chosen when rows are staged (``commit``; a commit takes halves of
both kinds):

* ``"index"`` (the default): the rows are written once.  They are staged as records in
  their real topics and queues that no reader sees (:mod:`store.core.index_commit`), and
  small halves, the *stage notes*, list their CommitLog ranges with the columns their
  entries need (sizes, queues, tagsCodes: what staging placed); the commit appends one
  index-commit marker, and dispatching it writes the rows' ConsumeQueue entries from those
  columns, without reading the records (:mod:`store.core.placed_commit`).
* ``"copy"``: the rows are staged inside half messages (*framed halves*) and the commit
  copies every record into its topic.  For a store that Apache RocketMQ itself must open:
  a RocketMQ broker rebuilding its queues skips prepared records and knows no markers, so
  it would not see rows committed by index (docs/sink.md).

1. **Stage** (:meth:`Sink.stage`, on any process, e.g. a Spark task): the rows are validated
   exactly as :meth:`Producer.send_table <store.produce.producer.Producer.send_table>` validates them
   (a bad row raises its typed error and nothing is written), encoded as the records the
   commit will make visible (routed to their queues, CRCs computed: the costly part of a
   write runs in the tasks, in parallel) and appended, with their *sink halves*
   (:mod:`store.sink.staged_format`): stage notes (one per call, more when one half cannot
   hold the columns of all its rows), or framed halves holding up
   to about ``max_message_size_bytes`` of records each, invisible to every reader.  Returns
   the halves' transaction ids, which the task hands to the driver.
2. **Commit** (:meth:`Sink.commit`, once per batch, on the driver): in one atomic group
   (:meth:`~store.core.store_core.StoreCore.atomic_append`: readers see all of it or none,
   a crash drops all of it) the marker of ``(sink, batch)``, the rows of framed halves
   copied into their real topics (or as delayed messages, due from the time the rows were
   staged, not from the commit; only placed, :func:`~store.sink.staging.append_staged`, not
   encoded again), the op messages ending the halves and last the index-commit marker of
   the stage notes' ranges (their entries are written once the group is published; a crash
   after that rolls them forward).  Halves of the sink that are open
   but not listed (failed task attempts, an earlier attempt of the batch, a killed job) are
   rolled back in the same group.
3. **Replay**: a commit of a batch whose marker exists (Spark re-running a batch after a
   failure) commits nothing new: it rolls the new halves back.  Ending is idempotent.

Halves that no commit ever lists stay open (invisible) until the sink's next commit or
:meth:`Sink.abort` rolls them back, or the transaction check loop discards them after
``transaction_check_max`` rounds; the check loop never asks users about sink halves, and
commits a half that a marker lists but that is still open (:func:`settle_check_views`).
A user's ``end_transaction(..., COMMIT)`` on a sink half is refused.

Two writers with the same sink id at the same time are not supported: the later commit
rolls back the halves of the other one's batch in progress, whose commit then fails with
:class:`SinkCommitError` (nothing of that batch becomes visible).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..formats.batch_encoding import paused_gc
from ..formats.record_codec import RecordSpec
from ..base.errors import CorruptRecordError, InvalidMessageError, SinkCommitError
from ..formats.message import (
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    validate_group,
    validate_sink_id,
)
from ..formats.message import PROPERTY_SINK
from .staged_format import (PROPERTY_SINK_BATCH, PROPERTY_SINK_ROWS, SINK_COMMIT_TOPIC,
                            decode_marker, decode_note, decode_staged, encode_marker,
                            encode_note, is_note, is_sink_transaction, marker_code,
                            marker_tags_code, new_transaction_id, note_bounds, note_fits,
                            note_ranges,
                            sink_code, sink_key, transaction_prefix)
from .staging import (
    append_staged,
    framed_half,
    half_bounds,
    half_budget,
    half_view,
    stage_rows,
)
from ..core.index_commit import walk_staged
from ..core.placed_commit import (StagedRuns, commit_placed, merged_runs, sliced_columns,
                                  staged_runs)
from ..formats.message import SINK_TX_PREFIX, TRANS_HALF_TOPIC
from ..produce.table_producer import append_table_chunks
from ..transaction.half import HALF_QUEUE_ID
from ..transaction.op import op_specs

#: How a sink commits the rows it stages (see the module doc).
COMMIT_MODES = ("index", "copy")
#: Rows of several halves a commit decodes and appends together.
COMMIT_GROUP_ROWS = 65536
_MARKER_CHUNK = 1 << 18


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """What :meth:`Sink.commit` did: rows and halves committed, halves rolled back, and
    whether the batch had committed before (a replay: nothing new became visible)."""

    rows: int
    halves: int
    rolled_back: int
    replayed: bool


def register_sink_topic(store) -> None:
    """The marker topic: one queue, tagsCode from the marker's sink and batch."""
    store.register_system_topic(SINK_COMMIT_TOPIC, 1, marker_tags_code)


class Sink:
    """Stage and commit batches of rows for one sink id (see the module docstring)."""

    def __init__(self, store, sink_id: str, group: str = "rmq-sink", *,
                 commit: str = "index") -> None:
        if commit not in COMMIT_MODES:
            raise InvalidMessageError(f"sink commit {commit!r}; allowed: one of "
                                      f"{', '.join(COMMIT_MODES)}")
        self.store = store
        self.sink_id = validate_sink_id(sink_id)
        self.group = validate_group(group)
        self.commit_mode = commit

    # ------------------------------------------------------------------ staging
    def stage(self, data, *, topic: str | None = None) -> list[str]:
        """Validate and stage rows (a table as for ``send_table``, or for ``replace_table``
        with a ``key`` column: each row replaces its key's pending message when the batch
        commits); return the halves' ids."""
        return self._stage(data, topic)

    def stage_prepared(self, rows) -> list[str]:
        """Stage rows already validated by :func:`~store.produce.table_rows.prepare_rows` (a store
        group validates every member's share before any member writes)."""
        return self._stage(rows, None)

    def _stage(self, rows, topic: str | None) -> list[str]:
        """Each half one chunk of the producer's: its rows encoded into the half (queues
        chosen in order, on this thread: a delayed row's routing names its real queue; topics
        are created by the commit: a batch that never commits leaves none)."""
        store = self.store
        if self.commit_mode == "index":
            return self._stage_note(rows, topic)

        def make(chunk):  # on either of two threads (see store.core.pipeline)
            props = self._half_properties(chunk.rows)
            return framed_half(store, chunk, props), props[PROPERTY_TRANSACTION_ID]

        return append_table_chunks(store, rows, make, topic=topic, create_topics=False,
                                   bounds=lambda prepared: half_bounds(prepared, store))

    def _stage_note(self, rows, topic: str | None) -> list[str]:
        """Stage the rows as records (:func:`~store.sink.staging.stage_rows`), then the
        notes listing them with their columns, each within the size of a half (a crash
        between leaves records no note names: never visible)."""
        store = self.store
        done = stage_rows(store, rows, topic=topic)
        if not done.rows:
            return []
        file_size, budget = store.config.commitlog_file_size_bytes, half_budget(store)
        parts = [staged_runs(done.columns, file_size)]
        if not note_fits(parts[0], done.topics, budget):  # (several notes: cut by rows)
            parts = [staged_runs(sliced_columns(done.columns, lo, hi), file_size)
                     for lo, hi in note_bounds(done.columns, done.topics, budget, file_size)]
        specs = []
        for part in parts:
            props = self._properties(done.topics[0], len(part))
            specs.append(RecordSpec(topic=TRANS_HALF_TOPIC, body=encode_note(part, done.topics),
                                    properties=props, queue_id=HALF_QUEUE_ID,
                                    born_timestamp_ms=store.now_ms()))
        store.append(specs)
        return [spec.properties[PROPERTY_TRANSACTION_ID] for spec in specs]

    def _half_properties(self, part) -> dict[str, str]:
        """The properties of a new half holding the rows ``part`` (a fresh transaction id)."""
        return self._properties(part.topic_names[int(part.topic_ids[0])], len(part))

    def _properties(self, topic: str, rows: int) -> dict[str, str]:
        """The properties of a new half of ``rows`` rows, the first of ``topic``."""
        return {PROPERTY_TRANSACTION_ID: new_transaction_id(self.sink_id),
                PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: self.group,
                PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: "0",
                PROPERTY_SINK: self.sink_id, PROPERTY_SINK_ROWS: str(rows)}

    # ------------------------------------------------------------------ committing
    def commit(self, batch_id: int, transactions: Iterable[str]) -> SinkCommit:
        """Commit batch ``batch_id`` made of the staged halves ``transactions`` (see the
        module docstring); idempotent per ``(sink, batch_id)``.

        Raises
        ------
        SinkCommitError
            A listed half is not open (rolled back by a concurrent writer of the same sink,
            discarded by the check loop, or not a half of this sink); nothing is written.
        """
        if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
            raise InvalidMessageError(f"batch id {batch_id!r}; allowed: an int >= 0")
        listed = list(dict.fromkeys(transactions))
        store = self.store
        transactions = store.transactions
        with paused_gc(), store.atomic_append():
            open_rows = self._open_rows(transactions)
            marker = self._marker(batch_id)
            replayed = marker is not None
            if replayed:
                commit = [tx for tx in marker["transactions"] if tx in open_rows]
            else:
                missing = [tx for tx in listed if tx not in open_rows]
                if missing:
                    raise SinkCommitError(
                        f"sink {self.sink_id!r} batch {batch_id}: {len(missing)} of its "
                        f"{len(listed)} staged halves are no longer open (first: "
                        f"{missing[0]}); they were rolled back by another writer with the same "
                        "sink id or discarded by the transaction check loop (a batch must "
                        "commit within transaction_check_max check rounds); nothing of the "
                        "batch was committed, re-run it")
                commit = listed
            chosen = set(commit)
            stray = [tx for tx in open_rows if tx not in chosen]
            if stray:  # a marker may list some (a commit torn by a reboot): finish those
                listed_before = self._listed_by_markers()
                commit += [tx for tx in stray if tx in listed_before]
                chosen = set(commit)
            rollback = [tx for tx in open_rows if tx not in chosen]
            now = store.now_ms()
            if not replayed:
                store.append([self._marker_spec(batch_id, listed, now)])
            ended = [open_rows[tx] for tx in commit + rollback]
            rows = self._commit_halves(transactions, [open_rows[tx] for tx in commit],
                                       ended, now)
        if ended:
            transactions.mark_ended(ended)
        return SinkCommit(rows=rows, halves=len(commit), rolled_back=len(rollback),
                          replayed=replayed)

    def abort(self) -> int:
        """Roll back every open half of this sink (a failed batch); return how many."""
        store = self.store
        transactions = store.transactions
        with store.write_lock():
            open_rows = self._open_rows(transactions)
            if not open_rows:
                return 0
            self._end_halves(transactions, list(open_rows.values()), store.now_ms())
            transactions.mark_ended(list(open_rows.values()))
        return len(open_rows)

    def committed_batches(self) -> dict[int, dict]:
        """Every committed batch of this sink still in the store: batch id -> marker fields."""
        return {m["batch"]: m for m in self._markers(None)}

    def open_halves(self) -> list[str]:
        """Transaction ids of this sink's halves that are still open."""
        return list(self._open_rows(self.store.transactions))

    # ------------------------------------------------------------------ internals
    def _end_halves(self, transactions, rows: list[int], now: int) -> None:
        """Append the op messages ending the halves of index ``rows`` (their newest copies);
        the caller holds the write lock and marks the rows ended once the append landed."""
        if rows:
            offsets = sorted(transactions.latest_half_offsets(rows))
            self.store.append(op_specs(offsets, now, HALF_QUEUE_ID), batch=True)

    def _open_rows(self, transactions) -> dict[str, int]:
        """This sink's open halves: transaction id -> index row (the index read first)."""
        return transactions.open_rows_with_prefix(transaction_prefix(self.sink_id))

    def _marker_spec(self, batch_id: int, transactions: list[str], now: int) -> RecordSpec:
        key = sink_key(self.sink_id)
        body = encode_marker(self.sink_id, batch_id, transactions)
        return RecordSpec(topic=SINK_COMMIT_TOPIC, body=body, queue_id=0, born_timestamp_ms=now,
                          properties={PROPERTY_TAGS: key, PROPERTY_KEYS: f"{key}:{batch_id}",
                                      PROPERTY_SINK: self.sink_id,
                                      PROPERTY_SINK_BATCH: str(batch_id)})

    def _markers(self, batch_id: int | None) -> list[dict]:
        """Markers of this sink (of one batch when ``batch_id`` is given), read through the
        marker queue's tagsCodes (only matching records are decoded)."""
        store = self.store
        limit = store.confirmed_offset()
        cq = store.consume_queue(SINK_COMMIT_TOPIC, 0)
        lo = cq.min_offset(store.commit_log.min_offset(), limit)
        hi = cq.max_offset(limit)
        out = []
        for start in range(lo, hi, _MARKER_CHUNK):
            entries = cq.entries(start, min(hi, start + _MARKER_CHUNK))
            codes = entries["tags_code"].astype(np.int64)
            if batch_id is None:
                hit = (codes >> 32) == sink_code(self.sink_id)
            else:
                hit = codes == marker_code(self.sink_id, batch_id)
            for off in entries["offset"][hit].tolist():
                try:
                    record = store.read_record(int(off))
                except CorruptRecordError:
                    continue  # removed by retention
                data = decode_marker(record.body)
                if data is not None and data["sink"] == self.sink_id and (
                        batch_id is None or data["batch"] == batch_id):
                    out.append(data)
        return out

    def _marker(self, batch_id: int) -> dict | None:
        found = self._markers(batch_id)
        return found[0] if found else None

    def _listed_by_markers(self) -> set[str]:
        return {tx for m in self._markers(None) for tx in m["transactions"]}

    def _commit_halves(self, transactions, rows: list[int], ended: list[int],
                       now: int) -> int:
        """Make the rows of the halves ``rows`` (index rows) visible, end the halves
        ``ended`` and return how many rows: framed halves' rows copied into their real
        topics (COMMIT records whose PREPAREDTRANSACTIONOFFSET is their half's), then the
        ops, then one index-commit marker of the stage notes' ranges (last: see
        :mod:`store.core.index_commit`).  The caller holds an atomic group."""
        store = self.store
        total, group, count = 0, [], 0
        notes: list[StagedRuns] = []
        walk: list[tuple[int, int]] = []  # (earlier versions' notes: their records are read)
        topics: dict[str, None] = {}
        for row in rows:
            clog = transactions.latest_clog(row)
            props, body, _ = half_view(store, clog)
            if props.get(PROPERTY_SINK) != self.sink_id:
                raise SinkCommitError(
                    f"transaction {transactions.transaction_id(row)} at CommitLog offset "
                    f"{clog} is not a half of sink {self.sink_id!r}")
            if is_note(body):
                staged, ranges, names = decode_note(body, store.commit_log.directory, clog)
                if staged is None:
                    walk += ranges
                else:
                    notes.append(staged)
                topics.update(dict.fromkeys(names))
                continue
            table = decode_staged(body, store.commit_log.directory, clog)
            group.append((table, clog))
            count += table.num_rows
            if count >= COMMIT_GROUP_ROWS:
                total += append_staged(store, group)
                group, count = [], 0
        if group:
            total += append_staged(store, group)
        self._end_halves(transactions, ended, now)
        for topic in topics:  # (also of rows only delayed so far)
            store.ensure_topic(topic)
        if walk:
            walk.sort()
            notes.append(staged_runs(walk_staged(store, walk),
                                     store.config.commitlog_file_size_bytes))
        if notes:
            total += commit_placed(store, merged_runs(notes), born_timestamp_ms=now).rows
        return total


def settle_check_views(store, views) -> None:
    """The check loop's answer for sink halves: commit those a marker lists (a commit a
    reboot tore), leave the others open (their sink's next commit or abort ends them)."""
    sinks = {}
    for view in views:
        sink_id = view.system_properties.get(PROPERTY_SINK) or view.properties.get(PROPERTY_SINK)
        if sink_id and is_sink_transaction(view.transaction_id):
            sinks.setdefault(sink_id, []).append(view.transaction_id)
    for sink_id, txs in sinks.items():
        sink = Sink(store, sink_id)
        listed = sink._listed_by_markers()
        if any(tx in listed for tx in txs):
            _finish_listed(sink, listed)


def _finish_listed(sink: Sink, listed: set[str]) -> None:
    """Commit the open halves of ``sink`` that a marker lists (nothing else changes); the
    caller (the check round) holds the write lock, so ``listed`` is current."""
    store = sink.store
    transactions = store.transactions
    with store.atomic_append():
        open_rows = sink._open_rows(transactions)
        rows = [row for tx, row in open_rows.items() if tx in listed]
        sink._commit_halves(transactions, rows, rows, store.now_ms())
    transactions.mark_ended(rows)


def sink_retention_floor(store) -> int | None:
    """The lowest CommitLog offset an open stage note of any sink lists (its staged records
    lie before the note, which the transaction service's floor keeps): a retention guard.
    A note that cannot be read (removed, damaged) keeps nothing."""
    transactions = store.transactions
    floor = None
    for row in transactions.open_rows_with_prefix(SINK_TX_PREFIX.encode("ascii")).values():
        clog = transactions.latest_clog(row)
        try:
            _, body, _ = half_view(store, clog)
            if not is_note(body):
                continue
            ranges = note_ranges(body, store.commit_log.directory, clog)
        except CorruptRecordError:
            continue
        if ranges:
            low = min(a for a, _ in ranges)
            floor = low if floor is None else min(floor, low)
    return floor
