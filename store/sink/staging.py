"""Sink halves as records: staging rows as records, appending halves, committing them.

Helpers of :mod:`store.sink.sink` (format: :mod:`store.sink.staged_format`).

* **Stage** (:func:`framed_half`): the rows of a half are encoded as the very records the
  commit will write (by the producer's :meth:`~store.produce.table_producer.TableChunk.encode`:
  routed, CRCs computed), with a zero magic code, by the compiled record kernel straight
  into the half's framed body (a small big-endian head with each record's topic, queue, tagsCode
  and size, then the records): the half's bytes are written once, then appended.
* **Commit** (:func:`append_staged`): the halves are read back as views of the mapped
  CommitLog segment, their body CRCs checked, and their records copied out, given their
  magic code and PREPAREDTRANSACTIONOFFSET, and placed by the core's columnar append
  (queue ids and offsets, physical offsets, store time): nothing is encoded again.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..formats.record_codec import (
    FIELD_OFFSET,
    FIXED_SIZE,
    HEADER_DTYPE,
    HEADER_SIZE,
    LOCALHOST,
    MESSAGE_MAGIC_CODE_V1,
    STORE_PORT,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    RecordSpec,
    body_crc,
    decode_properties,
    encode_properties,
)
from ..core.append_types import AssembledRecords, EncodedRecords
from ..core.index_commit import StagedColumns
from ..core.placed_commit import joined_columns, staged_runs
from ..formats.message import TRANS_HALF_TOPIC
from ..base.crc import crc32
from ..base.errors import CorruptRecordError, MessageTooLargeError
from ..formats.byte_columns import ByteColumn, one_array
from ..kernels.record_assembly import complete_staged
from .staged_format import STAGED_MAGIC, framed_head
from ..produce.table_producer import append_table_chunks
from ..transaction.half import HALF_QUEUE_ID

#: Part of ``max_message_size_bytes`` a half's rows may fill (the rest: the body's head).
HALF_FILL = 0.9
#: Bytes a delayed row's record may gain by its routing (REAL_TOPIC, REAL_QID, DELAY or
#: TIMER_OUT_MS + TIMER_DELIVER_MS), on top of its topic's length.
_ROUTING_BOUND = 128
_STAGED_AT = np.array([FIELD_OFFSET["magic"], FIELD_OFFSET["prepared_transaction_offset"]],
                      dtype=np.int64)


def framed_half(store, chunk, properties: dict[str, str]) -> AssembledRecords:
    """One sink half holding the records of ``chunk`` (a
    :class:`~store.produce.table_producer.TableChunk` of prepared rows), ready for
    :meth:`append_encoded`; needs no lock.

    The records are those the commit writes (routed, CRCs computed, zero magic
    code), but assembled by the record kernel straight into the half's framed body
    (:mod:`store.sink.staged_format`): no Arrow stream or second record copies them.  The half is
    born at the rows' ``born_ms``, in queue :data:`HALF_QUEUE_ID` of the half topic, with
    ``properties``; :class:`MessageTooLargeError` if it would exceed the largest record.
    """
    topic = TRANS_HALF_TOPIC.encode("ascii")
    props = encode_properties(properties)
    rows = chunk.rows
    keep = _kept_queues(rows)
    half: list = []

    def allocate(records, sizes: np.ndarray) -> np.ndarray:
        prefix, at = framed_head(list(records.topics), records.topic_ids,
                                 np.where(keep, records.queue_ids, -1), records.tags_codes,
                                 sizes)
        total = int(sizes.sum())
        size = FIXED_SIZE + at + total + len(topic) + len(props)
        if size > store.max_record_bytes():
            raise MessageTooLargeError(f"a sink half of {size} bytes does not fit (max "
                                       f"{store.max_record_bytes()})")
        data = np.empty(size, dtype=np.uint8)
        data[HEADER_SIZE:HEADER_SIZE + at] = np.frombuffer(prefix, np.uint8)
        half.append((data, at + total))
        return data[HEADER_SIZE + at:HEADER_SIZE + at + total]

    chunk.encode(sys_flag=TRANSACTION_COMMIT_TYPE, magic=STAGED_MAGIC, allocate=allocate)
    data, body_len = half[0]
    header = _half_header(rows.born_ms, body_len)
    header["total_size"] = len(data)
    header["body_crc"] = crc32(data[HEADER_SIZE:HEADER_SIZE + body_len]) & 0x7FFFFFFF
    header["queue_id"] = HALF_QUEUE_ID
    data[:HEADER_SIZE] = header.view(np.uint8)
    p = HEADER_SIZE + body_len
    data[p] = len(topic)
    data[p + 1:p + 1 + len(topic)] = np.frombuffer(topic, np.uint8)
    p += 1 + len(topic)
    data[p:p + 2] = np.frombuffer(len(props).to_bytes(2, "big"), np.uint8)
    data[p + 2:] = np.frombuffer(props, np.uint8)
    code = store.tags_code(TRANS_HALF_TOPIC, properties, rows.born_ms)
    return AssembledRecords(
        data=data, starts=np.zeros(1, np.int64), sizes=np.array([len(data)], np.int64),
        topics=[TRANS_HALF_TOPIC], topic_ids=np.zeros(1, np.int64),
        queue_ids=np.array([HALF_QUEUE_ID], np.int64), tags_codes=np.array([code], np.int64),
        dispatched=True)


class StagedRows(NamedTuple):
    """What :func:`stage_rows` appended: how many rows, the rows' own topics (the first
    row's first), the records' columns as they were placed (in CommitLog order: what a
    commit needs instead of reading them) and the log's segment size."""

    rows: int
    topics: list
    columns: StagedColumns
    file_size: int

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The CommitLog ranges of the staged records (each inside one segment)."""
        return [(a, b) for a, b in staged_runs(self.columns, self.file_size).ranges.tolist()]


def stage_rows(store, rows, *, topic: str | None = None) -> StagedRows:
    """Append ``rows`` (a table as for ``send_table``, or prepared rows) as staged records
    (:mod:`store.core.index_commit`: in their real topics and queues, invisible until a
    commit marker names them).

    Each chunk of the producer's is encoded (routed, CRCs computed) with the transaction
    type PREPARED and its tagsCodes in PREPAREDTRANSACTIONOFFSET, placed as presumed while
    encoded (:mod:`store.core.placement_chain`) and appended once: the rows are written here
    and never again.  Queues are chosen for every chunk first (a delayed row's routing names
    its real queue).  What each record was placed as (topic, queue id, offset, size,
    tagsCode) is kept from the append, not read back."""

    def make(chunk):  # on either of two threads (see store.core.pipeline)
        part = chunk.rows
        first = part.topic_names[int(part.topic_ids[0])]
        records = chunk.encode(sys_flag=TRANSACTION_PREPARED_TYPE, codes_as_prepared=True)
        # (the columns only: the chunk's bytes are not kept once appended)
        return records, ([first, *(t for t in part.topic_names if t != first)],
                         list(records.topics), records.topic_ids, records.tags_codes)

    placed = append_table_chunks(store, rows, make, topic=topic, create_topics=False,
                                 presume="headers", placements=True)
    columns = joined_columns([
        StagedColumns(names, topic_ids, p.queue_ids, p.commitlog_offsets, p.sizes, codes)
        for (_, names, topic_ids, codes), p in placed])
    return StagedRows(len(columns),
                      list(dict.fromkeys(t for (topics, *_), _ in placed for t in topics)),
                      columns, store.config.commitlog_file_size_bytes)


def half_budget(store) -> int:
    """Bytes of rows (or of a stage note) one sink half holds at most: ``HALF_FILL`` of the
    message size limit, or of half a CommitLog segment when smaller."""
    cfg = store.config
    return int(min(cfg.max_message_size_bytes, cfg.commitlog_file_size_bytes // 2) * HALF_FILL)


def _half_header(born_ms: int, body_len: int) -> np.ndarray:
    """The header fields every half has (one :data:`HEADER_DTYPE` row; the size, CRC and
    placement are filled by whoever writes the record)."""
    header = np.zeros(1, dtype=HEADER_DTYPE)
    header["magic"] = MESSAGE_MAGIC_CODE_V1
    header["born_timestamp"] = born_ms
    header["born_host"] = np.void(LOCALHOST)
    header["store_host"] = np.void(LOCALHOST)
    header["store_port"] = STORE_PORT
    header["body_length"] = body_len
    return header


def _kept_queues(rows) -> np.ndarray:
    """Rows whose staged queue the commit keeps (delayed rows, rows that asked for one);
    the others take the commit's round robin."""
    keep = (rows.levels > 0) | (rows.deliver_ms >= 0)
    if rows.queue_ids is not None:
        keep |= rows.queue_ids >= 0
    return keep


