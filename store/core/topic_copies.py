"""Copies of CommitLog records into other topics, as columns: the parts every copier shares.

Services that move records between topics (the restore of delayed messages, the transaction
check loop's put-back copies and discards, the commit of a half message) never decode and
re-encode a record: they gather the sources (:class:`~store.files.record_gather.SourceRecords`),
rewrite headers and properties with NumPy and the property kernels, and hand the result to
the core's columnar append.  Two steps are the same for all of them:

* the ConsumeQueue tagsCode of every copy (:func:`tags_codes`): the tag's hash, computed once
  per distinct tag, or the destination topic's registered rule (asked per record: such
  topics are rare);
* appending pairs to properties that RocketMQ may have written without the last 0x02
  (:func:`closing_separators`).
"""

from __future__ import annotations

import numpy as np

from ..formats.record_codec import decode_properties
from .ports import StorePort
from ..kernels.property_scan import distinct_values
from ..formats.byte_columns import ByteColumn, ByteSlices

_SEPARATOR = np.array([2], dtype=np.uint8)


def tags_codes(store: StorePort, props: ByteColumn | ByteSlices, rows: np.ndarray,
               has_tag: np.ndarray, tag_start: np.ndarray, tag_end: np.ndarray,
               topic_ids: np.ndarray, topics: list[str], now: int) -> np.ndarray:
    """tagsCodes of the copies in ``rows`` (a bool mask; other rows get 0).

    ``has_tag`` / ``tag_start`` / ``tag_end``: each row's TAGS value in ``props.data`` (as
    :func:`~store.kernels.property_scan.scan_properties` finds it); ``topics[topic_ids[i]]`` is
    the destination topic of row ``i``.
    """
    n = len(rows)
    codes = np.zeros(n, dtype=np.int64)
    if not rows.any():
        return codes
    ruled = np.array([store.has_tags_rule(t) for t in topics], dtype=bool)
    per_record = rows & ruled[np.maximum(topic_ids, 0)]
    tagged = np.flatnonzero(rows & ~per_record & has_tag)
    if len(tagged):
        tags, inverse = distinct_values(props.data, tag_start[tagged], tag_end[tagged])
        codes[tagged] = store.tag_hashes([t.decode("utf-8", "replace") for t in tags])[inverse]
    for i in np.flatnonzero(per_record).tolist():
        row = props.data[props.starts[i]:props.ends[i]].tobytes()
        codes[i] = store.tags_code(topics[topic_ids[i]], decode_properties(row), now)
    return codes


def closing_separators(props: ByteColumn | ByteSlices) -> ByteSlices:
    """Per row, the byte to write before pairs appended to it: a 0x02 when its properties
    end inside a pair (RocketMQ writes the last pair without its 0x02), else nothing."""
    lengths = props.lengths()
    open_end = lengths > 0
    if open_end.any():
        open_end &= props.data[np.maximum(props.ends - 1, 0)] != 2
    return ByteSlices(_SEPARATOR, np.zeros(len(lengths), np.int64), open_end.astype(np.int64))
