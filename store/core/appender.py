"""The append path: the :class:`Appender` owns the write state and puts records into the CommitLog.

Order of one append, for crash safety: mark ``write_in_progress``, write the records (one
``pwrite`` per segment), ``fsync`` when SYNC_FLUSH, dispatch the queue entries (the one
:class:`~store.core.queue_dispatch.Dispatcher`), publish ``confirm_phy_offset``, clear the mark.
Readers never look past the confirmed offset.

Three ways in, one way down (:meth:`Appender.commit`):

* :meth:`Appender.append`: :class:`~store.formats.record_codec.RecordSpec` objects, any topics (sends, ops,
  transaction commits, timer rolls);
* :meth:`Appender.append_encoded`: records given as columns (headers as one NumPy array,
  bodies and properties as byte pieces) for any topics and queues: the vectorised path of
  batches and of the restore of delayed messages;
* :meth:`Appender.append_batch`: records of one topic and queue, encoded with NumPy and
  appended through :meth:`append_encoded`.

Every method here runs with the store's write lock held (the caller, :class:`StoreCore`, takes
it).

Several appends can form one **atomic group** (:meth:`Appender.atomic_group`): the mark is set
once before the first and cleared, with ``confirm_phy_offset`` published, only after the last.
Readers see none of the group until then, and a crash anywhere inside it (of this process:
the next writer's recovery cuts back to the mark) or an exception drops the whole group.
"""

from __future__ import annotations

import itertools
import random
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

import numpy as np

from ..formats import record_codec as codec
from ..formats.record_codec import (BLANK, FIXED_SIZE, LOCALHOST, MESSAGE_MAGIC_CODE_V1, STORE_PORT,
                             RecordSpec, encode_blank, whole_record_layout)
from ..base.crc import crc32
from ..base.errors import (
    InvalidMessageError,
    LeaderDeposedError,
    MessageTooLargeError,
    ReplicaWriterError,
)
from ..files.replication_state import writer_refusal
from ..formats.byte_columns import ByteColumn
from ..formats.message import is_valid_topic_name
from .append_types import (AppendResult, AppendTarget, AssembledRecords, BatchAppendResult,
                           EncodedAppend, EncodedRecords, OneRecord, Presume, SingleAppend)
from .queue_dispatch import QueueEntries, is_dispatched
from .queue_groups import QueueGroups
from .write_placement import (Allocate, assemble_unplaced, batch_template, patch_placed,
                            place_batch, placed_writes)

_new_tuple = tuple.__new__  # a NamedTuple without its __new__'s keyword handling


def round_robin_start() -> int:
    """Where a topic's round robin starts in a process: at a random queue, as a RocketMQ
    producer's, so that processes that each send a little (Spark tasks, a sink's commit per
    micro-batch) spread over the queues instead of all filling queue 0 (tests pin it)."""
    return random.randrange(1 << 30)


