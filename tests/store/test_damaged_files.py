"""Damaged metadata files and bad arguments give typed errors or are read past, never raw
Python errors (issue: damaged files, full disks and retention, item 7)."""

from __future__ import annotations

import json
import os

import pytest

from store import Message, MessageStore, OffsetOutOfRangeError, StoreError, StoreNotFoundError


@pytest.fixture
def filled(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        p = s.producer("g")
        for i in range(10):
            p.send(Message("orders", b"m%d" % i))
        p.send(Message("orders", b"later"), delay_level=1)
    return store_path


def _bodies(path, config, clock):
    with MessageStore.open(path, config, clock=clock) as s:
        return sorted(v.body for q in s.queue_ids("orders") for v in s.pull("orders", q, 0, 100))


def test_an_abort_marker_that_is_not_text_is_a_crash_marker(filled, small_config, clock):
    with open(os.path.join(filled, "abort"), "wb") as fh:
        fh.write(b"\xff\xfe\x00garbage")
    assert len(_bodies(filled, small_config, clock)) == 10


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8 {", b'{"offsetTable": [1, 2]}',
                                     b'{"offsetTable": {"1": 0}, "deliverMark": "x"}'])
def test_a_damaged_delay_offset_file_is_read_past(filled, small_config, clock, content):
    path = os.path.join(filled, "config", "delayOffset.json")
    for name in (path, path + ".bak"):
        with open(name, "wb") as fh:
            fh.write(content)
    clock.advance(5_000)
    with MessageStore.open(filled, small_config, clock=clock) as s:
        assert s.deliver_due() == 1  # delivered once, from the queue itself
        assert s.deliver_due() == 0
    assert b"later" in _bodies(filled, small_config, clock)


def test_topics_json_of_another_shape_falls_back_to_its_backup(filled, small_config, clock):
    path = os.path.join(filled, "config", "topics.json")
    with open(path, "w") as fh:
        json.dump({"topicConfigTable": ["not", "a", "table"]}, fh)
    assert len(_bodies(filled, small_config, clock)) == 10
    for name in (path, path + ".bak"):  # both damaged: topics come from the queue directories
        with open(name, "w") as fh:
            json.dump([1, 2, 3], fh)
    assert len(_bodies(filled, small_config, clock)) == 10


@pytest.mark.parametrize("offset", [1.5, "0", None, True])
def test_pull_with_an_offset_that_is_not_an_int(filled, small_config, clock, offset):
    with MessageStore.open(filled, small_config, clock=clock) as s:
        with pytest.raises(OffsetOutOfRangeError, match="allowed: an int"):
            s.pull("orders", 0, offset)


def test_opening_a_file_as_a_store(tmp_path):
    path = tmp_path / "a-file"
    path.write_bytes(b"x")
    for read_only in (False, True):
        with pytest.raises(StoreNotFoundError) as info:
            MessageStore.open(str(path), read_only=read_only)
        assert isinstance(info.value, StoreError)
    assert path.read_bytes() == b"x"
