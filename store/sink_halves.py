"""Sink halves as records: appending them, reading them back, and their rows.

Helpers of :mod:`store.sink` (format: :mod:`store.sink_format`): a half is appended through
the columnar path (its megabytes of Arrow body go to the compiled record kernel with no extra
copy), read back as a view of the mapped CommitLog segment, and its rows are turned back into
:class:`~store.table_rows.PreparedRows` to be appended in their real topics.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .codec import (
    HEADER_DTYPE,
    HEADER_SIZE,
    LOCALHOST,
    MESSAGE_MAGIC_CODE_V1,
    STORE_PORT,
    TRANSACTION_COMMIT_TYPE,
    RecordSpec,
    decode_properties,
    encode_properties,
)
from .core.append_types import AssembledRecords, EncodedRecords
from .errors import CorruptRecordError
from .record_kernels import ByteColumn
from .table_producer import append_prepared
from .table_rows import PreparedRows

#: Part of ``max_message_size_bytes`` a half's rows may fill (the rest: Arrow framing).
HALF_FILL = 0.9


def append_group(store, group: list) -> int:
    """Append the staged rows of several halves (same born time per half) at once (in
    chunks of :data:`~store.table_producer.CHUNK_ROWS`, encoded on two threads)."""
    tables = [t for t, _, _ in group if t.num_rows]
    if not tables:
        return 0
    n = sum(t.num_rows for t in tables)
    prepared = np.concatenate([np.full(t.num_rows, clog, dtype=np.int64)
                               for t, clog, _ in group if t.num_rows])
    born = np.concatenate([np.full(t.num_rows, b, dtype=np.int64)
                           for t, _, b in group if t.num_rows])
    rows = prepared_from_staged(pa.concat_tables(tables), born)
    append_prepared(store, rows, sys_flag=TRANSACTION_COMMIT_TYPE, prepared_offsets=prepared)
    return n


def half_view(store, offset: int) -> tuple[dict, memoryview, int]:
    """Properties, body (a view of the mapped segment, no copy) and born time of the half
    record at ``offset``."""
    buf, pos, f = store.commit_log.buffer_at(offset)
    if pos + HEADER_SIZE > f.size:
        raise CorruptRecordError(f"sink half at CommitLog offset {offset}: past its segment")
    header = np.frombuffer(buf, dtype=HEADER_DTYPE, count=1, offset=pos)[0]
    size, body_len = int(header["total_size"]), int(header["body_length"])
    if int(header["magic"]) != MESSAGE_MAGIC_CODE_V1 or size <= 0 or pos + size > f.size \
            or HEADER_SIZE + body_len > size:
        raise CorruptRecordError(f"sink half at CommitLog offset {offset}: not a record")
    view = memoryview(buf)
    body_at = pos + HEADER_SIZE
    topic_len = view[body_at + body_len]
    props_at = body_at + body_len + 1 + topic_len
    props_len = int.from_bytes(view[props_at:props_at + 2], "big")
    props = decode_properties(view[props_at + 2:props_at + 2 + props_len])
    return props, view[body_at:body_at + body_len], int(header["born_timestamp"])


def assemble_half(store, spec: RecordSpec) -> AssembledRecords:
    """Encode one half for :meth:`append_encoded` (its body, often megabytes, is copied once,
    by the compiled kernel straight from the bytes); needs no lock."""
    props = encode_properties(spec.properties)
    headers = np.zeros(1, dtype=HEADER_DTYPE)
    headers["magic"] = MESSAGE_MAGIC_CODE_V1
    headers["born_timestamp"] = spec.born_timestamp_ms
    headers["born_host"] = np.void(LOCALHOST)
    headers["store_host"] = np.void(LOCALHOST)
    headers["store_port"] = STORE_PORT
    headers["body_length"] = len(spec.body)
    body = ByteColumn(np.frombuffer(spec.body, dtype=np.uint8),
                      np.array([0, len(spec.body)], dtype=np.int64))
    code = store.tags_code(spec.topic, spec.properties, spec.born_timestamp_ms)
    return store.assemble_encoded(EncodedRecords(
        headers=headers, bodies=body, properties=[props],
        properties_length=np.array([len(props)], dtype=np.int64), topics=[spec.topic],
        topic_ids=np.zeros(1, np.int64), queue_ids=np.array([spec.queue_id], np.int64),
        tags_codes=np.array([code], np.int64)))


def prepared_from_staged(table: pa.Table, born_ms) -> PreparedRows:
    topics = table.column("topic").combine_chunks().dictionary_encode()
    return PreparedRows(
        topic_names=topics.dictionary.to_pylist(),
        topic_ids=topics.indices.to_numpy(zero_copy_only=False).astype(np.int64),
        bodies=ByteColumn.from_arrow(table.column("body")),
        properties=ByteColumn.from_arrow(table.column("properties")),
        tags_codes=table.column("tags_code").to_numpy(),
        msg_ids=ByteColumn.from_arrow(table.column("msg_id")),
        levels=table.column("delay_level").to_numpy(),
        deliver_ms=table.column("deliver_ms").to_numpy(),
        born_ms=born_ms, queue_ids=table.column("queue_id").to_numpy())


def half_bounds(rows: PreparedRows, store) -> list[tuple[int, int]]:
    """Row ranges of the halves: each holds at most ``HALF_FILL`` of the message size limit
    (or of half a CommitLog segment, when smaller); a single larger row gets a half of its
    own."""
    n = len(rows)
    cfg = store.config
    budget = int(min(cfg.max_message_size_bytes, cfg.commitlog_file_size_bytes // 2) * HALF_FILL)
    sizes = rows.bodies.lengths() + rows.properties.lengths() + 96
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
