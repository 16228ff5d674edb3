"""4.x delay levels: SCHEDULE_TOPIC_XXXX queues, clamping, delivery, delayOffset.json."""

from __future__ import annotations

import os

import pytest
from queue_reading import visible  # noqa: E402  (tests/ helper)

from store import InvalidDelayError, Message, MessageStore
from store.delayed.delay_levels import deliver_time, read_lenient_json
from store.formats.message import SCHEDULE_TOPIC


def test_level_goes_to_its_queue_with_the_due_time_as_tags_code(store, clock):
    p = store.producer("g")
    r = p.send(Message("orders", b"x", tags="TagA"), delay_level=3)
    assert (r.stored_topic, r.stored_queue_id) == (SCHEDULE_TOPIC, 2)
    assert (r.topic, r.queue_offset) == ("orders", -1)  # the user's topic; offset once due
    assert r.queue_id in store.queue_ids("orders") and r.stored_queue_offset == 0
    rec = store.read_record(r.commitlog_offset)
    assert rec.properties["DELAY"] == "3" and rec.properties["REAL_TOPIC"] == "orders"
    entry = store.queue_entries(SCHEDULE_TOPIC, 2, 0, 1)
    assert int(entry["tags_code"][0]) == rec.store_timestamp_ms + 10_000 == r.deliver_at_ms
    assert deliver_time(store.config.delay_levels_ms, 0, 5) == 1005  # unknown level: +1 s


def test_invisible_before_due_then_visible_once(store, clock):
    p = store.producer("g")
    r = p.send(Message("orders", b"hello", tags="t", keys="k", properties={"a": "b"}),
               delay_level=2)
    clock.advance(4_999)
    assert store.deliver_due() == 0 and visible(store, "orders") == []
    clock.advance(1)
    assert store.deliver_due() == 1
    [v] = visible(store, "orders")
    assert (v.body, v.tags, v.keys, dict(v.properties)) == (b"hello", "t", ("k",), {"a": "b"})
    assert v.msg_id == r.msg_id and v.deliver_timestamp_ms == r.deliver_at_ms == clock()
    assert v.store_timestamp_ms == clock()
    # RocketMQ keeps DELAY/REAL_* in the stored record; users never see them
    assert v.system_properties["DELAY"] == "2"
    clock.advance(10_000)
    assert store.deliver_due() == 0 and len(visible(store, "orders")) == 1


def test_level_above_the_table_is_clamped(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config.replace(message_delay_level="5s 8s"),
                          clock=clock)
    r = s.producer("g").send(Message("t", b"x"), delay_level=3)
    assert r.stored_queue_id == 1 and r.deliver_at_ms == clock() + 8_000
    clock.advance(7_999)
    assert s.deliver_due() == 0
    clock.advance(1)
    assert s.deliver_due() == 1
    s.close()


def test_levels_are_delivered_in_due_order_and_independently(store, clock):
    p = store.producer("g")
    for level in (1, 2, 1, 3, 2, 1):
        p.send(Message("t", str(level).encode()), delay_level=level)
    clock.advance(1_000)
    assert store.deliver_due() == 3
    clock.advance(4_000)
    assert store.deliver_due() == 2
    clock.advance(5_000)
    assert store.deliver_due() == 1
    views = visible(store, "t")
    assert sorted(v.body for v in views) == [b"1", b"1", b"1", b"2", b"2", b"3"]
    assert all(v.store_timestamp_ms >= v.deliver_timestamp_ms for v in views)


def test_invalid_levels(store):
    p = store.producer("g")
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(InvalidDelayError):
            p.send(Message("t", b"x"), delay_level=bad)
    with pytest.raises(InvalidDelayError):
        store.delay_levels.rewrite(None, 0)
    r = p.send(Message("t", b"x"), delay_level=0)  # 0: no delay
    assert r.topic == "t"