def append_staged(store, group: list) -> int:
    """Commit the staged records of several halves (``(table, half offset)`` pairs,
    STAGED_RECORDS_SCHEMA) at once; return how many.

    In the producer's chunks (:func:`~store.produce.table_producer.append_table_chunks`), each
    copied out of the halves into a buffer of its own, checked and completed by one compiled
    pass (:func:`~store.kernels.record_assembly.complete_staged`: size field, staged magic; then
    the magic code and PREPAREDTRANSACTIONOFFSET) on either of two threads, and placed by the
    core's columnar append on the caller's, in order.  Raises :class:`CorruptRecordError`
    when a staged record fails the checks (the caller's atomic group then drops everything
    of the commit).
    """
    staged = _staged_records(group)
    if staged is None:
        return 0
    now = store.now_ms()  # every record of the commit is stored at its start

    def make(chunk) -> tuple[AssembledRecords, None]:  # reads the halves, writes its own buffer
        lo, hi = chunk.lo, chunk.hi
        buf, starts, sizes = _completed_copy(store, staged, lo, hi)
        return AssembledRecords(
            data=buf, starts=starts, sizes=sizes, topics=staged.topic_names,
            topic_ids=staged.topic_ids[lo:hi], queue_ids=chunk.queue_ids,
            tags_codes=staged.tags_codes[lo:hi], dispatched=True, store_timestamp_ms=now), None

    # one topic, no queue kept: each chunk takes the next queue of its round robin, known
    # before it is copied, so that its placement is presumed while copied (as send_table's)
    append_table_chunks(store, staged, make, presume=True)
    return len(staged.sizes)


