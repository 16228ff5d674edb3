"""The message-key index: RocketMQ's IndexFile layout, its answers on RocketMQ-written stores,
a dict model across reopens and crashes, damage set aside and rebuilt, the index turned off."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import KeyIndexUnavailableError, Message, MessageStore, StoreConfig, StoreReader
from store.core.key_index import KeyIndex
from store.files.checkpoint import StoreCheckpoint
from store.files.commit_log import CommitLog
from store.files.index_file import (
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    HEADER,
    HEADER_DTYPE,
    HEADER_SIZE,
    SLOT_DTYPE,
    SLOT_SIZE,
    IndexFile,
    file_name,
    file_size,
    is_index_name,
    java_hash_text,
)
from store.formats.message import java_string_hash
from tests.conftest import SMALL, FakeClock

ANSWERS = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "rocketmq-4.9.8",
                       "index-answers")
STORES = ("clean-shutdown", "killed-mid-write")


def _answers(name: str) -> tuple[dict, list[dict]]:
    with open(os.path.join(ANSWERS, f"{name}.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return lines[0], [r for r in lines if "key" in r]


def _copy(root: str, name: str, dest) -> str:
    path = str(dest / name)
    subprocess.run(["cp", "-r", "--sparse=always", os.path.join(root, name), path], check=True)
    return path


def test_layouts_agree_with_rocketmq_sizes():
    assert HEADER_SIZE == HEADER.size == HEADER_DTYPE.itemsize == 40
    assert SLOT_SIZE == SLOT_DTYPE.itemsize == 4
    assert ENTRY_SIZE == ENTRY.size == ENTRY_DTYPE.itemsize == 20
    assert file_size(5_000_000, 20_000_000) == 420_000_040
    assert is_index_name(file_name(1_795_389_679_841)) and not is_index_name("x.damaged-1")


@pytest.mark.parametrize("text", ["T#k", "%weird|topic%#ключ", "t#\U0001F600 emoji", "a" * 40])
def test_key_hash_is_javas_made_non_negative(text):
    signed = java_string_hash(text)
    assert java_hash_text(text) == (0 if signed == -2**31 else abs(signed))


@pytest.mark.parametrize("name", STORES)
def test_lookups_equal_rocketmqs_answers_key_by_key(rocketmq_root, name):
    meta, keys = _answers(name)
    reader = StoreReader.open(os.path.join(rocketmq_root, name))
    try:
        assert [f.name for f in reader.key_index._refresh()] == [
            f["name"] for f in meta["index_files"]]
        assert len(keys) == {"clean-shutdown": 260, "killed-mid-write": 468}[name]
        assert all(f.check_chains() is None for f in reader.key_index._refresh())
        for line in keys:
            got = sorted(reader.key_index.lookup(line["topic"], line["key"], 64))
            assert got == line["phys_offsets"], line
        # the tail a query walks starts at the broker's newest entry (its checkpoint has no
        # rmq progress offset): it adds nothing the index lacks, and not the whole log
        last = max(f.end_phy_offset for f in reader.key_index._refresh())
        tail = reader.key_index.tail(reader.confirmed_offset())
        assert not tail.shape[1] or tail[1].min() >= last
    finally:
        reader.close()


@pytest.mark.parametrize("name", STORES)
def test_our_index_of_a_rocketmq_commitlog_is_rocketmqs_byte_for_byte(rocketmq_root, tmp_path,
                                                                      name):
    meta, _ = _answers(name)
    theirs = IndexFile(os.path.join(rocketmq_root, name, "index", meta["index_files"][0]["name"]),
                       5_000_000, 20_000_000, read_only=True)
    log = CommitLog(os.path.join(rocketmq_root, name, "commitlog"), 262_144, read_only=True)
    ours_index = KeyIndex(str(tmp_path), StoreConfig(message_index_enable=True), log,
                          StoreCheckpoint(str(tmp_path / "checkpoint")), read_only=False)
    try:
        ours_index.index_range(0, meta["max_phy_offset"])
        (ours,) = ours_index._refresh()
        assert ours.header() == theirs.header()
        count = theirs.index_count
        assert ours.entries().tobytes() == theirs.entries().tobytes()
        used = np.flatnonzero(theirs._slots())
        assert len(used) == theirs.header()[4]
        assert np.array_equal(np.flatnonzero(ours._slots()), used)
        assert np.array_equal(ours._slots()[used], theirs._slots()[used])
        assert count == meta["index_files"][0]["indexCount"]
    finally:
        ours_index.close()
        theirs.close()
        log.close()


def test_writable_open_of_a_killed_rocketmq_store_keeps_its_answers(rocketmq_root, tmp_path):
    path = _copy(rocketmq_root, "killed-mid-write", tmp_path)
    _, keys = _answers("killed-mid-write")
    with MessageStore.open(path, StoreConfig(message_index_enable=True)) as store:
        for line in keys:
            assert sorted(store.key_index.lookup(line["topic"], line["key"], 64)) == \
                line["phys_offsets"]
        sent = store.producer("g").send(Message("after-rocketmq", b"x", keys="mine"))
        assert [v.msg_id for v in store.query_messages("after-rocketmq", key="mine")] == [
            sent.msg_id]


# -- a dict model -----------------------------------------------------------------------------

_TOPICS = st.sampled_from(["A", "B", "%w|t%"])
_KEYS = st.lists(st.sampled_from(["k1", "k2", "ключ", "x\U0001F600", "long" * 8]),
                 min_size=0, max_size=3)
_STEP = st.one_of(
    st.tuples(st.just("send"), _TOPICS, _KEYS),
    st.tuples(st.just("batch"), _TOPICS, st.lists(_KEYS, min_size=1, max_size=40)),
    st.tuples(st.just("reopen"), st.just(""), st.just([])),
    st.tuples(st.just("rollback"), _TOPICS, _KEYS),
    # the builder's pass over at most 200 bytes per "x" (none: to the end)
    st.tuples(st.just("build"), st.just(""), st.lists(st.just("x"), max_size=30)),
)


def _check(store, model: dict) -> None:
    for (topic, key), ids in model.items():
        got = [v.msg_id for v in store.query_messages(topic, key=key, max=10_000)]
        assert got == ids, (topic, key)
    for ids in model.values():
        for msg_id in ids[:2]:
            assert store.view_message(msg_id).msg_id == msg_id
    # built to the end, the files hold each key row of the log once: none twice or skipped
    index = store.key_index
    index.build(store.confirmed_offset())
    assert sum(f.index_count - 1 for f in index._refresh()) == _log_rows(store)


def _log_rows(store) -> int:
    """The key rows of every record of the log (the kernel's walk, from the start)."""
    rows = np.empty((3, 1 << 16), dtype=np.int64)
    counted = [0]
    store.key_index._walk(store.commit_log.min_offset(), store.confirmed_offset(),
                          lambda h, p, t: counted.__setitem__(0, counted[0] + len(h)), rows)
    return counted[0]


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, min_size=1, max_size=12))
def test_index_against_a_dict_model(tmp_path_factory, steps):
    path = str(tmp_path_factory.mktemp("model") / "store")
    clock = FakeClock()
    model: dict[tuple[str, str], list[str]] = {}
    # no builder thread: the steps decide how far the index is built (the rest is the tail)
    store = MessageStore.open(path, SMALL, clock=clock, flush_service=False)
    try:
        for kind, topic, keys in steps:
            clock.advance(1500)
            if kind == "send":
                r = store.producer("g").send(Message(topic, b"b", keys=keys or None))
                for k in keys:
                    model.setdefault((topic, k), []).append(r.msg_id)
                model.setdefault((topic, r.msg_id), []).append(r.msg_id)
            elif kind == "batch":
                results = store.producer("g").send_batch(
                    [Message(topic, b"m" * 50, keys=ks or None) for ks in keys])
                for ks, r in zip(keys, results):
                    for k in ks:
                        model.setdefault((topic, k), []).append(r.msg_id)
                    model.setdefault((topic, r.msg_id), []).append(r.msg_id)
            elif kind == "rollback":  # an atomic group that fails: its records are cut
                with pytest.raises(RuntimeError), store.atomic_append():
                    store.producer("g").send(Message(topic, b"gone", keys=keys or None))
                    raise RuntimeError("abandon")
            elif kind == "build":
                store.key_index.build(store.confirmed_offset(), max_bytes=200 * len(keys) or None)
            else:
                store.close()
                store = MessageStore.open(path, SMALL, clock=clock, flush_service=False)
            for ids in model.values():  # duplicates of a key within one record count once
                ids[:] = list(dict.fromkeys(ids))
        _check(store, model)
        # a crash: the directory as a killed process leaves it (abort marker, no close)
        store.flush()
        crashed = str(tmp_path_factory.mktemp("crash") / "store")
        shutil.copytree(path, crashed)
        with MessageStore.open(crashed, SMALL, clock=clock) as copy:
            _check(copy, model)
            r = copy.producer("g").send(Message("A", b"later", keys="k1"))
            assert copy.query_messages("A", key="k1", max=10_000)[-1].msg_id == r.msg_id
    finally:
        store.close()


