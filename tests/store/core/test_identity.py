"""A store removed or replaced under a process that has it open (store.core.identity).

The process stops writing to it (StoreReplacedError), and nothing it wrote before noticing
is adopted by the store now at that path: progress files name their store, and one that
names another store, or points past what it derives from, is rebuilt from the CommitLog.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from conftest import SMALL, FakeClock

from store import Message, MessageStore, StoreReplacedError
from store.core.identity import is_store_id, store_tag
from store.core.store_layout import layout_crc
from store.files.broker_files import read_lenient_json, write_config
from store.timer import timer_checkpoint as ckpt


def _bodies(store: MessageStore, topic: str) -> list[bytes]:
    if topic not in store.topics():
        return []
    out = []
    for q in store.queue_ids(topic):
        out += [v.body for v in store.pull(topic, q, 0, store.max_offset(topic, q) + 1)]
    return sorted(out)


def _send_delayed(store: MessageStore, tag: bytes) -> None:
    p = store.producer("g")
    p.send(Message("t", tag + b"-timer"), delay_ms=2_000)
    p.send(Message("t", tag + b"-level"), delay_level=1)


def _remove(path: str) -> None:
    """``rm -rf`` of a store a process still has open: its background threads (the flush,
    the key index builder: until they notice the removal) may create a file while it runs,
    and ``rmtree`` then fails on a directory not empty, as ``rm -rf`` would; run again."""
    for attempt in range(5):
        try:
            shutil.rmtree(path)
            return
        except OSError:
            if attempt == 4:
                raise
            time.sleep(0.05)


def _config_files(path: str) -> dict[str, bytes]:
    root = os.path.join(path, "config")
    out = {}
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb") as fh:
            out[name] = fh.read()
    return out


def test_a_new_store_records_an_id_that_survives_reopen(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, SMALL) as store:
        first = store.store_id
    assert is_store_id(first)
    with MessageStore.open(path, SMALL) as store:
        assert store.store_id == first
    with MessageStore.open(path, SMALL, read_only=True) as reader:
        assert reader.store_id == first


def test_a_store_of_an_older_version_gets_an_id_and_keeps_its_progress(tmp_path):
    path, clock = str(tmp_path / "s"), FakeClock()
    with MessageStore.open(path, SMALL, clock=clock) as store:
        _send_delayed(store, b"old")
    # what an older rmq left: no id in store.json, untagged progress files
    for name in ("store.json", "store.json.bak"):
        p = os.path.join(path, "config", name)
        data = json.load(open(p))
        data.pop("store_id")
        data.pop("format_version")
        data["layout_crc32"] = layout_crc(data["layout"])
        json.dump(data, open(p, "w"))
    p = os.path.join(path, "config", "delayOffset.json")
    data = read_lenient_json(p)
    data.pop("storeId")
    write_config(p, data)
    state = ckpt.load(os.path.join(path, "config", "timercheck"))
    state.store_tag = 0
    ckpt.save(os.path.join(path, "config", "timercheck"), state)
    clock.advance(3_000)
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert is_store_id(store.store_id)
        assert store.format_version == 1
        assert store.deliver_due() == 2
        assert _bodies(store, "t") == [b"old-level", b"old-timer"]
        assert store.deliver_due() == 0


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_process_stops_writing_to_a_replaced_or_removed_store(tmp_path, how):
    path, clock = str(tmp_path / "s"), FakeClock()
    old = MessageStore.open(path, SMALL, clock=clock)
    producer = old.producer("g")
    _send_delayed(old, b"old")
    _remove(path)
    new = None
    if how == "replaced":
        new = MessageStore.open(path, SMALL, clock=clock)
        _send_delayed(new, b"new")
        new.close()
        before = _config_files(path)
    clock.advance(3_000)
    with pytest.raises(StoreReplacedError, match="was removed" if how == "removed"
                       else "replaced by another store"):
        producer.send(Message("t", b"lost"))
    with pytest.raises(StoreReplacedError):  # and every later write, at once
        old.deliver_due()
    with pytest.raises(StoreReplacedError):
        old.producer("g2")
    old.close()  # releases what it holds, writes nothing
    if how == "removed":
        assert not os.path.exists(path)
        return
    assert _config_files(path) == before
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert store.deliver_due() == 2
        assert _bodies(store, "t") == [b"new-level", b"new-timer"]


def test_progress_files_of_another_store_are_rebuilt_not_adopted(tmp_path):
    """What a process that had the old store open wrote into the new one before it noticed
    (the race the identity check cannot close): the new store delivers its own messages
    once, on time, and says why it rebuilt."""
    clock = FakeClock()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with MessageStore.open(a, SMALL, clock=clock) as store:
        for i in range(20):  # the old store's progress is far ahead of the new one's
            _send_delayed(store, b"a%d" % i)
        clock.advance(3_000)
        assert store.deliver_due() == 40
    with MessageStore.open(b, SMALL, clock=clock) as store:
        _send_delayed(store, b"b")
    for name in ("timercheck", "delayOffset.json", "delayOffset.json.bak", "queueTable.json"):
        src = os.path.join(a, "config", name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(b, "config", name))
    clock.advance(500)
    with MessageStore.open(b, SMALL, clock=clock) as store:
        # what rmq stats / rmq pending report: both messages pending, not none
        assert store.pending_delayed_stats()["pending"] == 2
        assert store.deliver_due() == 0  # not due yet: nothing early
        clock.advance(2_000)
        assert store.deliver_due() == 2
        assert store.deliver_due() == 0
        assert _bodies(store, "t") == [b"b-level", b"b-timer"]
        assert ckpt.load(os.path.join(b, "config", "timercheck")).store_tag == \
            store_tag(store.store_id)


@pytest.mark.parametrize("field", ["last_timer_queue_offset", "last_timer_log_flush_pos"])
def test_a_timer_checkpoint_pointing_past_its_files_is_rebuilt(tmp_path, field):
    path, clock = str(tmp_path / "s"), FakeClock()
    with MessageStore.open(path, SMALL, clock=clock) as store:
        store.producer("g").send(Message("t", b"x"), delay_ms=2_000)
    check = os.path.join(path, "config", "timercheck")
    state = ckpt.load(check)
    setattr(state, field, 10_000_000)
    ckpt.save(check, state)
    clock.advance(3_000)
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert store.deliver_due() == 1
        assert _bodies(store, "t") == [b"x"]


def test_delay_level_offsets_past_their_queue_are_rebuilt(tmp_path):
    path, clock = str(tmp_path / "s"), FakeClock()
    with MessageStore.open(path, SMALL, clock=clock) as store:
        store.producer("g").send(Message("t", b"x"), delay_level=1)
    p = os.path.join(path, "config", "delayOffset.json")
    text = open(p).read()
    data = json.loads(text.replace("{1:", '{"1":')) if "{1:" in text else json.loads(text)
    data["offsetTable"] = {"1": 500}
    open(p, "w").write(json.dumps(data))
    clock.advance(2_000)
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert store.deliver_due() == 1
        assert _bodies(store, "t") == [b"x"]


def test_the_key_index_builder_writes_nothing_into_a_store_that_replaced_its_own(tmp_path):
    """The message-key index is built behind the sends by a thread of the writing process
    (index files and index.lock by path): once the store it opened was replaced, it stops
    and writes nothing into the new one."""
    path, clock = str(tmp_path / "s"), FakeClock()
    old = MessageStore.open(path, SMALL, clock=clock)
    old.key_indexer.stop()  # the builder's next pass, run by hand below
    p = old.producer("g")
    for i in range(50):
        p.send(Message("t", b"old%d" % i, keys=f"k{i}"))
    shutil.rmtree(path)
    with MessageStore.open(path, SMALL, clock=clock) as new:
        new.producer("g").send(Message("t", b"new", keys="k-new"))

    def files() -> dict[str, bytes]:
        out = {}
        for d, _, names in os.walk(path):
            for name in names:
                with open(os.path.join(d, name), "rb") as fh:
                    out[os.path.relpath(os.path.join(d, name), path)] = fh.read()
        return out

    before = files()
    assert old.key_index.build(old.confirmed_offset()) is False
    assert not old.key_index.enabled
    assert files() == before
    old.close()
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert [v.body for v in store.query_messages("t", key="k-new")] == [b"new"]
        assert store.query_messages("t", key="k1") == []
