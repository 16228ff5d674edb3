"""CommitLog record codec: layout, RocketMQ's parse rules, hash and CRC vectors, message ids."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.formats import record_codec as codec
from store.formats.record_codec import (BLANK_MAGIC_CODE, FIELD_OFFSET, FIXED_SIZE, HEADER_DTYPE,
                                        HEADER_SIZE, MESSAGE_MAGIC_CODE_V1, RECORD_HEADER,
                                        RecordCheck, RecordSpec, body_crc, check_record,
                                        decode_properties, decode_record, encode_blank,
                                        encode_properties, encode_record, record_size)
from store.base.errors import CorruptRecordError
from store.formats.message_id import MessageIdGenerator
from store.formats.message import java_string_hash, tags_code

# -- strategies ------------------------------------------------------------------------------
TOPIC_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-%|"
topics = st.text(alphabet=TOPIC_CHARS, min_size=1, max_size=127)
# property text: any unicode except the two separators (and surrogates, which UTF-8 refuses)
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1, max_size=20)
properties = st.dictionaries(prop_text, prop_text, max_size=6)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
specs = st.builds(
    RecordSpec, topic=topics, body=st.binary(max_size=300), properties=properties,
    flag=i32, sys_flag=st.integers(0, 0xC), born_timestamp_ms=i64, reconsume_times=i32,
    prepared_transaction_offset=i64, born_host=st.binary(min_size=4, max_size=4),
    born_port=i32)


def java_parse(text: str) -> dict[str, str]:
    """RocketMQ's MessageDecoder.string2messageProperties, written from its rules (§1.6)."""
    out = {}
    for part in text.split("\x02"):
        if len(part) < 3:
            continue
        i = part.find("\x01")
        if i <= 0 or i == len(part) - 1:
            continue
        out[part[:i]] = part[i + 1:]
    return out


# -- layout ----------------------------------------------------------------------------------
def test_header_struct_and_dtype_agree_with_the_reference_offsets():
    assert RECORD_HEADER.size == HEADER_DTYPE.itemsize == HEADER_SIZE == 88
    assert FIXED_SIZE == 91
    expected = {"total_size": 0, "magic": 4, "body_crc": 8, "queue_id": 12, "flag": 16,
                "queue_offset": 20, "physical_offset": 28, "sys_flag": 36,
                "born_timestamp": 40, "born_host": 48, "store_timestamp": 56,
                "store_host": 64, "reconsume_times": 72, "prepared_transaction_offset": 76,
                "body_length": 84}
    for name, off in expected.items():
        assert FIELD_OFFSET[name] == off, name


def test_magic_codes_are_rocketmqs():
    assert MESSAGE_MAGIC_CODE_V1 & 0xFFFFFFFF == 0xDAA320A7
    assert BLANK_MAGIC_CODE & 0xFFFFFFFF == 0xCBD43194


# -- vectors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("TagA", 2598919), ("*", 42), ("rmq_sys_wheel_timer", -1609340346), ("", 0),
    # a non-BMP character counts as two UTF-16 code units (0xD83D, 0xDE00)
    ("\U0001F600", 31 * 0xD83D + 0xDE00),
    # overflow wraps to signed 32 bits like Java's int
    ("polygenelubricants", -2**31),
])
def test_java_string_hash_vectors(text, expected):
    assert java_string_hash(text) == expected


def test_tags_code_is_zero_without_a_tag():
    assert tags_code(None) == 0 and tags_code("") == 0 and tags_code("TagA") == 2598919


@pytest.mark.parametrize("body, expected", [(b"hello", 907060870),
                                            (b"Hello RocketMQ", 1774740973)])
def test_body_crc_vectors(body, expected):
    assert body_crc(body) == expected


@given(st.binary(max_size=2000))
def test_body_crc_is_masked_zlib_crc32(body):
    crc = body_crc(body)
    assert 0 <= crc <= 0x7FFFFFFF and crc == zlib.crc32(body) & 0x7FFFFFFF


# -- properties ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("k1\x01v1", {"k1": "v1"}),
    ("k1\x01v1\x02", {"k1": "v1"}),
    ("k1\x01", {}), ("\x01v1", {}), ("aaa", {}), ("", {}),
    ("a\x01b\x02c\x01d", {"a": "b", "c": "d"}),
    ("a\x01b\x01c\x02", {"a": "b\x01c"}),  # only the first 0x01 splits
    ("k\x01v\x02\x02\x02x\x01y", {"k": "v", "x": "y"}),
])
def test_decode_properties_follows_rocketmq_rules(text, expected):
    assert decode_properties(text) == expected
    assert decode_properties(text.encode()) == expected