class Appender:
    """The write state of one open store: log end, queue ends, round robin (lock held)."""

    def __init__(self, core: AppendTarget) -> None:
        self.core = core
        self.config = core.config
        self.write_offset = 0
        self.generation = -1
        self.queue_next: dict[tuple[str, int], int] = {}
        self._round_robin: dict[str, itertools.count] = {}
        self._group_start: int | None = None   # where the open atomic group began
        self._group_now: int | None = None
        #: what the open atomic group runs once published (a commit marker's entries)
        self._after: list = []
        #: settings the single-record path reads per append
        self.file_size = self.config.commitlog_file_size_bytes
        #: the largest record a segment takes (a message at the size limit, with room for
        #: properties, and never more than a segment minus its closing blank)
        self.max_record = min(self.config.max_message_size_bytes + 64 * 1024,
                              self.config.commitlog_file_size_bytes - codec.BLANK.size)
        self.max_properties = self.config.max_properties_size_bytes
        self.sync_flush = self.config.flush_disk_type == "SYNC_FLUSH"
        #: ``topic -> queue count`` of the topics this process appended single records to
        #: (topics without a tagsCode rule; forgotten when a rule is registered)
        self._plain_topics: dict[str, int] = {}
        #: Why this process may not append (a replica set's leader whose writes only its
        #: server can acknowledge: :func:`~store.files.replication_state.writer_refusal`;
        #: its server clears it), ``None`` when it may.
        self.refusal: str | None = writer_refusal(core.root)
        #: Why this process's own writes are refused now (a replica set's server while its
        #: replica does not lead: set and cleared under the append lock at each change of
        #: role), ``None`` when they are not; a follower's copies of its leader's log
        #: (:meth:`commit` with ``copy``) are appended all the same.
        self.not_leading: str | None = None
        #: A worker process of a replica's gRPC endpoint (:mod:`store.proxy.processes`):
        #: called where :attr:`not_leading` is read, it raises
        #: :class:`~store.base.errors.LeaderDeposedError` unless the replica leads, as its
        #: server publishes it (:mod:`store.files.replica_role`); ``None`` elsewhere.
        self.lead_check = None

    # ------------------------------------------------------------------ atomic groups
    @contextmanager
    def atomic_group(self) -> Iterator[None]:
        """Make every append inside the block one all-or-nothing unit (see the module doc).

        Nested groups join the outer one.  On an exception the records appended inside the
        group are cut (CommitLog and queues, as recovery would) and the error propagates.
        """
        if self._group_start is not None:
            yield
            return
        cp = self.core.checkpoint
        start = self.write_offset
        cp.set("write_in_progress", start)
        cp.set("last_append_offset", start)
        self._group_start, self._group_now = start, None
        try:
            yield
        except BaseException:
            self._group_start = None
            self._after = []
            self.core.drop_tail(start)
            if cp.get("index_commit_pending") >= start:
                cp.set("index_commit_pending", 0)
            raise
        self._group_start = None
        if self._group_now is not None:
            self._publish(self._group_now)
        else:
            cp.set("write_in_progress", -1)
        after, self._after = self._after, []
        for action in after:
            action()

    def after_publish(self, marker: int, action) -> None:
        """Run ``action`` once the open atomic group is published, with the checkpoint's
        ``index_commit_pending`` set to ``marker`` until then (see
        :mod:`store.core.index_commit`: a writer that dies between publishing and the
        action leaves it set, and the next writer redoes the action).  One marker per
        group."""
        if self._group_start is None:
            raise InvalidMessageError("after_publish needs an open atomic group")
        cp = self.core.checkpoint
        if self._after:
            raise InvalidMessageError("one commit marker per atomic group; allowed: commit "
                                      "the staged ranges of a group with one marker")
        cp.set("index_commit_pending", marker)
        self._after.append(action)

    @property
    def in_group(self) -> bool:
        return self._group_start is not None

    # ------------------------------------------------------------------ state
    def catch_up(self, force: bool = False) -> bool:
        """Take over what other processes appended since this one last did; True if any."""
        cp = self.core.checkpoint
        generation = cp.get("write_generation")
        if not force and generation == self.generation:
            return False
        self.generation = generation
        self.write_offset = cp.get("confirm_phy_offset")
        self.queue_next.clear()
        return True

    def next_queue(self, topic: str, queue_count: int) -> int:
        """The next queue of ``topic`` in this process's round robin (see
        :func:`round_robin_start`)."""
        counter = self._round_robin.get(topic) or self._round_robin.setdefault(
            topic, itertools.count(round_robin_start()))
        return next(counter) % queue_count

    def next_queue_offset(self, key: tuple[str, int]) -> int:
        nxt = self.queue_next.get(key)
        if nxt is None:
            nxt = self.core.consume_queue(*key).max_offset(self.write_offset)
            self.queue_next[key] = nxt
        return nxt

    def _queue_id(self, topic: str, queue_id: int | None) -> int:
        count = self.core.ensure_topic(topic)
        if queue_id is None:
            return self.next_queue(topic, count)
        if not 0 <= queue_id < count:
            raise InvalidMessageError(
                f"queue_id {queue_id} for topic {topic!r}; allowed: 0 to {count - 1}")
        return queue_id

    # ------------------------------------------------------------------ specs
    def append(self, specs: Sequence[RecordSpec], *, batch: bool) -> list[AppendResult]:
        """Append records given as specs (see :meth:`StoreCore.append`)."""
        cfg = self.config
        dispatcher = self.core.dispatcher
        now = self.core.now_ms()
        offset = self.write_offset
        pieces: list[tuple[int, bytes]] = []  # (offset, bytes), blanks included
        results: list[AppendResult] = []
        rows: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
        pending_next: dict[tuple[str, int], int] = {}
        max_record = self.max_record

        sized = []
        for spec in specs:
            topic_b = spec.topic.encode("ascii")
            props_b = codec.encode_properties(spec.properties)
            if len(props_b) > cfg.max_properties_size_bytes:
                raise MessageTooLargeError(
                    f"properties of a message to {spec.topic!r} are {len(props_b)} bytes; "
                    f"allowed: at most {cfg.max_properties_size_bytes}")
            size = codec.record_size(len(spec.body), len(topic_b), len(props_b))
            if size > max_record:
                raise MessageTooLargeError(
                    f"a record of {size} bytes does not fit (max {max_record})")
            sized.append((spec, topic_b, props_b, size))

        if batch:  # move the whole batch to the next file when it would cross the boundary
            total = sum(s[3] for s in sized)
            if total + codec.BLANK.size <= cfg.commitlog_file_size_bytes:
                start, blank = self.core.commit_log.place(offset, total)
                if blank is not None:
                    pieces.append((offset, blank))
                    offset = start

        for spec, topic_b, props_b, size in sized:
            start, blank = self.core.commit_log.place(offset, size)
            if blank is not None:
                pieces.append((offset, blank))
            qid = self._queue_id(spec.topic, spec.queue_id)
            key = (spec.topic, qid)
            dispatched = is_dispatched(spec.sys_flag)
            if dispatched:
                qoff = pending_next.get(key)
                if qoff is None:
                    qoff = self.next_queue_offset(key)
                pending_next[key] = qoff + 1
            else:
                qoff = 0  # PREPARED and ROLLBACK records are never indexed
            data = codec.encode_record(spec, queue_id=qid, queue_offset=qoff, physical_offset=start,
                                       store_timestamp_ms=now, topic_bytes=topic_b,
                                       properties_bytes=props_b)
            pieces.append((start, data))
            if dispatched:
                code = dispatcher.tags_code(spec.topic, spec.properties, now)
                rows.setdefault(key, []).append((qoff, start, size, code))
            results.append(AppendResult(spec.topic, qid, qoff, start, size, now))
            offset = start + size

        entries: QueueEntries = {}
        for key, queue_rows in rows.items():
            _, offsets, sizes, codes = zip(*queue_rows)
            entries[key] = (queue_rows[0][0], offsets, sizes, codes)
        self.commit(self._join_pieces(pieces), entries, offset, now)
        self.queue_next.update(pending_next)
        return results

    def _join_pieces(self, pieces: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """Join contiguous ``(offset, bytes)`` pieces into one chunk per segment."""
        size = self.config.commitlog_file_size_bytes
        chunks: list[tuple[int, bytes]] = []
        run_start, run, run_end = 0, [], 0
        for off, data in pieces:
            if run and (off != run_end or off // size != run_start // size):
                chunks.append((run_start, b"".join(run)))
                run = []
            if not run:
                run_start = off
            run.append(data)
            run_end = off + len(data)
        if run:
            chunks.append((run_start, b"".join(run)))
        return chunks

    # ------------------------------------------------------------------ columns
    def append_batch(self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes], *,
                     tags: Sequence[str | None] | None, flags, born_timestamp_ms: int,
                     queue_id: int | None, sys_flag: int, born_host: bytes,
                     born_port: int) -> BatchAppendResult:
        """Records of one topic to one queue (see :meth:`StoreCore.append_batch`)."""
        n = len(bodies)
        # what every record shares (BODYCRC: computed by the record kernel)
        headers = np.repeat(batch_template(sys_flag, bytes(born_host), born_port), n)
        headers["born_timestamp"] = born_timestamp_ms
        headers["flag"] = flags
        body_column = ByteColumn.of(bodies)  # the lengths are taken once, here
        props_column = ByteColumn.of(properties)
        headers["body_length"] = body_column.lengths()
        dispatched = is_dispatched(sys_flag)
        codes = (self.core.dispatcher.tag_hashes(tags) if dispatched and tags is not None
                 else np.zeros(n, dtype=np.int64))
        queue_ids = np.zeros(n, dtype=np.int64)
        records = EncodedRecords(
            headers=headers, bodies=body_column, properties=props_column,
            properties_length=props_column.lengths(), topics=[topic],
            topic_ids=np.zeros(n, dtype=np.int64), queue_ids=queue_ids, tags_codes=codes)
        sizes = self._sizes(records)  # refuse before the topic is created
        queue_ids[:] = self._queue_id(topic, queue_id)
        placed = self.append_encoded(records, sizes=sizes)
        qid = int(queue_ids[0])
        first = int(placed.queue_offsets[0]) if dispatched else -1
        return BatchAppendResult(topic, qid, first, placed.commitlog_offsets, placed.sizes,
                                 placed.store_timestamp_ms)

    def _sizes(self, records: EncodedRecords) -> np.ndarray:
        """Each record's size; :class:`MessageTooLargeError` when one breaks a limit."""
        limit = self.config.max_properties_size_bytes
        props_len = np.asarray(records.properties_length, dtype=np.int64)
        if len(props_len) and int(props_len.max()) > limit:
            raise MessageTooLargeError(
                f"properties of a record are {int(props_len.max())} bytes; allowed: at most "
                f"{limit}")
        topic_len = np.array([len(t) for t in records.topics], dtype=np.int64)
        sizes = (codec.FIXED_SIZE + records.headers["body_length"].astype(np.int64)
                 + topic_len[np.asarray(records.topic_ids, dtype=np.int64)] + props_len)
        if len(sizes) and int(sizes.max()) > self.max_record:
            raise MessageTooLargeError(
                f"a record of {int(sizes.max())} bytes does not fit (max {self.max_record})")
        return sizes

    def append_encoded(self, records: EncodedRecords, *,
                       sizes: np.ndarray | None = None) -> EncodedAppend:
        """Place, finish, write and index records given as columns (see :class:`EncodedRecords`).

        ``sizes``: the records' sizes when the caller already checked them with
        :meth:`_sizes`.
        """
        return self.append_assembled(self.assemble(records, sizes=sizes))

    def assemble(self, records: EncodedRecords, *, sizes: np.ndarray | None = None,
                 allocate: Allocate | None = None, presume: Presume | None = None
                 ) -> AssembledRecords:
        """Encode records for :meth:`append_assembled` (no lock; may raise
        :class:`MessageTooLargeError`); ``allocate``: see :func:`assemble_unplaced`;
        ``presume``: see :data:`~store.core.append_types.Presume`."""
        if sizes is None:
            sizes = self._sizes(records)
        dispatched = is_dispatched(int(records.headers["sys_flag"][0]))
        presumed = presume(records, sizes) if presume is not None else None
        return assemble_unplaced(records, sizes, dispatched, allocate, presumed)

    def append_assembled(self, records: AssembledRecords) -> EncodedAppend:
        """Place, patch, write and index assembled records (see :class:`AssembledRecords`).

        The steps: each record's queue id within its topic's queues; the records grouped by
        queue; each record's queue offset (its queue's end, in record order); the CommitLog
        placement; the four placement fields written (unless the chunk was encoded for
        exactly this placement); then :meth:`commit` with the queue entries.
        """
        qids = self._queue_ids_in_range(records)
        now = records.store_timestamp_ms
        if now is None:
            now = self.core.now_ms()
        groups = QueueGroups.of(records, qids)
        dispatched = records.dispatched
        firsts = (np.array([self.next_queue_offset(k) for k in groups.keys], dtype=np.int64)
                  if dispatched else None)
        queue_offsets = groups.queue_offsets(firsts)
        sizes = records.sizes
        starts, runs, end = place_batch(self.core.commit_log,
                                        self.config.commitlog_file_size_bytes,
                                        self.write_offset, sizes)
        if not self._placed_as_presumed(records, groups, firsts, now):
            patch_placed(records, qids, queue_offsets, starts, now)
        entries = groups.entries(firsts, starts, sizes, records.tags_codes) if dispatched else {}
        self.commit(placed_writes(records, runs), entries, end, now)
        if dispatched:
            for g, key in enumerate(groups.keys):
                self.queue_next[key] = int(firsts[g] + groups.counts[g])
        return EncodedAppend(qids, queue_offsets, starts, sizes, now)

    def _queue_ids_in_range(self, records: AssembledRecords) -> np.ndarray:
        """The records' queue ids, an id outside its topic's queues taken modulo their count
        (missing topics are created; a name no record uses and no topic can have, left in
        the list by a damaged record dropped on the way, is not: the topic table refuses it).
        Records without queue entries (staged ones) create no topic: their commit does."""
        used = np.zeros(len(records.topics), dtype=bool)
        used[records.topic_ids] = True
        count_of = self.core.ensure_topic if records.dispatched else self.core.queue_count_for
        counts = np.array([count_of(t)
                           if used[i] or is_valid_topic_name(t) else np.iinfo(np.int64).max
                           for i, t in enumerate(records.topics)], dtype=np.int64)
        qids = records.queue_ids
        if int(qids.min()) < 0 or int(qids.max()) >= int(counts.min()):
            count = counts[records.topic_ids]
            qids = np.where((qids >= 0) & (qids < count), qids, qids % count)
        return qids

    def _placed_as_presumed(self, records: AssembledRecords, groups: QueueGroups,
                            firsts: np.ndarray | None, now: int) -> bool:
        """Whether the records were encoded for the placement they get (see
        :mod:`store.core.placement_chain`): one queue, presumed for this log end, this
        queue offset (-1 for staged records: not indexed) and this store time."""
        pre = records.presumed
        first = codec.STAGED_QUEUE_OFFSET if firsts is None else firsts[0]
        return (pre is not None and groups.order is None
                and pre.log_end == self.write_offset and pre.key == groups.keys[0]
                and pre.queue_first == first and pre.store_timestamp_ms == now)

    # ------------------------------------------------------------------ one record
    def prepare_one(self, topic: str, body: bytes, properties: bytes, tags: str | None,
                    flag: int, born_timestamp_ms: int, queue_id: int | None) -> OneRecord:
        """Check and lay out one plain record, without the write lock (the single send's path).

        Everything that needs no lock is done here: the size limits, the body CRC (C), the
        tagsCode, the record's ``struct`` layout and the topic's queue count (a missing topic
        is created, under the lock, the first time).  :meth:`append_one` does the rest.
        """
        topic_bytes = topic.encode("ascii")
        body_length, topic_length, props_length = len(body), len(topic_bytes), len(properties)
        if props_length > self.max_properties:
            raise MessageTooLargeError(
                f"properties of a message to {topic!r} are {props_length} bytes; allowed: at "
                f"most {self.max_properties}")
        size = FIXED_SIZE + body_length + topic_length + props_length
        if size > self.max_record:
            raise MessageTooLargeError(
                f"a record of {size} bytes does not fit (max {self.max_record})")
        count = self._plain_topics.get(topic)
        if count is None:
            count = self._plain_topic(topic)
        if queue_id is not None and not 0 <= queue_id < count:
            raise InvalidMessageError(
                f"queue_id {queue_id} for topic {topic!r}; allowed: 0 to {count - 1}")
        return _new_tuple(OneRecord, (
            topic, topic_bytes, body, properties,
            whole_record_layout(body_length, topic_length, props_length), size,
            crc32(body) & 0x7FFFFFFF, self.core.dispatcher.tag_hash(tags), flag,
            born_timestamp_ms, count, queue_id))

    def _plain_topic(self, topic: str) -> int:
        """The queue count of a topic met by :meth:`prepare_one` for the first time (created
        when missing); a topic whose tagsCode has a rule is refused."""
        if self.core.dispatcher.has_rule(topic):
            raise InvalidMessageError(
                f"append_one cannot index {topic!r} (its tagsCode comes from its "
                "properties); use append()")
        count = self._plain_topics[topic] = self.core.ensure_topic(topic)
        return count

    def forget_plain_topics(self) -> None:
        """Check every topic for a tagsCode rule again (a rule was just registered)."""
        self._plain_topics.clear()

    def append_one(self, one: OneRecord) -> SingleAppend:
        """Place, pack, write and dispatch a record of :meth:`prepare_one` (lock held): one
        ``struct.pack`` of the whole record, one write (two when the segment's rest must
        become a blank first), one ConsumeQueue entry."""
        (topic, topic_bytes, body, properties, layout, size, body_crc, tags_code, flag,
         born_timestamp_ms, queue_count, queue_id) = one  # (one unpack: cheaper than fields)
        qid = self.next_queue(topic, queue_count) if queue_id is None else queue_id
        now = self.core.now_ms()
        offset = self.write_offset
        key = (topic, qid)
        queue_offset = self.queue_next.get(key)
        if queue_offset is None:
            queue_offset = self.next_queue_offset(key)
        blank_at = -1
        remaining = self.file_size - offset % self.file_size
        if size + BLANK.size > remaining:  # the rest of the segment is a blank
            blank_at = offset
            offset += remaining
        record = layout.pack(
            size, MESSAGE_MAGIC_CODE_V1, body_crc, qid, flag, queue_offset, offset, 0,
            born_timestamp_ms, LOCALHOST, 0, now, LOCALHOST, STORE_PORT, 0, 0, len(body), body,
            len(topic_bytes), topic_bytes, len(properties), properties)
        self._begin()
        if blank_at >= 0:
            self.core.commit_log.write(blank_at, encode_blank(remaining))
        self.core.commit_log.write(offset, record)
        self._sync()
        self.core.dispatcher.dispatch_one(key, queue_offset, offset, size, tags_code)
        self._advance(offset + size, now)
        self.queue_next[key] = queue_offset + 1
        return _new_tuple(SingleAppend, (qid, queue_offset, offset, now))

    # ------------------------------------------------------------------ the one way down
    def commit(self, chunks: Iterable[tuple[int, bytes]], entries: QueueEntries, end: int,
               now: int, *, copy: bool = False) -> None:
        """Write CommitLog chunks, dispatch queue entries, then make them visible.

        ``chunks`` are ``(offset, bytes)`` writes (any iterable: each is written before the
        next is taken), each inside one segment; ``entries`` are the queue entries (see
        :data:`~store.core.queue_dispatch.QueueEntries`), or a function returning them once the
        chunks are written (entries read from what was written); ``end`` is where the log ends
        afterwards.
        Crash safety: mark the append, write, sync (SYNC_FLUSH), write the queue entries, then
        publish (the message-key index follows behind: :mod:`store.core.key_index`).
        ``copy``: the chunks are a follower's copy of its leader's log (taken while its own
        writes are refused, :attr:`not_leading`).
        """
        self._begin(copy)
        for off, data in chunks:
            self.core.commit_log.write(off, data)
        self._sync()
        self.core.dispatcher.dispatch(entries() if callable(entries) else entries)
        self._advance(end, now)

    def _begin(self, copy: bool = False) -> None:
        """Mark an append in progress (an atomic group has marked its start already), unless
        this process may not append (:attr:`refusal`), or its replica does not lead and this
        is not a copy of the leader's log (:attr:`not_leading`): then nothing is written.

        The role is checked here, under the append lock a change of role takes too, and not
        only where a request comes in: a write let in while its replica led could otherwise
        wait for the lock behind the change of role and be appended by a follower (and
        acknowledged, a follower waiting for no copies), in the tail its new leader's
        history cuts."""
        if self.refusal is not None:
            raise ReplicaWriterError(self.refusal)
        if self.not_leading is not None and not copy:
            raise LeaderDeposedError(self.not_leading)
        if self.lead_check is not None and not copy:
            self.lead_check()
        if self._group_start is None:
            self.core.checkpoint.begin_append(self.write_offset)

    def _sync(self) -> None:
        """With SYNC_FLUSH, make what was just written durable before it is indexed."""
        if self.sync_flush:
            self.core.commit_log.flush(self.write_offset)

    def _advance(self, end: int, now: int) -> None:
        """Move the log's end to ``end`` and publish it (inside an atomic group: when the
        group ends)."""
        self.write_offset = end
        if self._group_start is not None:
            self._group_now = now
        else:
            self._publish(now)

    def _publish(self, now: int) -> None:
        """Confirm everything appended so far: readers may see it, recovery keeps it."""
        self.generation = self.core.checkpoint.publish_append(now, self.write_offset)
