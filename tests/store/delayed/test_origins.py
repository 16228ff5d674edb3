"""origins_since: the sources a dead delivery run finished, read in runs of records, against a
scalar reading of one record at a time (the model)."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest

from store import Message, MessageStore
from store.formats.record_codec import FIELD_OFFSET, HEADER_SIZE
from store.delayed.delivery import origins_since
from store.formats.message import PROPERTY_DELAY_ORIGIN

_ORIGIN_KEY = PROPERTY_DELAY_ORIGIN.encode("ascii") + b"\x01"
_I32, _I16 = struct.Struct(">i"), struct.Struct(">h")


def _origin(buf, pos: int) -> int:
    """The model: the first ``__RMQ_DELAY_ORIGIN`` pair of one record's properties, or -1."""
    body_len = _I32.unpack_from(buf, pos + FIELD_OFFSET["body_length"])[0]
    tpos = pos + HEADER_SIZE + body_len
    ppos = tpos + 1 + buf[tpos]
    start, end = ppos + 2, ppos + 2 + _I16.unpack_from(buf, ppos)[0]
    i = buf.find(_ORIGIN_KEY, start, end)
    while i >= 0 and i != start and buf[i - 1] != 2:  # a key starts a pair
        i = buf.find(_ORIGIN_KEY, i + 1, end)
    if i < 0:
        return -1
    j = buf.find(b"\x02", i, end)
    try:
        return int(bytes(buf[i + len(_ORIGIN_KEY):j if j >= 0 else end]))
    except ValueError:
        return -1


def _model(store, start: int) -> np.ndarray:
    end, found = store.confirmed_offset(), []
    for offset, _ in store.commit_log.scan(max(start, store.commit_log.min_offset()),
                                            check_crc=False):
        if offset >= end:
            break
        buf, pos, _ = store.commit_log.buffer_at(offset)
        if (o := _origin(buf, pos)) >= 0:
            found.append(o)
    return np.unique(np.array(found, dtype=np.int64))


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.7, 1.0])
def test_origins_of_deliveries_match_a_record_by_record_reading(tmp_path, small_config, clock,
                                                                cut):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        p = store.producer("g")
        # a body that looks like the pair must not count: only properties do
        p.send(Message("t", b"\x02" + _ORIGIN_KEY + b"123\x02"))
        for i in range(120):
            p.send(Message(("a", "b")[i % 2], b"m%d" % i, tags="x", keys=f"k{i}"),
                   delay_level=1 + i % 3)
        p.send_table(pa.table({"topic": ["c"] * 200, "body": [b"t%d" % i for i in range(200)],
                               "delay_ms": pa.array([1_500 + i for i in range(200)])}))
        clock.advance(40_000)
        assert store.deliver_due() == 320
        start = int(store.confirmed_offset() * cut)
        got = origins_since(store, start)
        expected = _model(store, start)
        assert got.dtype == np.int64 and got.tolist() == expected.tolist()
        if cut == 0.0:
            assert len(got) == 320  # every delivery names its source once


def test_records_without_origins_give_none(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        p = store.producer("g")
        assert origins_since(store, 0).tolist() == []  # an empty log
        start = store.confirmed_offset()
        for i in range(30):
            p.send(Message("t", b"m%d" % i, keys=f"k{i}"))
        got = origins_since(store, start)
        assert got.dtype == np.int64 and got.tolist() == []
        p.send(Message("t", b"late"), delay_level=1)
        clock.advance(5_000)
        assert store.deliver_due() == 1
        assert origins_since(store, start).tolist() == _model(store, start).tolist() != []
