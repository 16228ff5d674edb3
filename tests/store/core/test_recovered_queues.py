"""Queues that recovery (or any dispatch) creates are in the topic table at once: a store
whose topic table is lost, killed mid-write, and a RocketMQ store killed before its reput
reached some queues."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from store import Message, MessageStore, StoreConfig
from tests.store.test_rocketmq_stores import _read_all, expected_messages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_KILLED_WRITER = """
import os, signal, sys
from store import Message, MessageStore, StoreConfig
store = MessageStore.open(sys.argv[1], StoreConfig(commitlog_file_size_bytes=1 << 20),
                          flush_service=False)
producer = store.producer("g")
for i in range(30):
    producer.send(Message("a", b"late-a%d" % i), queue_id=3)
    producer.send(Message("b", b"late-b%d" % i))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _drop_queues_and_table(path: str, queues) -> None:
    for q in queues:
        shutil.rmtree(os.path.join(path, "consumequeue", *q))
    for name in ("topics.json", "topics.json.bak"):
        if os.path.exists(os.path.join(path, "config", name)):
            os.remove(os.path.join(path, "config", name))


def test_queues_a_recovery_creates_are_listed_in_the_same_open(tmp_path):
    path = str(tmp_path / "s")
    config = StoreConfig(commitlog_file_size_bytes=1 << 20)
    with MessageStore.open(path, config) as store:
        for i in range(20):
            store.producer("g").send(Message("a", b"early%d" % i), queue_id=0)
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, path], env={**os.environ,
                   "PYTHONPATH": ROOT}, check=False, timeout=120, capture_output=True)
    # the killed writer's queues and the topic table lost (what the kill left unwritten)
    _drop_queues_and_table(path, [("a", "3"), ("b",)])
    with MessageStore.open(path, config) as store:
        assert store.queue_ids("a") == [0, 1, 2, 3]
        assert "b" in store.topics()
        got = _read_all(store)
        bodies = sorted(v.body for v in got.values() if v.topic in ("a", "b"))
        assert len(bodies) == 80
        assert sum(1 for b in bodies if b.startswith(b"late")) == 60
    with MessageStore.open(path, read_only=True) as reader:  # another process sees them too
        assert reader.queue_ids("a") == [0, 1, 2, 3]


def test_a_reader_sees_queue_directories_another_process_creates(tmp_path):
    """Topics known from their directories only (no topic table): a queue directory made
    after the reader opened (another process's recovery) shows in the reader's table at its
    next look, though the ConsumeQueue root itself did not change."""
    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        store.producer("g").send(Message("a", b"x"), queue_id=0)
    _drop_queues_and_table(path, [])
    with MessageStore.open(path, read_only=True) as reader:
        assert reader.queue_ids("a") == [0]
        root = os.stat(os.path.join(path, "consumequeue"))
        shutil.copytree(os.path.join(path, "consumequeue", "a", "0"),
                        os.path.join(path, "consumequeue", "a", "2"))
        assert os.stat(os.path.join(path, "consumequeue")).st_mtime_ns == root.st_mtime_ns
        assert reader.queue_ids("a") == [0, 1, 2]


@pytest.mark.parametrize("topic", ["logs", "orders"])
def test_a_killed_rocketmq_store_whose_reput_missed_a_queue(rocketmq_root, tmp_path, topic):
    """A store Apache RocketMQ 4.9.8 wrote and was SIGKILLed in, whose reput had not made
    one queue's directory yet (no topics.json either): the open that recovers it lists that
    queue at once and serves every message RocketMQ reads back from it."""
    path = str(tmp_path / "killed")
    subprocess.run(["cp", "-r", "--sparse=always", os.path.join(rocketmq_root, "killed-mid-write"),
                    path], check=True)
    shutil.rmtree(os.path.join(path, "consumequeue", topic, "3"))
    expected = {k: e for k, e in expected_messages(rocketmq_root, "killed-mid-write").items()
                if k[:2] == (topic, 3)}
    assert expected
    with MessageStore.open(path) as store:
        assert store.queue_ids(topic) == [0, 1, 2, 3]
        got = _read_all(store)
        assert {k for k in got if k[:2] == (topic, 3)} == set(expected)
