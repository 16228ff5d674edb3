"""Vectorised Arrow decoding (store.core.arrow_decode) against the per-record path (pull)."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import CorruptRecordError, Message, MessageStore, OffsetOutOfRangeError
from store.core.arrow_decode import MESSAGE_SCHEMA, empty_batch, read_queue_batch
from store.formats.arrow_properties import parse_properties
from store.formats.record_codec import (
    FIELD_OFFSET,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    RecordSpec,
    decode_properties,
)
from store.formats.message import (
    PROPERTY_DELIVER_MS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_UNIQ_KEY,
    RESERVED_PROPERTY_NAMES,
    java_string_hash,
)

FIELDS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "tags", "keys",
          "body", "properties", "born_timestamp", "store_timestamp", "deliver_timestamp",
          "transaction_id", "reconsume_times")


# -- helpers ---------------------------------------------------------------------------------
def batch_rows(batch: pa.RecordBatch) -> list[tuple]:
    """Rows of a batch as tuples in MessageView terms (times in ms, maps as dicts)."""
    assert batch.schema.equals(MESSAGE_SCHEMA, check_metadata=True)
    batch.validate(full=True)
    cols = {}
    for name in FIELDS:
        col = batch.column(name)
        if pa.types.is_timestamp(col.type):
            us = col.cast(pa.int64()).to_pylist()
            assert all(v is None or v % 1000 == 0 for v in us)
            cols[name] = [None if v is None else v // 1000 for v in us]
        elif name == "properties":
            pairs = col.to_pylist()
            assert all(len(dict(p)) == len(p) for p in pairs), "duplicate map keys"
            cols[name] = [dict(p) for p in pairs]
        else:
            cols[name] = col.to_pylist()
    return list(zip(*(cols[name] for name in FIELDS)))


def view_rows(views) -> list[tuple]:
    return [(v.topic, v.queue_id, v.queue_offset, v.commitlog_offset, v.msg_id, v.tags,
             list(v.keys), v.body, dict(v.properties), v.born_timestamp_ms,
             v.store_timestamp_ms, v.deliver_timestamp_ms, v.transaction_id, v.reconsume_times)
            for v in views]


def pulled(store: MessageStore, topic: str, queue_id: int, start: int, end: int) -> list[tuple]:
    """The reference: ``store.pull`` (decode_record + record_view per message)."""
    views = []
    while start < end:
        got = store.pull(topic, queue_id, start, max_messages=min(32, end - start))
        assert got
        views += got
        start += len(got)
    return view_rows(views)


def assert_matches_pull(store: MessageStore, topic: str, queue_id: int, start: int, end: int,
                        tags=None) -> int:
    batch = store.read_arrow(topic, queue_id, start, end, tags=tags)
    expected = pulled(store, topic, queue_id, start, end)
    if tags is not None:
        expected = [r for r in expected if r[5] in set(tags)]
    assert batch_rows(batch) == expected
    return batch.num_rows


def segments_touched(store: MessageStore, topic: str, queue_id: int) -> int:
    entries = store.queue_entries(topic, queue_id, 0, store.max_offset(topic, queue_id))
    return len(np.unique(entries["offset"] // store.config.commitlog_file_size_bytes))


# -- strategies ------------------------------------------------------------------------------
chars = st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",))
token = st.text(chars, min_size=1, max_size=10).filter(lambda s: s.strip() != "")
tags_st = st.none() | token.filter(lambda s: "|" not in s) | st.sampled_from(["Aa", "BB"])
keys_st = st.none() | st.lists(token.filter(lambda s: " " not in s), max_size=3)
# user names, plus system names a user may set (hidden from the map)
name_st = token.filter(lambda s: s not in RESERVED_PROPERTY_NAMES and not s.startswith("__RMQ")) \
    | st.sampled_from([PROPERTY_TRANSACTION_ID, "INNER_NUM", "tenant"])
props_st = st.dictionaries(name_st, token, max_size=4)
body_st = st.one_of(st.binary(min_size=1, max_size=40), st.just(b"\x00"), st.just(b"\x01\x02"),
                    st.binary(min_size=2000, max_size=9000))
message_st = st.builds(Message, topic=st.sampled_from(["orders", "pay-2"]), body=body_st,
                       tags=tags_st, keys=keys_st, properties=props_st)


class StepClock:
    """A clock that moves only when told (the store fixture's clock is per test, not per
    example)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(messages=st.lists(message_st, min_size=1, max_size=40),
       batched=st.lists(st.booleans(), min_size=40, max_size=40), data=st.data())
