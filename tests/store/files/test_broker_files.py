"""Broker config files (fastjson text) under a store root: read leniently, written as
RocketMQ writes them, and a broker's own fields and topics never lost."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import Message, MessageStore
from store.files.broker_files import dumps_fastjson, parse_lenient, read_lenient_json

BROKER_TOPICS = {
    "dataVersion": {"counter": 41, "stateVersion": 3, "timestamp": 1795389600000},
    "topicConfigTable": {
        "TBW102": {"order": False, "perm": 7, "readQueueNums": 8, "topicFilterType": "SINGLE_TAG",
                   "topicName": "TBW102", "topicSysFlag": 0, "writeQueueNums": 8},
        "SCHEDULE_TOPIC_XXXX": {"order": False, "perm": 6, "readQueueNums": 18,
                                "topicFilterType": "SINGLE_TAG",
                                "topicName": "SCHEDULE_TOPIC_XXXX", "topicSysFlag": 0,
                                "writeQueueNums": 18},
        "%weird|topic%": {"attributes": {"+message.type": "NORMAL"}, "order": True, "perm": 6,
                          "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
                          "topicName": "%weird|topic%", "topicSysFlag": 0,
                          "writeQueueNums": 4},
    },
    "someFutureField": {"kept": [1, 2, {"x": "ü"}]},
}


def _copy(rocketmq_root: str, dest) -> str:
    path = str(dest / "clean-shutdown")
    subprocess.run(["cp", "-r", "--sparse=always", os.path.join(rocketmq_root, "clean-shutdown"),
                    path], check=True)
    return path


def test_rocketmqs_delay_offset_text_is_what_we_write(rocketmq_root):
    with open(os.path.join(rocketmq_root, "clean-shutdown", "config", "delayOffset.json")) as fh:
        text = fh.read()
    data = parse_lenient(text)
    data["offsetTable"] = {int(k): v for k, v in data["offsetTable"].items()}
    assert dumps_fastjson(data) == text  # fastjson's text, byte for byte


def test_delay_offsets_written_back_in_rocketmqs_text(rocketmq_root, tmp_path):
    path = _copy(rocketmq_root, tmp_path)
    with MessageStore.open(path, clock=lambda: 4_000_000_000_000) as store:
        assert store.deliver_due() == 8
    file = os.path.join(path, "config", "delayOffset.json")
    text = open(file, encoding="utf-8").read()
    assert "\t\"offsetTable\":{\n\t\t1:8,\n\t\t2:7,\n\t\t18:8\n\t}" in text
    data = read_lenient_json(file)
    # (tables keyed by level are written with number keys, as fastjson writes them)
    data = {k: ({int(q): w for q, w in v.items()} if isinstance(v, dict)
                and v and all(str(q).isdigit() for q in v) else v) for k, v in data.items()}
    assert dumps_fastjson(data) == text
    # the broker's copy before rmq's run is the .bak
    assert read_lenient_json(file + ".bak")["offsetTable"] == {"1": 8, "2": 7}


def test_a_brokers_topics_json_keeps_every_topic_and_field(rocketmq_root, tmp_path):
    path = _copy(rocketmq_root, tmp_path)
    file = os.path.join(path, "config", "topics.json")
    original = dumps_fastjson(BROKER_TOPICS)
    with open(file, "w", encoding="utf-8") as fh:
        fh.write(original)
    with MessageStore.open(path) as store:
        assert store.queue_ids("TBW102") == list(range(8))
        store.producer("g").send(Message("brand-new", b"x"))
    text = open(file, encoding="utf-8").read()
    data = json.loads(text)
    assert text == dumps_fastjson(data)  # fastjson's text
    table = data["topicConfigTable"]
    for name, cfg in BROKER_TOPICS["topicConfigTable"].items():
        assert table[name] == cfg  # untouched, unknown fields included
    assert data["someFutureField"] == BROKER_TOPICS["someFutureField"]
    assert set(table["brand-new"]) >= {"topicName", "readQueueNums", "writeQueueNums", "perm",
                                       "topicFilterType", "topicSysFlag", "order"}
    assert table["brand-new"]["perm"] == 6 and table["brand-new"]["topicName"] == "brand-new"
    version = data["dataVersion"]
    assert (version["counter"], version["stateVersion"]) == (42, 3)
    assert open(file + ".bak", encoding="utf-8").read() == original


def test_an_unreadable_topics_json_is_moved_aside_not_overwritten(store_path, small_config,
                                                                 clock):
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        store.producer("g").send(Message("a", b"x"))
    file = os.path.join(store_path, "config", "topics.json")
    if os.path.exists(file + ".bak"):
        os.remove(file + ".bak")
    with open(file, "w") as fh:
        fh.write("{ this is not json")
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        assert store.topics() == ["a"]  # known from its queue directories
        store.producer("g").send(Message("b", b"y"))
    assert open(file + ".damaged-1").read() == "{ this is not json"
    assert set(json.load(open(file))["topicConfigTable"]) == {"a", "b"}


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                     st.text(max_size=8))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=6), inner, max_size=4),
        st.dictionaries(st.integers(-50, 50), inner, max_size=4)),
    max_leaves=20)


def _stringify_keys(value):
    if isinstance(value, dict):
        return {str(k): _stringify_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stringify_keys(v) for v in value]
    return value


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _values, max_size=5))
def test_fastjson_text_reads_back_leniently(data):
    assert parse_lenient(dumps_fastjson(data)) == _stringify_keys(data)


def test_a_replace_killed_before_its_last_rename_leaves_the_file_in_place(tmp_path, monkeypatch):
    """With a backup kept, the file never goes missing: a process killed after the backup was
    made and before the new file was renamed into place leaves the old file readable (an
    earlier version renamed the file to its backup first, and a reader of that moment, or
    of the store after a kill there, found no file)."""
    from store.files import fileio

    path = str(tmp_path / "book.json")
    fileio.atomic_write(path, b'{"v": 1}', keep_backup=True)
    fileio.atomic_write(path, b'{"v": 2}', keep_backup=True)
    real_replace = os.replace

    def killed_at_the_last_rename(src, dst):
        if dst == path:
            raise KeyboardInterrupt("killed")  # nothing after this line runs
        return real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "replace", killed_at_the_last_rename)
    with pytest.raises(KeyboardInterrupt):
        fileio.atomic_write(path, b'{"v": 3}', keep_backup=True)
    monkeypatch.undo()
    assert open(path, "rb").read() == b'{"v": 2}'
    assert open(path + ".bak", "rb").read() == b'{"v": 2}'
    fileio.atomic_write(path, b'{"v": 4}', keep_backup=True)
    assert open(path, "rb").read() == b'{"v": 4}'
    assert open(path + ".bak", "rb").read() == b'{"v": 2}'