class StagedRecords(NamedTuple):
    """The staged records of a commit's halves, one row per record: the first six fields
    are what the producer places them by and what their records say of them."""

    topic_names: list[str]
    #: each record's topic, its real queue (-1: its topic's round robin) and its tagsCode
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    tags_codes: np.ndarray
    #: each record's size and the CommitLog offset of its half (its PREPAREDTRANSACTIONOFFSET)
    sizes: np.ndarray
    prepared: np.ndarray
    #: per half: its records' bytes, their offsets in them, and its first record's row
    datas: list
    offsets: list
    first: np.ndarray


def _staged_records(group: list) -> StagedRecords | None:
    """The records of the halves of ``group`` as columns (``None``: no record at all)."""
    topics: dict[str, int] = {}
    datas, offsets, topic_ids, queue_ids, codes, halves = [], [], [], [], [], []
    for table, clog in group:
        n = table.num_rows
        if not n:
            continue
        col = one_array(table.column("record"))
        offs = np.frombuffer(col.buffers()[1], np.int32, count=n + 1, offset=4 * col.offset)
        datas.append(np.frombuffer(col.buffers()[2], np.uint8))
        offsets.append(offs.astype(np.int64))
        tcol = one_array(table.column("topic"))
        local = np.array([topics.setdefault(t, len(topics))
                          for t in tcol.dictionary.to_pylist()], dtype=np.int64)
        topic_ids.append(local[tcol.indices.to_numpy(zero_copy_only=False)])
        queue_ids.append(table.column("queue_id").to_numpy().astype(np.int64))
        codes.append(table.column("tags_code").to_numpy())
        halves.append(clog)
    if not datas:
        return None
    counts = np.array([len(o) - 1 for o in offsets], dtype=np.int64)
    return StagedRecords(
        topic_names=list(topics), topic_ids=np.concatenate(topic_ids),
        queue_ids=np.concatenate(queue_ids), tags_codes=np.concatenate(codes),
        sizes=np.concatenate([np.diff(o) for o in offsets]),
        prepared=np.repeat(np.array(halves, dtype=np.int64), counts),
        datas=datas, offsets=offsets, first=np.concatenate(([0], np.cumsum(counts))))