def test_decode_equals_pull_for_random_messages(small_config, messages, batched, data):
    """Random bodies, tags, keys and unicode properties, sent one by one or in batches over
    64 KiB segments; whole ranges, random sub-ranges and tag filters equal ``pull``."""
    clock = StepClock()
    with tempfile.TemporaryDirectory() as tmp:
        store = MessageStore.open(os.path.join(tmp, "s"), small_config, clock=clock)
        try:
            producer = store.producer("g")
            i = 0
            while i < len(messages):  # runs of one topic go as one batch when drawn so
                j = i + 1
                while j < len(messages) and messages[j].topic == messages[i].topic:
                    j += 1
                if batched[i]:
                    producer.send_batch(messages[i:j])
                else:
                    for m in messages[i:j]:
                        producer.send(m)
                        clock.now += 7
                i = j
            for topic in store.topics():
                for qid in store.queue_ids(topic):
                    end = store.max_offset(topic, qid)
                    assert_matches_pull(store, topic, qid, 0, end)
                    if end:
                        a = data.draw(st.integers(0, end), label="start")
                        b = data.draw(st.integers(a, end), label="end")
                        assert_matches_pull(store, topic, qid, a, b)
                        wanted = data.draw(st.lists(tags_st.filter(bool), max_size=2), label="tags")
                        assert_matches_pull(store, topic, qid, 0, end, tags=wanted)
        finally:
            store.close()


# -- deterministic cases ---------------------------------------------------------------------
def fill(store: MessageStore, n: int, topic: str = "orders", *, batch: int = 0) -> None:
    producer = store.producer("g")
    msgs = [Message(topic, bytes([i % 256]) * (50 + 97 * i % 900), tags=f"t{i % 3}",
                    keys=[f"k{i}", f"o{i % 5}"] if i % 2 else f"k{i}",
                    properties={"i": str(i), "név": "ünïcode✓"} if i % 4 else {})
            for i in range(n)]
    if batch:
        for i in range(0, n, batch):
            producer.send_batch(msgs[i:i + batch])
    else:
        for m in msgs:
            producer.send(m)


def test_ranges_across_segment_boundaries_match_pull(store):
    fill(store, 600)
    checked = 0
    for qid in store.queue_ids("orders"):
        end = store.max_offset("orders", qid)
        assert segments_touched(store, "orders", qid) >= 3
        checked += assert_matches_pull(store, "orders", qid, 0, end)
        assert_matches_pull(store, "orders", qid, 5, end - 3)
    assert checked == 600


def test_store_written_with_send_batch_matches_pull(store):
    fill(store, 900, batch=150)
    qids = [q for q in store.queue_ids("orders") if store.max_offset("orders", q)]
    assert sum(store.max_offset("orders", q) for q in qids) == 900
    for qid in qids:
        assert segments_touched(store, "orders", qid) >= 2
        assert_matches_pull(store, "orders", qid, 0, store.max_offset("orders", qid))


def test_large_blocks_are_decoded_in_pieces_and_joined(store, monkeypatch):
    from store.core import arrow_decode

    fill(store, 200, batch=100)
    monkeypatch.setattr(arrow_decode, "_SCAN_BYTES", 4096)  # many blocks per segment
    for qid in store.queue_ids("orders"):
        assert_matches_pull(store, "orders", qid, 0, store.max_offset("orders", qid))


def test_tags_filter_checks_the_string_after_a_hash_collision(store):
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert java_string_hash("\x00") == 0  # the tagsCode of a message without a tag
    producer = store.producer("g")
    tags = ["Aa", "BB", "C", None, "Aa", "BB", "\x00"] * 5
    for i, t in enumerate(tags):
        producer.send(Message("orders", b"x%d" % i, tags=t))
    for qid in store.queue_ids("orders"):
        end = store.max_offset("orders", qid)
        got = read_queue_batch(store, "orders", qid, 0, end, tags=["Aa"])
        assert set(got.column("tags").to_pylist()) <= {"Aa"}
        assert_matches_pull(store, "orders", qid, 0, end, tags=["Aa"])
        assert_matches_pull(store, "orders", qid, 0, end, tags=("BB", "C"))
        assert_matches_pull(store, "orders", qid, 0, end, tags=["\x00"])
        assert read_queue_batch(store, "orders", qid, 0, end, tags=[]).num_rows == 0
        assert read_queue_batch(store, "orders", qid, 0, end, tags=["zz"]).num_rows == 0
    total = sum(read_queue_batch(store, "orders", q, 0, store.max_offset("orders", q),
                                 tags=iter(["Aa"])).num_rows for q in store.queue_ids("orders"))
    assert total == tags.count("Aa")


