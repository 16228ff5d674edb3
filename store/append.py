"""Appending records to the CommitLog and indexing them (a part of :class:`MessageStore`).

Order of one append, for crash safety: mark ``write_in_progress``, write the records (one
``pwrite`` per segment), ``fsync`` when SYNC_FLUSH, write the ConsumeQueue entries, publish
``confirm_phy_offset``, clear the mark.  Readers never look past the confirmed offset.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import codec
from .codec import (TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK,
                    RecordSpec)
from .errors import (InvalidMessageError, MessageTooLargeError, StoreClosedError)
from .message import java_string_hash
from .message import (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TAGS, SCHEDULE_TOPIC)
from .message import PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_TIMER_OUT_MS, TIMER_TOPIC


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where one record landed."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class BatchAppendResult:
    """Where the records of :meth:`MessageStore.append_batch` landed.

    Record ``i`` has queue offset ``first_queue_offset + i`` (-1 when not indexed: prepared
    or rolled-back transaction records) and CommitLog offset ``commitlog_offsets[i]``.
    """

    topic: str
    queue_id: int
    first_queue_offset: int
    commitlog_offsets: np.ndarray
    sizes: np.ndarray
    store_timestamp_ms: int


class AppendMixin:
    """The append half of :class:`~store.message_store.MessageStore` (mixed into it)."""

    # ------------------------------------------------------------------ appending
    def append(self, specs: Sequence[RecordSpec], *, batch: bool = False) -> list[AppendResult]:
        """Append records (already validated and rewritten by the producer or a service).

        Queue ids of ``None`` are chosen round robin.  With ``batch``, the records share one
        store time and, when they fit, one segment (RocketMQ moves a batch to the next file
        whole).  Returns where each record landed, in order.
        """
        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.root} was opened read_only; appends are refused")
        if not specs:
            return []
        with self._write_locked():
            return self._append_locked(specs, batch=batch)

    def _append_locked(self, specs: Sequence[RecordSpec], *, batch: bool) -> list[AppendResult]:
        cfg = self.config
        now = self.now_ms()
        offset = self._write_offset
        encoded: list[tuple[int, bytes]] = []  # (offset, bytes) pieces, blanks included
        results: list[AppendResult] = []
        dispatch: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
        pending_next: dict[tuple[str, int], int] = {}
        max_record = cfg.max_message_size_bytes + 64 * 1024

        sized = []
        for spec in specs:
            topic_b = spec.topic.encode("ascii")
            props_b = codec.encode_properties(spec.properties)
            if len(props_b) > cfg.max_properties_size_bytes:
                raise MessageTooLargeError(
                    f"properties of a message to {spec.topic!r} are {len(props_b)} bytes; "
                    f"allowed: at most {cfg.max_properties_size_bytes}")
            size = codec.record_size(len(spec.body), len(topic_b), len(props_b))
            if size > max_record or size + codec.BLANK.size > cfg.commitlog_file_size_bytes:
                raise MessageTooLargeError(
                    f"a record of {size} bytes does not fit "
                    f"(max {min(max_record, cfg.commitlog_file_size_bytes - 8)})")
            sized.append((spec, topic_b, props_b, size))

        if batch:  # move the whole batch to the next file when it would cross the boundary
            total = sum(s[3] for s in sized)
            if total + codec.BLANK.size <= cfg.commitlog_file_size_bytes:
                start, blank = self.commit_log.place(offset, total)
                if blank is not None:
                    encoded.append((offset, blank))
                    offset = start

        for spec, topic_b, props_b, size in sized:
            start, blank = self.commit_log.place(offset, size)
            if blank is not None:
                encoded.append((offset, blank))
            queue_count = self._ensure_topic_cached(spec.topic)
            qid = spec.queue_id
            if qid is None:
                rr = self._round_robin.setdefault(spec.topic, itertools.count())
                qid = next(rr) % queue_count
            elif not 0 <= qid < queue_count:
                raise InvalidMessageError(
                    f"queue_id {qid} for topic {spec.topic!r}; allowed: 0 to {queue_count - 1}")
            key = (spec.topic, qid)
            tx_type = spec.sys_flag & TRANSACTION_TYPE_MASK
            dispatched = tx_type in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
            if dispatched:
                qoff = pending_next.get(key)
                if qoff is None:
                    qoff = self._next_queue_offset(key)
                pending_next[key] = qoff + 1
            else:
                qoff = 0  # PREPARED and ROLLBACK records are never indexed
            data = codec.encode_record(spec, queue_id=qid, queue_offset=qoff, physical_offset=start,
                                       store_timestamp_ms=now, topic_bytes=topic_b,
                                       properties_bytes=props_b)
            encoded.append((start, data))
            if dispatched:
                dispatch.setdefault(key, []).append(
                    (qoff, start, size, self._tags_code(spec.topic, spec.properties, now)))
            results.append(AppendResult(spec.topic, qid, qoff, start, size, now))
            offset = start + size

        entries = {}
        for key, rows in dispatch.items():
            _, offsets, sizes, codes = zip(*rows)
            entries[key] = (rows[0][0], offsets, sizes, codes)
        self._commit_append(self._join_pieces(encoded), entries, offset, now)
        self._queue_next.update(pending_next)
        return results

    def _commit_append(self, chunks: list[tuple[int, bytes]],
                       entries: dict[tuple[str, int], tuple], end: int, now: int) -> None:
        """Write CommitLog chunks and queue entries, then make them visible (lock held).

        ``chunks`` are ``(offset, bytes)`` writes, each inside one segment; ``entries`` maps a
        queue to ``(first queue offset, offsets, sizes, tags codes)``; ``end`` is where the
        log ends afterwards.
        """
        # Crash safety: mark the append, write, (sync), index, then publish.
        cp = self.checkpoint
        cp.set("write_in_progress", self._write_offset)
        cp.set("last_append_offset", self._write_offset)
        for off, data in chunks:
            self.commit_log.write(off, data)
        if self.config.flush_disk_type == "SYNC_FLUSH":
            self.commit_log.flush(self._write_offset)
        for key, (first, offsets, sizes, codes) in entries.items():
            self.consume_queue(*key).put(first, offsets, sizes, codes)
        cp.set("physic_msg_timestamp", now)
        cp.set("confirm_phy_offset", end)
        self._generation = cp.get("write_generation") + 1
        cp.set("write_generation", self._generation)
        cp.set("write_in_progress", -1)
        self._write_offset = end

    def append_batch(self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes], *,
                     tags: Sequence[str | None] | None = None, flags=0,
                     born_timestamp_ms: int = 0, queue_id: int | None = None,
                     sys_flag: int = 0, born_host: bytes = codec.LOCALHOST,
                     born_port: int = 0) -> "BatchAppendResult":
        """Append records of one topic to one queue at once (the vectorised batch path).

        Byte for byte what :meth:`append` with ``batch=True`` writes for the same records, but
        without a :class:`RecordSpec` per record: headers are one NumPy array, each segment
        gets one write, queue entries one block.

        Parameters
        ----------
        topic : str
            A validated topic whose tagsCode comes from the tag (not the schedule or timer
            topic, whose tagsCode comes from properties: use :meth:`append`).
        bodies : sequence of bytes
            The bodies, already validated.
        properties : sequence of bytes
            Each record's encoded properties string (:func:`store.codec.encode_properties`).
        tags : sequence of str or None, optional
            Each record's tag, for the ConsumeQueue tagsCode.
        flags : int or sequence of int
            The records' user flags.
        queue_id : int, optional
            The queue; ``None`` picks the next one round robin.

        Returns
        -------
        BatchAppendResult
            The queue, the first queue offset and each record's CommitLog offset.
        """
        self._check_open()
        if self.read_only:
            raise StoreClosedError(f"store {self.root} was opened read_only; appends are refused")
        if topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            raise ValueError(f"append_batch cannot index {topic!r}; use append()")
        n = len(bodies)
        if n == 0 or len(properties) != n:
            raise ValueError(f"append_batch needs as many properties ({len(properties)}) as "
                             f"bodies ({n}), at least one")
        cfg = self.config
        topic_b = topic.encode("ascii")
        body_lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
        props_lengths = np.fromiter(map(len, properties), dtype=np.int64, count=n)
        if int(props_lengths.max()) > cfg.max_properties_size_bytes:
            i = int(np.argmax(props_lengths > cfg.max_properties_size_bytes))
            raise MessageTooLargeError(
                f"properties of a message to {topic!r} are {int(props_lengths[i])} bytes; "
                f"allowed: at most {cfg.max_properties_size_bytes}")
        sizes = codec.FIXED_SIZE + len(topic_b) + body_lengths + props_lengths
        max_record = min(cfg.max_message_size_bytes + 64 * 1024,
                         cfg.commitlog_file_size_bytes - codec.BLANK.size)
        if int(sizes.max()) > max_record:
            raise MessageTooLargeError(
                f"a record of {int(sizes.max())} bytes does not fit (max {max_record})")
        dispatched = (sys_flag & TRANSACTION_TYPE_MASK) in (TRANSACTION_NOT_TYPE,
                                                             TRANSACTION_COMMIT_TYPE)
        codes = None
        if dispatched:
            codes = np.zeros(n, dtype=np.int64)
            if tags is not None:
                lookup = {t: self._tag_hash(t) for t in set(tags)}
                codes = np.fromiter(map(lookup.__getitem__, tags), dtype=np.int64, count=n)
        with self._write_locked():
            now = self.now_ms()
            queue_count = self._ensure_topic_cached(topic)
            qid = queue_id
            if qid is None:
                qid = next(self._round_robin.setdefault(topic, itertools.count())) % queue_count
            elif not 0 <= qid < queue_count:
                raise InvalidMessageError(
                    f"queue_id {qid} for topic {topic!r}; allowed: 0 to {queue_count - 1}")
            key = (topic, qid)
            first = self._next_queue_offset(key) if dispatched else 0
            starts, runs, end = self._place_batch(self._write_offset, sizes)
            template = codec.batch_header_template(
                queue_id=qid, sys_flag=sys_flag, born_timestamp_ms=born_timestamp_ms,
                born_host=born_host, born_port=born_port, store_timestamp_ms=now)
            queue_offsets = first + np.arange(n, dtype=np.int64) if dispatched else 0
            pieces = codec.encode_batch(template, topic_b, list(bodies), list(properties),
                                        sizes=sizes, body_lengths=body_lengths,
                                        queue_offsets=queue_offsets, physical_offsets=starts,
                                        flags=flags)
            chunks = []
            for off, i, j, blank in runs:
                data = b"".join(pieces[5 * i:5 * j])
                chunks.append((off, data + blank if blank else data))
            entries = {key: (first, starts, sizes, codes)} if dispatched else {}
            self._commit_append(chunks, entries, end, now)
            if dispatched:
                self._queue_next[key] = first + n
        return BatchAppendResult(topic, qid, first if dispatched else -1, starts, sizes, now)

    def _place_batch(self, offset: int, sizes: np.ndarray) -> tuple[np.ndarray, list, int]:
        """Where the records of a batch go when the log ends at ``offset``.

        RocketMQ's rule: a record of length L needs L + 8 bytes left in its segment, else an
        8-byte blank closes the segment; a batch that fits a segment moves to the next one
        whole.  Returns each record's offset, the writes as ``(offset, first, stop, blank)``
        (records ``[first, stop)`` then an optional blank, all in one segment) and the new end.
        """
        file_size = self.config.commitlog_file_size_bytes
        blank_size = codec.BLANK.size
        ends = np.cumsum(sizes)
        total = int(ends[-1])
        runs: list[tuple[int, int, int, bytes]] = []
        if total + blank_size <= file_size:
            start, blank = self.commit_log.place(offset, total)
            if blank is not None:
                runs.append((offset, 0, 0, blank))
            runs.append((start, 0, len(sizes), b""))
            return start + ends - sizes, runs, start + total
        n = len(sizes)
        starts = np.empty(n, dtype=np.int64)
        i, pos = 0, offset
        while i < n:
            segment_end = pos - pos % file_size + file_size
            base = int(ends[i] - sizes[i])
            # records i..j-1 fit when each ends at least 8 bytes before the segment end
            j = int(np.searchsorted(ends, segment_end - blank_size - pos + base, side="right"))
            if j > i:
                starts[i:j] = pos + ends[i:j] - sizes[i:j] - base
                runs.append((pos, i, j, b""))
                pos += int(ends[j - 1]) - base
                i = j
            if i < n:  # the next record does not fit: close the segment with a blank
                runs.append((pos, 0, 0, codec.encode_blank(segment_end - pos)))
                pos = segment_end
        return starts, runs, pos

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

    def _next_queue_offset(self, key: tuple[str, int]) -> int:
        nxt = self._queue_next.get(key)
        if nxt is None:
            nxt = self.consume_queue(*key).max_offset(self._write_offset)
            self._queue_next[key] = nxt
        return nxt

    def _tags_code(self, topic: str, properties, store_ts: int) -> int:
        if topic == SCHEDULE_TOPIC and PROPERTY_DELAY_TIME_LEVEL in properties:
            return self.schedule_deliver_time(int(properties[PROPERTY_DELAY_TIME_LEVEL]), store_ts)
        if topic == TIMER_TOPIC and PROPERTY_TIMER_OUT_MS in properties:
            # ours, not RocketMQ's: the timer's slot time (negated for a cancel marker), so the
            # timer enqueues from the ConsumeQueue alone (see store.timer.service)
            out = int(properties[PROPERTY_TIMER_OUT_MS])
            return -out if PROPERTY_TIMER_DEL_UNIQKEY in properties else out
        return self._tag_hash(properties.get(PROPERTY_TAGS))

    def _tag_hash(self, tags: str | None) -> int:
        """The tagsCode of a tag (0 for none), cached."""
        if not tags:
            return 0
        code = self._tags_code_cache.get(tags)
        if code is None:
            code = java_string_hash(tags)
            if len(self._tags_code_cache) < 65536:
                self._tags_code_cache[tags] = code
        return code

    def schedule_deliver_time(self, level: int, store_ts: int) -> int:
        """RocketMQ's tagsCode of a SCHEDULE_TOPIC_XXXX record: store time + level delay."""
        levels = self.config.delay_levels_ms
        if level <= 0:
            return store_ts + 1000
        return store_ts + levels[min(level, len(levels)) - 1]