def test_entries_past_a_cut_log_end_are_dropped_and_chains_rebuilt(tmp_path):
    path = str(tmp_path / "store")
    with MessageStore.open(path, SMALL) as store:
        p = store.producer("g")
        kept = [p.send(Message("T", b"x", keys="k")) for _ in range(5)]
        end = store.confirmed_offset()
        [p.send(Message("T", b"y", keys="k")) for _ in range(3)]
        store.key_index.build(store.confirmed_offset())
        (f,) = store.key_index._refresh()
        assert f.rechain(end) == 6  # three records, two keys each (UNIQ_KEY and k)
        assert sorted(store.key_index.lookup("T", "k", 64)) == [r.commitlog_offset
                                                              for r in kept]


def test_a_damaged_index_file_is_set_aside_and_rebuilt(tmp_path):
    path = str(tmp_path / "store")
    with MessageStore.open(path, SMALL) as store:
        sent = [store.producer("g").send(Message("T", b"x", keys=f"k{i % 3}"))
                for i in range(1500)]  # 3000 entries: two files
    names = sorted(os.listdir(os.path.join(path, "index")))
    assert len(names) == 2
    damaged = os.path.join(path, "index", names[0])
    with open(damaged, "r+b") as f:
        f.seek(36)
        f.write((10**9).to_bytes(4, "big"))  # an indexCount past the file's entries
    with MessageStore.open(path, SMALL) as store:
        listing = sorted(os.listdir(os.path.join(path, "index")))
        assert f"{names[0]}.damaged-1" in listing and f"{names[1]}.damaged-1" in listing
        got = [v.msg_id for v in store.query_messages("T", key="k1", max=10_000)]
        assert got == [r.msg_id for i, r in enumerate(sent) if i % 3 == 1]