@given(st.text(alphabet="ab\x01\x02", max_size=40))
def test_decode_properties_matches_the_java_rules_on_any_text(text):
    assert decode_properties(text) == java_parse(text)


@given(properties)
def test_properties_round_trip(props):
    data = encode_properties(props)
    assert decode_properties(data) == props


def test_properties_with_none_values_are_left_out():
    assert encode_properties({"a": "1", "b": None, "c": "3"}) == b"a\x011\x02c\x013\x02"


@given(st.dictionaries(prop_text, st.sampled_from(["", "v"]), max_size=5))
def test_empty_values_are_dropped_on_decode(props):
    assert decode_properties(encode_properties(props)) == {k: v for k, v in props.items() if v}


# -- records ---------------------------------------------------------------------------------
@settings(max_examples=200)
@given(specs, st.integers(0, 2**31 - 1), i64, st.integers(0, 2**62), i64)
def test_record_round_trip(spec, queue_id, queue_offset, physical_offset, store_ts):
    data = encode_record(spec, queue_id=queue_id, queue_offset=queue_offset,
                         physical_offset=physical_offset, store_timestamp_ms=store_ts)
    props_b = encode_properties(spec.properties)
    assert len(data) == record_size(len(spec.body), len(spec.topic), len(props_b))
    assert len(data) == 91 + len(spec.body) + len(spec.topic) + len(props_b)
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    assert check_record(data, 0, len(data)) == len(data)
    rec = decode_record(data, 0)
    assert (rec.topic, rec.body, rec.properties) == (spec.topic, spec.body, spec.properties)
    assert (rec.queue_id, rec.queue_offset, rec.physical_offset) == (
        queue_id, queue_offset, physical_offset)
    assert (rec.flag, rec.sys_flag, rec.born_timestamp_ms, rec.reconsume_times) == (
        spec.flag, spec.sys_flag, spec.born_timestamp_ms, spec.reconsume_times)
    assert rec.prepared_transaction_offset == spec.prepared_transaction_offset
    assert (rec.born_host, rec.born_port) == (spec.born_host, spec.born_port)
    assert rec.store_timestamp_ms == store_ts
    assert rec.body_crc == body_crc(spec.body)
    assert rec.total_size == len(data)
    # the spec of a decoded record re-encodes to the same bytes
    assert encode_record(rec.to_spec(), queue_id=queue_id, queue_offset=queue_offset,
                         physical_offset=physical_offset, store_timestamp_ms=store_ts) == data


@settings(max_examples=50)
@given(specs, st.data())
def test_a_cut_record_is_invalid_at_every_length(spec, data):
    rec = encode_record(spec, queue_id=1, queue_offset=2, physical_offset=3,
                        store_timestamp_ms=4)
    cut = data.draw(st.integers(0, len(rec) - 1))
    torn = rec[:cut] + bytes(len(rec) - cut)
    if torn != rec:  # without properties the record ends in two zero bytes anyway
        assert check_record(torn, 0, len(torn)) == RecordCheck.INVALID
    # and a record whose tail is simply missing (end of the mapping) as well
    assert check_record(rec[:cut], 0, cut) == RecordCheck.INVALID


def test_crc_damage_makes_a_record_invalid_only_when_crc_is_checked():
    spec = RecordSpec("t", b"payload", {"a": "b"})
    data = bytearray(encode_record(spec, queue_id=0, queue_offset=0, physical_offset=0,
                                   store_timestamp_ms=1))
    data[HEADER_SIZE] ^= 0xFF  # first body byte
    assert check_record(data, 0, len(data)) == RecordCheck.INVALID
    assert check_record(data, 0, len(data), check_crc=False) == len(data)


def test_damaged_topic_length_makes_a_record_invalid():
    spec = RecordSpec("topic", b"payload", {"a": "b"})
    data = bytearray(encode_record(spec, queue_id=0, queue_offset=0, physical_offset=0,
                                   store_timestamp_ms=1))
    data[HEADER_SIZE + len(b"payload")] = 200
    assert check_record(data, 0, len(data)) == RecordCheck.INVALID
    with pytest.raises(CorruptRecordError):
        decode_record(data, 0)


def test_blank_record():
    blank = encode_blank(1234)
    assert blank == struct.pack(">ii", 1234, BLANK_MAGIC_CODE)
    buf = blank + bytes(1234 - 8)
    assert check_record(buf, 0, len(buf)) == RecordCheck.BLANK
    # a blank claiming more bytes than the segment holds is not a blank
    assert check_record(buf, 0, 100) == RecordCheck.INVALID


