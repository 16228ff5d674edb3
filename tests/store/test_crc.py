"""store.crc: the CRC32 of large buffers is zlib's, and bodies on both sides of the size
where the column path switches to it get CRCs every reader accepts."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import Message, MessageStore
from store import crc as crc_module
from store.crc import LARGE_BODY_BYTES, crc32


@given(st.binary(max_size=5000), st.integers(0, 4999))
def test_same_values_as_zlib_on_any_slice(data, cut):
    view = memoryview(data)[min(cut, len(data)):]
    assert crc32(view) == zlib.crc32(view)
    assert crc32(np.frombuffer(data, np.uint8)) == zlib.crc32(data)


def test_large_buffers_match_zlib():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (8 << 20) + 13, dtype=np.uint8)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)[5:]) == zlib.crc32(memoryview(data)[5:])


def test_the_hardware_crc_is_used_where_isal_is_installed():
    pytest.importorskip("isal")
    assert crc_module.HARDWARE_CRC and crc32 is not zlib.crc32


@pytest.mark.parametrize("size", [LARGE_BODY_BYTES - 1, LARGE_BODY_BYTES, 3 * LARGE_BODY_BYTES])
def test_column_path_crcs_on_both_sides_of_the_switch(tmp_path, small_config, clock, size):
    bodies = [bytes((i * 7 + k) % 256 for k in range(size + i)) for i in range(3)]
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as s:
        table = s.producer("g").send_table(pa.table({"topic": ["t"] * 3, "body": bodies}))
        single = s.producer("g").send(Message("t", bodies[0]))
        offsets = table.column("commitlog_offset").to_pylist() + [single.commitlog_offset]
        for off, body in zip(offsets, bodies + bodies[:1]):
            assert s.read_record(off).body_crc == zlib.crc32(body) & 0x7FFFFFFF
        assert s.verify_commitlog().ok