def test_index_off_writes_no_file_and_refuses_key_queries(tmp_path):
    path = str(tmp_path / "store")
    config = SMALL.replace(message_index_enable=False)
    with MessageStore.open(path, config) as store:
        r = store.producer("g").send(Message("T", b"x", keys="k"))
        assert not os.path.exists(os.path.join(path, "index"))
        with pytest.raises(KeyIndexUnavailableError, match="message_index_enable"):
            store.query_messages("T", key="k")
        assert [v.msg_id for v in store.query_messages("T")] == [r.msg_id]
    with MessageStore.open(path, SMALL) as store:  # turned on: built from the CommitLog
        assert [v.msg_id for v in store.query_messages("T", key="k")] == [r.msg_id]


def test_single_puts_write_the_bytes_of_one_batch_put(tmp_path):
    rng = np.random.default_rng(3)
    hashes = rng.integers(0, 64, 300)  # few slots: long chains
    phys = np.arange(300, dtype=np.int64) * 100
    stamps = 1_700_000_000_000 + np.arange(300, dtype=np.int64) * 700
    one = IndexFile(str(tmp_path / "one"), 16, 400, create=True)
    batch = IndexFile(str(tmp_path / "batch"), 16, 400, create=True)
    for i in range(300):
        assert one.put(hashes[i:i + 1], phys[i:i + 1], stamps[i:i + 1]) == 1
    assert batch.put(hashes, phys, stamps) == 300
    assert one._mm[:] == batch._mm[:]
    for h in range(64):
        assert one.lookup(h, 1000) == sorted(phys[hashes == h].tolist(), reverse=True)
    assert batch.put(hashes, phys + 10**6, stamps) == 99  # 400 entries: entry 0 and 399 used
    assert batch.is_full() and batch.put(hashes, phys, stamps) == 0
    one.close()
    batch.close()


@pytest.mark.parametrize("properties", [
    b"UNIQ_KEY\x01ABC\x02KEYS\x01a b  c\x02TAGS\x01t",
    b"KEYS\x01\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87 \xf0\x9f\x98\x80\x02UNIQ_KEY\x01U1",
    b"TAGS\x01x\x02KEYS\x01\x02UNIQ_KEY\x01",
    b"KEYS\x01one\x02KEYS\x01two three",
])
def test_a_single_sends_keys_are_the_kernels(tmp_path, properties):
    """The single send's Python path and the compiled walk give the same keyHashes."""
    from store.core.key_index import record_key_hashes
    from store.formats.record_codec import RecordSpec, encode_record, split_properties
    from store.kernels.key_walk import record_keys

    spec = RecordSpec("top#ic", b"body", split_properties(properties.decode("utf-8")))
    record = encode_record(spec, queue_id=0, queue_offset=0, physical_offset=0,
                           store_timestamp_ms=1_700_000_000_000,
                           properties_bytes=properties)
    rows, end, _ = record_keys(np.frombuffer(record, dtype=np.uint8), 0, len(record),
                               np.empty((3, 1 << 15), dtype=np.int64))
    assert end == len(record)
    assert rows[0].tolist() == record_key_hashes("top#ic", properties)