def test_empty_range_gives_an_empty_batch_with_the_schema(store):
    fill(store, 8)
    end = store.max_offset("orders", 0)
    for start in (0, end):
        got = read_queue_batch(store, "orders", 0, start, start)
        assert got.num_rows == 0 and got.schema.equals(MESSAGE_SCHEMA)
    assert empty_batch().schema.equals(MESSAGE_SCHEMA)


def test_system_columns_deliver_time_and_committed_transaction_id(store):
    base = {PROPERTY_UNIQ_KEY: "ID", "user": "u"}
    specs = [
        RecordSpec("orders", b"a", {**base, PROPERTY_DELIVER_MS: "1700000000123"}, queue_id=0,
                   born_timestamp_ms=5, reconsume_times=3),
        RecordSpec("orders", b"b", {**base, PROPERTY_TRANSACTION_ID: "tx-1"}, queue_id=0,
                   sys_flag=TRANSACTION_COMMIT_TYPE),
        RecordSpec("orders", b"c", {**base, PROPERTY_TRANSACTION_ID: "tx-2"}, queue_id=0,
                   sys_flag=TRANSACTION_NOT_TYPE),
        RecordSpec("orders", b"", {}, queue_id=0),  # empty body, no properties, no msg id
        # odd property strings: 0x01 inside a name, empty name, empty value
        RecordSpec("orders", b"e", {"a\x01b": "c", "": "v", "k": "", "x": "y"}, queue_id=0),
        RecordSpec("orders", b"f", {"x\x02y": "z", "KEYS": "  k1  k2 "}, queue_id=0),
    ]
    store.append(specs)
    rows = batch_rows(read_queue_batch(store, "orders", 0, 0, len(specs)))
    assert rows == pulled(store, "orders", 0, 0, len(specs))
    assert rows[0][11] == 1700000000123 and rows[0][13] == 3 and rows[0][9] == 5
    assert [r[12] for r in rows[:3]] == [None, "tx-1", None]
    assert rows[3][4] == "" and rows[3][7] == b"" and rows[3][8] == {}
    assert rows[4][8] == {"a": "b\x01c", "x": "y"}
    assert rows[5][8] == {"y": "z"} and rows[5][6] == ["k1", "k2"]


property_text = st.text(st.sampled_from("ab\u00e9\x00\x01\x02 "), max_size=14)


@settings(max_examples=300, deadline=None)
@given(st.lists(property_text, min_size=1, max_size=6))
def test_property_parser_follows_rocketmqs_rule(texts):
    """Raw property strings (missing 0x02, several 0x01, NULs, empty pairs) parse like
    codec.decode_properties, RocketMQ's rule written per string."""
    pairs, row, _code, _offsets, _user = parse_properties(pa.array(texts, pa.string()))
    got: list[dict] = [{} for _ in texts]
    for k, r in enumerate(row.tolist()):
        got[r][pairs[4 * k].as_py()] = pairs[4 * k + 2].as_py()
    assert got == [decode_properties(t) for t in texts]


# -- errors ----------------------------------------------------------------------------------
def test_offsets_out_of_range_are_refused(store):
    fill(store, 8)
    end = store.max_offset("orders", 0)
    with pytest.raises(OffsetOutOfRangeError, match="allowed"):
        read_queue_batch(store, "orders", 0, 3, 2)
    with pytest.raises(OffsetOutOfRangeError, match="not written"):
        read_queue_batch(store, "orders", 0, 0, end + 1)