@pytest.mark.parametrize("garbage", [bytes(100), b"\xff" * 100, b"\x00\x00\x00\x05"])
def test_garbage_is_invalid_and_decoding_it_raises_corrupt_record(garbage):
    assert check_record(garbage, 0, len(garbage)) == RecordCheck.INVALID
    with pytest.raises(CorruptRecordError) as info:
        decode_record(garbage, 0, file="seg", base_offset=1000)
    assert info.value.file == "seg" and info.value.position == 1000


# -- message ids -----------------------------------------------------------------------------
def test_message_ids_are_32_upper_hex_and_unique_within_a_millisecond():
    gen = MessageIdGenerator()
    now = 1_700_000_000_000
    ids = gen.next_ids(70_000, now) + [gen.next_id(now) for _ in range(100)]
    ids += gen.next_ids(100_000, now)  # far more than the 16-bit counter holds in one ms
    assert all(len(i) == 32 and i == i.upper() for i in ids[:1000])
    int(ids[0], 16)
    assert len(set(ids)) == len(ids)


def _twin_generators(counter: int) -> tuple[MessageIdGenerator, MessageIdGenerator]:
    """Two generators in the same state (prefix and counter)."""
    import numpy as np

    gens = MessageIdGenerator(), MessageIdGenerator()
    for g in gens:
        g._prefix, g._counter = "7F000001ABCD12345678", counter
        g._prefix_bytes = np.frombuffer(g._prefix.encode("ascii"), dtype=np.uint8)
    return gens


def test_next_id_gives_what_next_ids_of_one_gives():
    """The single-id path (cached text of the time part) against the array path, fed the
    same times: jumps, a clock that goes back, a month change; then a full ms of ids."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    start = 1_700_000_000_000
    month_end = 1_701_388_800_000  # 2023-12-01T00:00:00Z

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.sampled_from([0, 0, 0, 1, 5, -3, month_end - start]), min_size=1,
                    max_size=40), st.integers(0, 65535))
    def check(steps, counter):
        one, many = _twin_generators(counter)
        now = start
        for step in steps:
            now += step
            assert one.next_id(now) == many.next_ids(1, now)[0]

    check()
    one, many = _twin_generators(65_000)  # more ids than one ms holds, the counter wrapping
    assert [one.next_id(start) for _ in range(65_600)] == many.next_ids(65_600, start)
    assert one.next_id(start) == many.next_ids(1, start)[0]


def test_message_ids_of_several_generators_never_collide():
    now = 1_700_000_000_000
    gens = [MessageIdGenerator() for _ in range(5)]
    ids = []
    for _ in range(4):
        for g in gens:
            ids += g.next_ids(5000, now)
            ids.append(g.next_id(now + 1))
    assert len(set(ids)) == len(ids)


def test_message_id_layout():
    import os

    gen = MessageIdGenerator()
    now = 1_700_000_000_000
    raw = bytes.fromhex(gen.next_id(now))
    assert raw[:4] == bytes([127, 0, 0, 1])
    assert struct.unpack(">H", raw[4:6])[0] == os.getpid() & 0xFFFF
    # ms since the start of the month (UTC): 2023-11-14T22:13:20Z is 13 days 22:13:20 in
    since = struct.unpack(">i", raw[10:14])[0]
    assert since == ((13 * 24 + 22) * 3600 + 13 * 60 + 20) * 1000


def test_record_size_formula():
    assert record_size(100, 6, 42) == 91 + 100 + 6 + 42
    assert codec.BLANK.size == 8


def test_each_layout_is_one_field_list_for_its_struct_and_dtype():
    """The Struct and the NumPy dtype of each binary layout come from one field list."""
    from store.files.consume_queue import ENTRY_DTYPE, ENTRY, ENTRY_FIELDS
    from store.formats.binary_layout import layout
    from store.timer.timer_log import UNIT, UNIT_DTYPE, UNIT_FIELDS
    from store.timer.wheel import SLOT, SLOT_DTYPE, SLOT_FIELDS

    for fields, packed, dtype in ((codec.HEADER_FIELDS, RECORD_HEADER, HEADER_DTYPE),
                                  (ENTRY_FIELDS, ENTRY, ENTRY_DTYPE),
                                  (SLOT_FIELDS, SLOT, SLOT_DTYPE),
                                  (UNIT_FIELDS, UNIT, UNIT_DTYPE)):
        built = layout(fields)
        assert packed.format == built.struct.format and packed.size == dtype.itemsize
        assert dtype == built.dtype
        # a record packed with the Struct reads back field by field through the dtype
        values = [i + 1 if not kind.startswith("V") else bytes(range(int(kind[1:])))
                  for i, (_, kind) in enumerate(fields)]
        row = np.frombuffer(packed.pack(*values), dtype=dtype)[0]
        for (name, kind), value in zip(fields, values):
            got = bytes(row[name]) if kind.startswith("V") else int(row[name])
            assert got == value, name
