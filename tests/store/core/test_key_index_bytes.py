"""The bytes the key index's builder writes (store.core.key_index, store.kernels.key_walk):
the index files of a store equal, byte for byte, those a plain Python model of RocketMQ's
IndexService writes for the same CommitLog (keys of non-ASCII text, several keys a message,
unique keys, records over segment and index-file boundaries, builds in passes of any size);
the compiled keyHashes equal Java's String.hashCode of ``topic#key``; one put over heads a
torn write left writes what RocketMQ's two steps (clear those heads, then chain) write."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import Message, MessageStore
from store.core.key_index import record_key_hashes
from store.files.index_file import HEADER_SIZE, SLOT_SIZE, file_size
from store.formats.record_codec import (
    BLANK_MAGIC_CODE,
    TRANSACTION_ROLLBACK_TYPE,
    RecordSpec,
    decode_record,
    encode_record,
    split_properties,
)
from store.formats.record_codec import (
    HEADER_SIZE as RECORD_HEADER_SIZE,
)
from store.kernels.key_walk import chain_entries, record_keys
from tests.conftest import SMALL, FakeClock

#: small files: a record's keys often straddle two index files; few slots: long chains
CONFIG = SMALL.replace(max_hash_slot_num=16, max_index_num=64,
                       commitlog_file_size_bytes=16 * 1024)
_WORDS = ["k1", "ключ", "x\U0001F600y", "鍵", "long-" * 9, "é", "a\u00ff\u0800\uffff"]


def _key_rows(store) -> list[tuple[int, int, int]]:
    """(keyHash, record offset, store time) of every key of the log, in RocketMQ's order,
    from a plain Python walk of the records and :func:`record_key_hashes`."""
    rows = []
    offset, end = store.commit_log.min_offset(), store.confirmed_offset()
    while offset < end:
        segment = store.commit_log.files.find(offset)
        buf = segment.buffer()
        pos = offset - segment.start
        total, magic = struct.unpack_from(">ii", buf, pos)
        if magic == BLANK_MAGIC_CODE:
            offset = segment.end
            continue
        record = decode_record(buf, pos)
        if record.transaction_type != TRANSACTION_ROLLBACK_TYPE:
            at = pos + RECORD_HEADER_SIZE + len(record.body) + 1 + len(record.topic)
            properties = bytes(buf[at + 2:pos + total])
            rows += [(h, offset, record.store_timestamp_ms)
                     for h in record_key_hashes(record.topic, properties)]
        offset += total
    return rows


def _model_files(rows, slot_count: int, entry_count: int) -> list[bytes]:
    """RocketMQ's IndexFile bytes for ``rows``, each file filled before the next, by dicts."""
    files = []
    per_file = entry_count - 1  # (entry 0 is never used)
    for first in range(0, len(rows), per_file):
        chunk = rows[first:first + per_file]
        data = bytearray(file_size(slot_count, entry_count))
        heads: dict[int, int] = {}
        begin_ts = chunk[0][2]
        for n, (h, phys, stamp) in enumerate(chunk, start=1):
            slot = h % slot_count
            diff = min(max((stamp - begin_ts) // 1000, 0), 2**31 - 1)
            struct.pack_into(">iqii", data, HEADER_SIZE + SLOT_SIZE * slot_count + 20 * n,
                             h, phys, diff, heads.get(slot, 0))
            heads[slot] = n
        for slot, n in heads.items():
            struct.pack_into(">i", data, HEADER_SIZE + SLOT_SIZE * slot, n)
        struct.pack_into(">qqqqii", data, 0, begin_ts, chunk[-1][2], chunk[0][1], chunk[-1][1],
                         len(heads), len(chunk) + 1)
        files.append(bytes(data))
    return files


def _index_bytes(store) -> list[bytes]:
    directory = store.key_index.directory
    out = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out.append(f.read())
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_builders_files_are_a_python_models_byte_for_byte(tmp_path, seed):
    rng = random.Random(seed)
    clock = FakeClock()
    # no builder thread: the test decides the passes (their sizes must not matter)
    with MessageStore.open(str(tmp_path / "s"), CONFIG, clock=clock,
                           flush_service=False) as store:
        producer = store.producer("g")
        for _ in range(60):
            clock.advance(rng.choice([0, 700, 1500, 4000]))
            batch, topic = [], rng.choice(["T", "%R|x%", "topic-2"])
            for _ in range(rng.randint(1, 12)):
                # several keys (RocketMQ's separator: one space; empty parts are skipped)
                keys = " ".join(rng.choice(_WORDS + [""]) for _ in range(rng.randint(0, 4)))
                batch.append(Message(topic, b"b" * rng.randint(1, 900),
                                     keys=keys.strip() or None))
            if len(batch) == 1:
                producer.send(batch[0])
            else:
                producer.send_batch(batch)
            if rng.random() < 0.3:
                store.key_index.build(store.confirmed_offset(),
                                      max_bytes=rng.choice([None, 300, 5000, 40000]))
        if rng.random() < 0.5:  # an atomic group that fails: its records are cut
            with pytest.raises(RuntimeError), store.atomic_append():
                producer.send(Message("T", b"gone", keys="k1"))
                raise RuntimeError("abandon")
        store.key_index.build(store.confirmed_offset())
        assert len(store.commit_log.files.files) > 2  # (records over segment ends)
        rows = _key_rows(store)
        want = _model_files(rows, CONFIG.max_hash_slot_num, CONFIG.max_index_num)
        assert len(want) > 3
        got = _index_bytes(store)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b, f"index file {i} of {len(want)} differs"


_TEXT = st.text(st.characters(codec="utf-8", exclude_characters=" \x01\x02"), max_size=40)


@settings(max_examples=200, deadline=None)
@given(topic=st.text(st.sampled_from("abcXYZ09_-%|"), min_size=1, max_size=20),
       uniq=_TEXT, keys=st.lists(_TEXT, max_size=5))
def test_the_compiled_key_hashes_are_javas(topic, uniq, keys):
    """Every length around the four-byte ASCII step, non-ASCII at any place, surrogate
    pairs: the kernel's keyHashes are those of Java's String.hashCode over ``topic#key``."""
    properties = "\x02".join(([f"UNIQ_KEY\x01{uniq}"] if uniq else [])
                             + ([f"KEYS\x01{' '.join(keys)}"] if keys else [])
                             + ["TAGS\x01t"]).encode("utf-8")
    spec = RecordSpec(topic, b"body", split_properties(properties.decode("utf-8")))
    record = encode_record(spec, queue_id=0, queue_offset=0, physical_offset=0,
                           store_timestamp_ms=1_700_000_000_000, properties_bytes=properties)
    rows, end, _ = record_keys(np.frombuffer(record, dtype=np.uint8), 0, len(record),
                               np.empty((3, 1 << 15), dtype=np.int64))
    assert end == len(record)
    assert rows[0].tolist() == record_key_hashes(topic, properties)
    java = [_java_key_hash(f"{topic}#{k}") for k in ([uniq] if uniq else [])
            + [k for k in " ".join(keys).split(" ") if k]]
    assert rows[0].tolist() == java


def _java_key_hash(text: str) -> int:
    """abs(String.hashCode) as RocketMQ takes it, from the UTF-16 code units."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) % 2**32
    signed = h - 2**32 if h >= 2**31 else h
    return 0 if signed == -2**31 else abs(signed)


def _two_step_put(buf: bytearray, slot_count: int, count: int, hashes, phys, stamps,
                  begin_ts: int) -> int:
    """The put as RocketMQ's IndexService steps would do it, in Python: heads past
    ``count`` (a torn write's) cleared first, then each entry chained; the fresh slots."""
    entry_base = HEADER_SIZE + SLOT_SIZE * slot_count
    for h in hashes:
        at = HEADER_SIZE + SLOT_SIZE * (h % slot_count)
        if not 0 <= struct.unpack_from(">i", buf, at)[0] <= count:
            struct.pack_into(">i", buf, at, 0)
    fresh = 0
    for i, (h, p, t) in enumerate(zip(hashes, phys, stamps)):
        at = HEADER_SIZE + SLOT_SIZE * (h % slot_count)
        prev = struct.unpack_from(">i", buf, at)[0]
        fresh += prev == 0
        diff = min(max((t - begin_ts) // 1000, 0), 2**31 - 1)
        struct.pack_into(">iqii", buf, entry_base + 20 * (count + i), h, p, diff, prev)
        struct.pack_into(">i", buf, at, count + i)
    return fresh


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slot_count, most", [(32, 200), (1 << 16, 5000)],
                         ids=["long chains", "many slots"])
def test_one_pass_over_torn_heads_writes_the_two_steps_bytes(seed, slot_count, most):
    """Slot heads past indexCount (a builder killed mid-put), some equal to entries this put
    writes into other slots or into the same one: the one-pass kernel writes the bytes (and
    counts the fresh slots) of clearing them first, then chaining."""
    rng = np.random.default_rng(seed)
    entry_count, count = 2 * most, int(rng.integers(1, 100))
    data = bytearray(file_size(slot_count, entry_count))
    heads = rng.integers(0, count + 1, slot_count)  # published heads...
    torn = rng.random(slot_count) < 0.5  # ...and torn ones, past indexCount or negative
    heads[torn] = rng.choice([count + 1, count + 3, count + 40, entry_count - 1, -5],
                             int(torn.sum()))
    struct.pack_into(f">{slot_count}i", data, HEADER_SIZE, *heads.tolist())
    k = int(rng.integers(1, most))
    # few slots: long chains and torn heads met often; many: a large put at random
    hashes = rng.integers(0, 2**31 - 1, k) % (slot_count * 3 if slot_count < 1000 else 2**31)
    phys = np.arange(k, dtype=np.int64) * 100
    stamps = 1_700_000_000_000 + np.arange(k, dtype=np.int64) * 300
    want = bytearray(data)
    fresh_want = _two_step_put(want, slot_count, count, hashes.tolist(), phys.tolist(),
                               stamps.tolist(), 1_700_000_000_000)
    buf = np.frombuffer(data, dtype=np.uint8)
    fresh = chain_entries(buf, HEADER_SIZE, HEADER_SIZE + SLOT_SIZE * slot_count, slot_count,
                          count, hashes, phys, stamps, 1_700_000_000_000, 2**31 - 1)
    assert fresh == fresh_want
    assert bytes(data) == bytes(want)



@pytest.mark.parametrize("before, keys", [(1000, 150), (900, 300)],
                         ids=["47 rows held of 151", "247 rows held of 301"])
def test_a_record_of_many_keys_over_two_files_is_indexed_whole_after_a_crash(tmp_path, before,
                                                                            keys):
    """A record of many keys fills a file (2,047 entries) and goes on in the next; the
    builder dies before the next file holds the rest.  Indexing again adds the rows the
    first file misses, once, whether that file's last rows are few or more than the newest
    a pass reads first."""
    with MessageStore.open(str(tmp_path / "s"), SMALL, flush_service=False) as store:
        producer = store.producer("g")
        sent = producer.send_batch([Message("T", b"x", keys=f"k{i}") for i in range(before)])
        big = producer.send(Message("T", b"y", keys=" ".join(f"m{j}" for j in range(keys))))
        store.key_index.build(store.confirmed_offset())
        first, newest = store.key_index._refresh()
        assert first.is_full() and first.end_phy_offset == big.commitlog_offset
        newest.rechain(0)  # (the next file as the killed builder left it: empty)
        store.key_index._set_indexed_to(sent[-5].commitlog_offset)
        store.key_index.build(store.confirmed_offset())
        assert sum(f.index_count - 1 for f in store.key_index._refresh()) == 2 * before + keys + 1
        for j in range(keys):
            assert store.key_index.lookup("T", f"m{j}", 64) == [big.commitlog_offset], j