def _completed_copy(store, staged: StagedRecords, lo: int, hi: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Records ``lo:hi`` copied out of their halves into a buffer of their own, checked and
    completed (:func:`~store.kernels.record_assembly.complete_staged`): ``(data, starts,
    sizes)``; :class:`CorruptRecordError` for a half written wrongly."""
    first, offsets, prepared = staged.first, staged.offsets, staged.prepared
    sizes = staged.sizes[lo:hi]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    nbytes = int(starts[-1] + sizes[-1])
    buf = np.empty(nbytes, dtype=np.uint8)
    pos = 0
    for h in range(int(np.searchsorted(first, lo, "right")) - 1, len(offsets)):
        a, b = max(lo, int(first[h])), min(hi, int(first[h + 1]))
        if a >= b:
            break
        o = offsets[h]
        src = staged.datas[h][o[a - first[h]]:o[b - first[h]]]
        if pos + len(src) > nbytes:
            break
        buf[pos:pos + len(src)] = src
        pos += len(src)
    if pos != nbytes:  # offsets past their buffer: a half written wrongly
        raise CorruptRecordError(
            store.commit_log.directory, int(prepared[lo]),
            f"sink half whose staged records hold {pos} bytes where their offsets say "
            f"{nbytes}; its batch cannot commit")
    bad = complete_staged(buf, starts, sizes, prepared[lo:hi], STAGED_MAGIC,
                          MESSAGE_MAGIC_CODE_V1, _STAGED_AT, FIXED_SIZE)
    if bad >= 0:
        raise CorruptRecordError(
            store.commit_log.directory, int(prepared[lo + bad]),
            f"sink half whose staged record of {int(sizes[bad])} bytes has a wrong size "
            "field or magic code; its batch cannot commit")
    return buf, starts, sizes


def half_view(store, offset: int) -> tuple[dict, memoryview, int]:
    """Properties, body (a view of the mapped segment, no copy) and born time of the half
    record at ``offset``; :class:`CorruptRecordError` when it is no record or its body
    fails its CRC (a half damaged since it was staged never commits)."""
    buf, pos, f = store.commit_log.buffer_at(offset)
    if pos + HEADER_SIZE > f.size:
        raise CorruptRecordError(f.path, offset, "sink half past the end of its segment")
    header = np.frombuffer(buf, dtype=HEADER_DTYPE, count=1, offset=pos)[0]
    size, body_len = int(header["total_size"]), int(header["body_length"])
    if int(header["magic"]) != MESSAGE_MAGIC_CODE_V1 or size <= 0 or pos + size > f.size \
            or HEADER_SIZE + body_len > size:
        raise CorruptRecordError(f.path, offset, "sink half that is not a record")
    f.populate(pos, pos + size)  # one call maps the pages the CRC would fault in one by one
    view = memoryview(buf)
    body_at = pos + HEADER_SIZE
    topic_len = view[body_at + body_len]
    props_at = body_at + body_len + 1 + topic_len
    props_len = int.from_bytes(view[props_at:props_at + 2], "big")
    props = decode_properties(view[props_at + 2:props_at + 2 + props_len])
    body = view[body_at:body_at + body_len]
    if body_crc(body) != int(header["body_crc"]):
        raise CorruptRecordError(f.path, offset, "sink half whose body fails its CRC "
                                 "(damaged since it was staged); its batch cannot commit")
    return props, body, int(header["born_timestamp"])


def assemble_half(store, spec: RecordSpec) -> AssembledRecords:
    """Encode one half for :meth:`append_encoded` (its body, often megabytes, is copied once,
    by the compiled kernel straight from the bytes); needs no lock."""
    props = encode_properties(spec.properties)
    headers = _half_header(spec.born_timestamp_ms, len(spec.body))
    body = ByteColumn(np.frombuffer(spec.body, dtype=np.uint8),
                      np.array([0, len(spec.body)], dtype=np.int64))
    code = store.tags_code(spec.topic, spec.properties, spec.born_timestamp_ms)
    return store.assemble_encoded(EncodedRecords(
        headers=headers, bodies=body, properties=[props],
        properties_length=np.array([len(props)], dtype=np.int64), topics=[spec.topic],
        topic_ids=np.zeros(1, np.int64), queue_ids=np.array([spec.queue_id], np.int64),
        tags_codes=np.array([code], np.int64)))


def half_bounds(rows, store) -> list[tuple[int, int]]:
    """Row ranges of the halves: each holds at most ``HALF_FILL`` of the message size limit
    (or of half a CommitLog segment, when smaller); a single larger row gets a half of its
    own."""
    n = len(rows)
    budget = half_budget(store)
    topic_len = np.array([len(t.encode("utf-8")) for t in rows.topic_names], np.int64)
    delayed = (rows.levels > 0) | (rows.deliver_ms >= 0)
    # each row's record (an upper bound), plus Arrow's offset and topic / queue / code
    sizes = (rows.bodies.lengths() + rows.properties.lengths() + FIXED_SIZE + 20
             + topic_len[rows.topic_ids] * (1 + delayed) + delayed * _ROUTING_BOUND)
    ends = np.cumsum(sizes)
    bounds = []
    lo, base = 0, 0
    while lo < n:
        hi = int(np.searchsorted(ends, base + budget, side="right"))
        hi = max(hi, lo + 1)
        bounds.append((lo, hi))
        base = int(ends[hi - 1])
        lo = hi
    return bounds