def test_delay_offsets_survive_restart(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(3):
        p.send(Message("t", str(i).encode()), delay_level=1)
    p.send(Message("t", b"later"), delay_level=4)
    clock.advance(1_000)
    assert s.deliver_due() == 3
    s.close()
    text = open(os.path.join(store_path, "config", "delayOffset.json")).read()
    assert '\t"offsetTable":{\n\t\t1:3\n\t}' in text  # fastjson's text, as RocketMQ writes it
    data = read_lenient_json(os.path.join(store_path, "config", "delayOffset.json"))
    assert data["offsetTable"] == {"1": 3} and data["deliverMark"] == -1
    s = MessageStore.open(store_path, small_config, clock=clock)
    assert s.delay_levels.offsets() == {1: 3}
    assert s.deliver_due() == 0
    clock.advance(30_000)
    assert s.deliver_due() == 1
    assert len(visible(s, "t")) == 4
    s.close()


def test_fastjson_file_with_bare_integer_keys_and_out_of_range_offsets(store_path, clock,
                                                                       small_config):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(4):
        p.send(Message("t", str(i).encode()), delay_level=1)
    s.close()
    # RocketMQ writes {1:2} unquoted; offset 99 on level 2 lies beyond its (empty) queue
    path = os.path.join(store_path, "config", "delayOffset.json")
    # a broker's store: rmq never saved its delayOffset.json (no owner mark), so the offsets
    # are RocketMQ's progress (its copies carry no origin to check them against)
    os.remove(path + ".rmq")
    with open(path, "w") as fh:
        fh.write('{"offsetTable":{1:2,2:99},"dataVersion":{"counter":5},"deliverMark":-1}')
    assert read_lenient_json(path)["offsetTable"] == {"1": 2, "2": 99}
    s = MessageStore.open(store_path, small_config, clock=clock)
    clock.advance(1_000)
    assert s.deliver_due() == 2  # entries 2 and 3 of level 1
    assert sorted(v.body for v in visible(s, "t")) == [b"2", b"3"]
    p = s.producer("g")
    p.send(Message("t", b"level2"), delay_level=2)
    clock.advance(5_000)
    # level 2's saved offset lay past its queue (a file of another store, a restored backup):
    # the level restarted from its first entry instead of skipping every message sent to it
    assert s.deliver_due() == 1
    s.close()


def test_lost_progress_file_redelivers_nothing(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(5):
        p.send(Message("t", str(i).encode()), delay_level=1)
    clock.advance(1_000)
    assert s.deliver_due() == 5
    for i in range(2):
        p.send(Message("t", f"new{i}".encode()), delay_level=1)
    s.close()
    os.remove(os.path.join(store_path, "config", "delayOffset.json"))
    os.remove(os.path.join(store_path, "config", "delayOffset.json.bak"))
    s = MessageStore.open(store_path, small_config, clock=clock)
    clock.advance(1_000)
    assert s.deliver_due() == 2
    assert len(visible(s, "t")) == 7
    s.close()


def test_real_topic_of_the_half_topic_is_dropped(store, clock):
    from store.formats.record_codec import RecordSpec

    spec = RecordSpec(topic="RMQ_SYS_TRANS_HALF_TOPIC", body=b"x", properties={"UNIQ_KEY": "A"})
    spec, _ = store.delay_levels.rewrite(spec, 1)
    store.append([spec])
    clock.advance(1_000)
    assert store.deliver_due() == 0


def test_send_result_due_time_is_the_records_exact_due_time(store_path, small_config):
    """Under contention the store time comes after the send began: the result's
    ``deliver_at_ms`` is the record's due time (its tagsCode), not the send's start + delay."""
    ticks = iter(range(1_700_000_000_000, 1_800_000_000_000, 37))  # every call 37 ms later

    s = MessageStore.open(store_path, small_config, clock=lambda: next(ticks))
    r = s.producer("g").send(Message("orders", b"x"), delay_level=2)  # 5 s
    rec = s.read_record(r.commitlog_offset)
    entry = s.queue_entries(SCHEDULE_TOPIC, 1, r.stored_queue_offset, r.stored_queue_offset + 1)
    assert r.deliver_at_ms == int(entry["tags_code"][0]) == rec.store_timestamp_ms + 5_000
    s.close()
