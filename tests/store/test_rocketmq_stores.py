"""Store directories written by Apache RocketMQ 4.9.8, opened by rmq.

The stores are in ``tests/fixtures/rocketmq-4.9.8`` (the ``rocketmq_root`` fixture).

Each directory comes with every message RocketMQ itself reads back from it.  rmq must return
exactly those, read-only (without writing a byte) and writable (after its own recovery, which
must cut nothing RocketMQ keeps), and a clean store's CommitLog and ConsumeQueues must come out
of a writable open byte for byte as RocketMQ wrote them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from store import MessageStore, StoreReader

STORES = ("clean-shutdown", "killed-mid-write")


def _copy(root: str, name: str, dest) -> str:
    path = str(dest / name)
    subprocess.run(["cp", "-r", "--sparse=always", os.path.join(root, name), path], check=True)
    return path


def expected_messages(root: str, name: str) -> dict[tuple[str, int, int], dict]:
    with open(os.path.join(root, f"{name}.getMessage.jsonl"), encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    return {(e["topic"], e["queue_id"], e["queue_offset"]): e for e in lines if e["kind"] == "got"}


def _tree_digest(path: str, *, extents: bool = True) -> dict[str, str]:
    """A digest of every file: size, the data extents and their bytes (holes read as zeros);
    with ``extents=False`` only the bytes, whatever blocks the filesystem allocated."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            h = hashlib.blake2b()
            with open(full, "rb") as fh:
                fd, size, pos = fh.fileno(), os.fstat(fh.fileno()).st_size, 0
                h.update(str(size).encode())
                while not extents and pos < size:  # every byte, holes read as zeros
                    chunk = fh.read(1 << 22)
                    h.update(chunk)
                    pos += len(chunk) or size
                while pos < size:
                    try:
                        start = os.lseek(fd, pos, os.SEEK_DATA)
                    except OSError:  # no data after pos
                        break
                    end = os.lseek(fd, start, os.SEEK_HOLE)
                    fh.seek(start)
                    h.update(f"{start}:{end}".encode() + fh.read(end - start))
                    pos = end
            out[os.path.relpath(full, path)] = h.hexdigest()
    return out


def _read_all(store) -> dict[tuple[str, int, int], object]:
    got = {}
    for topic in store.topics(include_system=True):
        for q in store.queue_ids(topic):
            for v in store.pull(topic, q, store.min_offset(topic, q), 100_000):
                got[(topic, q, v.queue_offset)] = v
    return got


def _assert_same_messages(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for key, e in expected.items():
        v = got[key]
        assert v.commitlog_offset == e["commitlog_offset"], key
        assert v.msg_id == (e["msg_id"] or ""), key
        assert hashlib.sha256(v.body).hexdigest() == e["body_sha256"], key
        assert v.store_timestamp_ms == e["store_timestamp"], key
        assert {**v.properties, **v.system_properties} == e["properties"], key
        assert v.tags == e["tags"], key
        assert list(v.keys) == (e["keys"].split(" ") if e["keys"] else []), key


@pytest.mark.parametrize("name", STORES)
def test_read_only_open_returns_rocketmqs_messages_and_writes_nothing(rocketmq_root, name):
    path = os.path.join(rocketmq_root, name)
    before = _tree_digest(path)
    with MessageStore.open(path, read_only=True) as reader:
        assert isinstance(reader, StoreReader)
        assert reader.config.commitlog_file_size_bytes == 262_144  # from the files
        _assert_same_messages(_read_all(reader), expected_messages(rocketmq_root, name))
        assert "orders" in reader.topics() and "SCHEDULE_TOPIC_XXXX" not in reader.topics()
    assert _tree_digest(path) == before


@pytest.mark.parametrize("name", STORES)
def test_writable_open_recovers_like_rocketmq_and_destroys_nothing(rocketmq_root, name,
                                                                   tmp_path):
    path = _copy(rocketmq_root, name, tmp_path)
    original = _tree_digest(os.path.join(rocketmq_root, name), extents=False)
    with MessageStore.open(path) as store:
        assert store.checkpoint.trusted
        _assert_same_messages(_read_all(store), expected_messages(rocketmq_root, name))
    after = _tree_digest(path, extents=False)  # the bytes; writes may reserve blocks ahead
    changed = sorted(f for f in original if f.startswith(("commitlog", "consumequeue"))
                     and after.get(f) != original[f])
    if name == "clean-shutdown":
        assert changed == []  # every record and queue entry byte for byte as RocketMQ wrote
    else:  # only the empty segment past the end of the valid records is gone
        assert changed == ["commitlog/00000000000006291456"]
    # reopening rmq's result reads the same again
    with MessageStore.open(path) as store:
        _assert_same_messages(_read_all(store), expected_messages(rocketmq_root, name))


def test_writable_open_delivers_due_levels_from_where_rocketmq_stopped(rocketmq_root, tmp_path):
    """delayOffset.json says RocketMQ delivered levels 1 and 2; level 18's 8 are still due."""
    path = _copy(rocketmq_root, "clean-shutdown", tmp_path)
    far_future = 4_000_000_000_000
    with MessageStore.open(path, clock=lambda: far_future) as store:
        assert store.delay_levels.offsets() == {1: 8, 2: 7}
        before = {t: sum(store.max_offset(t, q) for q in store.queue_ids(t))
                  for t in store.topics()}
        assert store.deliver_due() == 8
        assert store.deliver_due() == 0
        grown = {t: sum(store.max_offset(t, q) for q in store.queue_ids(t)) - before[t]
                 for t in store.topics()}
        assert sum(grown.values()) == 8
        assert store.delay_levels.offsets() == {1: 8, 2: 7, 18: 8}
        # each delivered record keeps its source's pairs intact (RocketMQ leaves the last
        # pair's separator out: a restore must close it before appending its own)
        checked = 0
        for topic, n in grown.items():
            for q in store.queue_ids(topic) if n else ():
                end = store.max_offset(topic, q)
                for v in store.pull(topic, q, max(0, end - n), n):
                    rec = store.read_record(v.commitlog_offset)
                    if "__RMQ_DELAY_ORIGIN" not in rec.properties:
                        continue
                    src = store.read_record(int(rec.properties["__RMQ_DELAY_ORIGIN"]))
                    for key, value in src.properties.items():
                        if key not in ("REAL_TOPIC", "REAL_QID"):
                            assert rec.properties[key] == value, key
                    assert int(rec.properties["__RMQ_DELIVER_MS"]) > 0
                    checked += 1
        assert checked == 8


@pytest.mark.parametrize("name", STORES)
def test_cli_stats_and_tail_read_a_rocketmq_store_without_writing(rocketmq_root, name):
    """``rmq stats`` and ``rmq tail`` open a RocketMQ-written directory read-only."""
    from click.testing import CliRunner

    from rmq_cli.cli import main

    path = os.path.join(rocketmq_root, name)
    before = _tree_digest(path)
    runner = CliRunner()
    r = runner.invoke(main, ["stats", "--store", path, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["read_only"] is True and data["delayed"] is None
    expected = expected_messages(rocketmq_root, name)
    orders = sum(1 for (topic, _, _) in expected if topic == "orders")
    assert {t["topic"]: t["messages"] for t in data["topics"]}["orders"] == orders
    r = runner.invoke(main, ["stats", "--store", path])
    assert r.exit_code == 0 and "read-only" in r.output, r.output
    r = runner.invoke(main, ["tail", "--store", path, "--topic", "orders", "--from", "earliest",
                             "--no-follow", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert len([line for line in r.stdout.splitlines() if line.startswith("{")]) == orders
    assert _tree_digest(path) == before