def test_a_damaged_record_raises_corrupt_record_error(store):
    fill(store, 8)
    entries = store.queue_entries("orders", 0, 0, 2)
    offset = int(entries["offset"][1])
    f = store.commit_log.files.find(offset)
    fd = os.open(f.path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\x00\x00\x00\x00", offset - f.start + FIELD_OFFSET["magic"])
    finally:
        os.close(fd)
    with pytest.raises(CorruptRecordError, match=str(offset)):
        read_queue_batch(store, "orders", 0, 0, 2)


def test_a_consume_queue_entry_pointing_into_another_record_is_refused(store):
    store.append([RecordSpec("orders", b"same size", {"TAGS": "t"}, queue_id=0)] * 4)
    entries = store.queue_entries("orders", 0, 0, 1)
    queue = store.consume_queue("orders", 0)
    fd = os.open(queue.files.find(0).path, os.O_RDWR)
    try:  # entry 1 now names record 0 again: the two "records" overlap
        os.pwrite(fd, int(entries["offset"][0]).to_bytes(8, "big"), 20)
    finally:
        os.close(fd)
    # (entries may go back in the CommitLog, those of an index commit do: the record's
    # header, which says queue offset 0, refuses it)
    with pytest.raises(CorruptRecordError, match="does not match its ConsumeQueue entry"):
        read_queue_batch(store, "orders", 0, 0, 2)


def test_properties_that_are_not_utf8_decode_with_replacement(store, monkeypatch):
    from store.formats import record_codec as codec

    real = codec.encode_properties

    def raw(properties):  # the bytes a foreign or damaged writer could leave
        return b"bad\x01\xff\xfe\x02" + real(properties) if "raw" in properties else \
            real(properties)

    monkeypatch.setattr(codec, "encode_properties", raw)
    store.append([RecordSpec("orders", b"x", {"raw": "1", "TAGS": "t"}, queue_id=0),
                  RecordSpec("orders", b"y", {"ok": "é"}, queue_id=0)])
    rows = batch_rows(read_queue_batch(store, "orders", 0, 0, 2))
    assert rows == pulled(store, "orders", 0, 0, 2)
    assert rows[0][8] == {"bad": "\ufffd\ufffd", "raw": "1"} and rows[0][5] == "t"


def test_a_record_whose_topic_differs_from_its_queue_is_shown_as_stored(store):
    store.append([RecordSpec("orders", b"body-%d" % i, {"TAGS": "t"}, queue_id=0)
                  for i in range(3)])
    entries = store.queue_entries("orders", 0, 0, 3)
    offset = int(entries["offset"][1])
    f = store.commit_log.files.find(offset)
    topic_at = offset - f.start + FIELD_OFFSET["body_length"] + 4 + len(b"body-1") + 1
    fd = os.open(f.path, os.O_RDWR)
    try:  # same length, other name: only the topic bytes can tell
        os.pwrite(fd, b"orderX", topic_at)
    finally:
        os.close(fd)
    rows = batch_rows(read_queue_batch(store, "orders", 0, 0, 3))
    assert [r[0] for r in rows] == ["orders", "orderX", "orders"]
    assert rows == pulled(store, "orders", 0, 0, 3)


def test_a_deliver_time_that_is_not_a_number_raises_corrupt_record_error(store):
    store.append([RecordSpec("orders", b"x", {PROPERTY_DELIVER_MS: "12"}, queue_id=0),
                  RecordSpec("orders", b"y", {PROPERTY_DELIVER_MS: "soon"}, queue_id=0)])
    assert batch_rows(read_queue_batch(store, "orders", 0, 0, 1))[0][11] == 12
    with pytest.raises(CorruptRecordError, match="soon"):
        read_queue_batch(store, "orders", 0, 0, 2)


def test_filler_units_in_front_of_a_queue_yield_no_rows(store):
    queue = store.consume_queue("orders", 1)
    queue.fill_to(3)  # a queue that starts at offset 3 (as after a rebuild)
    store.append([RecordSpec("orders", b"m%d" % i, {"TAGS": "a"}, queue_id=1) for i in range(2)])
    assert store.max_offset("orders", 1) == 5
    got = read_queue_batch(store, "orders", 1, 0, 5)
    assert got.column("queue_offset").to_pylist() == [3, 4]
    assert batch_rows(got) == pulled(store, "orders", 1, 3, 5)
    assert read_queue_batch(store, "orders", 1, 0, 3).num_rows == 0
    assert read_queue_batch(store, "orders", 1, 0, 5, tags="a").num_rows == 2  # a str is a tag


@pytest.mark.parametrize("names", [
    ["TIMER_DEQUEUE_MS", "TIMER_DEfoo_bar_", "TIMER_DEQUEUE_MS"],  # alike in 16 bytes' first 8
    ["long_user_name_1", "long_user_name_1", "long_user_name_1"],  # one list of names
    ["TIMER_DEQUEUE_MS", "TIMER_DELIVER_MS", "DELAY"],
])
def test_names_alike_in_length_and_first_bytes_are_told_apart(store, names):
    store.append([RecordSpec("orders", b"m", {name: f"v{i}", "KEYS": f"k{i}"}, queue_id=0)
                  for i, name in enumerate(names)])
    rows = batch_rows(read_queue_batch(store, "orders", 0, 0, len(names)))
    assert rows == pulled(store, "orders", 0, 0, len(names))
    assert [r[8] for r in rows] == [{n: f"v{i}"} if n.islower() or "foo" in n else {}
                                    for i, n in enumerate(names)]


def test_a_projection_decodes_the_asked_columns_in_the_asked_order(tmp_path, small_config,
                                                                     clock):
    from store.base.errors import InvalidMessageError

    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        p = store.producer("g")
        for i in range(40):
            p.send(Message("t", b"b%d" % i, tags=("a", "b")[i % 2], keys=f"k{i}",
                           properties={"x": str(i)}))
        q = store.queue_ids("t")[0]
        end = store.max_offset("t", q)
        full = store.read_arrow("t", q, 0, end)
        for names in (["body", "topic"], ["properties", "queue_offset"], ["msg_id"],
                      list(reversed(full.schema.names))):
            part = store.read_arrow("t", q, 0, end, columns=names)
            assert part.schema.names == names
            for n in names:
                assert part.column(n).equals(full.column(n)), n
        tagged = store.read_arrow("t", q, 0, end, tags="a", columns=["queue_offset"])
        assert tagged.schema.names == ["queue_offset"]
        assert tagged.column(0).to_pylist() == [
            o for o, t in zip(full.column("queue_offset").to_pylist(),
                              full.column("tags").to_pylist()) if t == "a"]
        assert store.read_arrow("t", q, 0, 0, columns=["body"]).schema.names == ["body"]
        for bad in (["nope"], ["body", "body"], []):
            with pytest.raises(InvalidMessageError, match="allowed"):
                store.read_arrow("t", q, 0, end, columns=bad)


def test_tagged_reads_pick_entries_across_queue_files_as_the_numpy_path(store, monkeypatch):
    """A tag filter picks its entries in one compiled pass over the stored (big-endian)
    ConsumeQueue entries; across the queue's files (1,000 entries each here), after filler
    units and up to a range's end it keeps exactly the rows the NumPy path keeps."""
    from store.core import arrow_decode
    from store.base import jit

    store.consume_queue("orders", 0).fill_to(5)  # fillers in front of the queue
    tags = ["a", "b", None, "Aa", "BB"]  # "Aa" and "BB" share a tagsCode
    for first in range(0, 2400, 200):
        store.append([RecordSpec("orders", b"m%d" % i, {"TAGS": tags[i % 5]} if tags[i % 5]
                                 else {}, queue_id=0) for i in range(first, first + 200)])
    end = store.max_offset("orders", 0)
    ranges = [(0, end), (0, 990), (990, 1010), (1500, 2100), (2004, end)]
    wanted = (["a"], ["Aa"], ["b", "BB"], ["zz"])
    read_queue_batch(store, "orders", 0, 0, end, tags=["a"])
    assert jit.wait_compiled(120)  # the compiled pass, not the NumPy path, below
    picked = []
    real = arrow_decode._tagged_entries
    monkeypatch.setattr(arrow_decode, "_tagged_entries",
                        lambda *a: picked.append(real(*a)) or picked[-1])
    got = {(r, tuple(t)): batch_rows(read_queue_batch(store, "orders", 0, *r, tags=t))
           for r in ranges for t in wanted}
    assert all(p is not None for p in picked) and len(picked) == len(got)
    monkeypatch.setattr(arrow_decode, "_tagged_entries", lambda *a: None)
    for (r, t), rows in got.items():
        assert rows == batch_rows(read_queue_batch(store, "orders", 0, *r, tags=t)), (r, t)
    assert len(got[((0, end), ("a",))]) == 480
    assert {row[2] for row in got[((990, 1010), ("b", "BB"))]} == {
        o for o in range(990, 1010) if (o - 5) % 5 in (1, 4)}
