"""The record kernel's copies are memcpy calls without bounds checks: columns whose parts do
not add up to the sizes the append placed are refused before anything is copied or written."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from store import MessageStore
from store.formats.record_codec import HEADER_DTYPE, MESSAGE_MAGIC_CODE_V1
from store.core.append_types import EncodedRecords
from store.formats.byte_columns import ByteColumn, one_array


def _records(body_length: int, properties_length: int) -> EncodedRecords:
    h = np.zeros(2, HEADER_DTYPE)
    h["magic"] = MESSAGE_MAGIC_CODE_V1
    h["body_length"] = [3, body_length]
    return EncodedRecords(
        headers=h, bodies=ByteColumn.of([b"abc", b"defg"]),
        properties=ByteColumn.of([b"a\x011\x02", b"b\x012\x02"]),
        properties_length=np.array([4, properties_length]), topics=["t"],
        topic_ids=np.zeros(2, np.int64), queue_ids=np.zeros(2, np.int64),
        tags_codes=np.zeros(2, np.int64))


@pytest.mark.parametrize("body_length, properties_length", [(5, 4), (4, 40), (2, 4)])
def test_parts_that_do_not_add_up_are_refused(tmp_path, small_config, clock, body_length,
                                              properties_length):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        before = store.confirmed_offset()
        with pytest.raises(ValueError, match="do not add up"):
            store.append_encoded(_records(body_length, properties_length))
        assert store.confirmed_offset() == before


def test_parts_that_add_up_are_written(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        placed = store.append_encoded(_records(4, 4))
        second = store.read_record(int(placed.commitlog_offsets[1]))
        assert second.body == b"defg" and second.properties == {"b": "2"}
        assert store.verify_commitlog().ok


def test_one_array_shares_a_single_chunk_and_combines_several():
    """A column of one chunk is used in place (the sink's commit reads its staged records
    through it: a copy costs 0.1 s per 1M records); several chunks give their concatenation,
    none an empty array."""
    records = pa.array([b"a" * 50, b"bb", None, b"c"], pa.binary())
    single = one_array(pa.chunked_array([records]))
    assert single.buffers()[2].address == records.buffers()[2].address
    assert single.equals(records)
    assert one_array(records) is records
    several = one_array(pa.chunked_array([records.slice(0, 1), records.slice(1)]))
    assert several.equals(records)
    empty = one_array(pa.chunked_array([], pa.binary()))
    assert len(empty) == 0 and empty.type == pa.binary()
    bodies = pa.array([b"a" * 50, b"bb"], pa.binary())  # no nulls: nothing to fill
    assert ByteColumn.from_arrow(pa.chunked_array([bodies])).data.ctypes.data == \
        bodies.buffers()[2].address


def test_to_arrow_without_copy_only_for_numpy_memory_covered_whole():
    """``send_table``'s results take the message ids without a copy (their own array); a
    column viewing an Arrow buffer (a staged half, a mapped segment) or only part of its
    data is still copied, and every way gives the same strings."""
    ids = np.frombuffer(b"".join(b"%032X" % i for i in range(5)), np.uint8).copy()
    owned = ByteColumn(ids, np.arange(0, 32 * 6, 32, dtype=np.int64))
    shared = owned.to_arrow(pa.string(), copy=False)
    assert shared.buffers()[2].address == ids.ctypes.data
    assert shared.to_pylist() == [f"{i:032X}" for i in range(5)]
    assert owned.to_arrow(pa.string()).buffers()[2].address != ids.ctypes.data
    part = owned.slice(1, 3).to_arrow(pa.string(), copy=False)
    assert part.to_pylist() == [f"{i:032X}" for i in (1, 2)]
    assert part.buffers()[2].address != ids.ctypes.data
    arrow_backed = ByteColumn.from_arrow(pa.array([b"ab", b"c"], pa.binary()))
    out = arrow_backed.to_arrow(copy=False)
    assert out.buffers()[2].address != arrow_backed.data.ctypes.data
    assert out.to_pylist() == [b"ab", b"c"]
