"""Ordered messages: the queue chosen by ``queue_id`` or by a ``sharding_key`` hashed to a
queue (RocketMQ's SelectMessageQueueByHash), for send, send_batch, send_table and the sink."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from queue_reading import visible  # noqa: E402  (tests/ helper)

from store import InvalidMessageError, Message, MessageStore, java_string_hash
from store.formats.message import sharding_queue


def _java_queue(key: str, count: int) -> int:
    value = java_string_hash(key)
    # Java: int value = hashCode % size; if (value < 0) value = Math.abs(value)
    rem = abs(value) % count * (1 if value >= 0 else -1)
    return abs(rem)


def test_sharding_queue_is_rocketmqs_hash_selector():
    for key in ("order-1", "order-2", "", "ü", "a" * 40, "polygenelubricants"):
        for count in (1, 3, 4, 16):
            assert sharding_queue(key, count) == _java_queue(key, count)
    assert java_string_hash("polygenelubricants") == -(2**31)  # the one hash abs() keeps < 0


def test_send_with_a_sharding_key_keeps_each_key_in_one_queue(store, clock):
    p = store.producer("g")
    for i in range(10):
        for k in ("order-1", "order-2", "order-3"):
            r = p.send(Message("orders", f"{k}-{i}".encode()), sharding_key=k)
            assert r.queue_id == sharding_queue(k, 4)
    by_key = {}
    for v in visible(store, "orders"):
        key = v.body.decode().rsplit("-", 1)[0]
        by_key.setdefault(key, []).append(v)
    for key, views in by_key.items():
        assert {v.queue_id for v in views} == {sharding_queue(key, 4)}
        order = [int(v.body.decode().rsplit("-", 1)[1]) for v in
                 sorted(views, key=lambda v: v.queue_offset)]
        assert order == list(range(10))


def test_queue_id_and_its_errors(store, clock):
    p = store.producer("g")
    r = p.send(Message("orders", b"x"), queue_id=3)
    assert r.queue_id == 3 and store.max_offset("orders", 3) == 1
    with pytest.raises(InvalidMessageError, match="allowed: an int from 0 to 3"):
        p.send(Message("orders", b"x"), queue_id=4)
    with pytest.raises(InvalidMessageError, match="both given"):
        p.send(Message("orders", b"x"), queue_id=1, sharding_key="k")
    with pytest.raises(InvalidMessageError, match="sharding_key"):
        p.send(Message("orders", b"x"), sharding_key="")
    batch = p.send_batch([Message("orders", b"b%d" % i) for i in range(5)], queue_id=2)
    assert {r.queue_id for r in batch} == {2}
    batch = p.send_batch([Message("orders", b"s%d" % i) for i in range(5)], sharding_key="zz")
    assert {r.queue_id for r in batch} == {sharding_queue("zz", 4)}


def test_a_delayed_message_surfaces_in_its_chosen_queue(store, clock):
    p = store.producer("g")
    timer = p.send(Message("orders", b"t"), delay_ms=1_000, sharding_key="order-9")
    level = p.send(Message("orders", b"l"), delay_level=1, queue_id=1)
    assert (timer.queue_id, level.queue_id) == (sharding_queue("order-9", 4), 1)
    clock.advance(2_000)
    assert store.deliver_due() == 2
    got = {v.body: v.queue_id for v in visible(store, "orders")}
    assert got == {b"t": sharding_queue("order-9", 4), b"l": 1}


def test_send_table_columns(store, clock):
    p = store.producer("g")
    keys = ["a", "b", None, "a", "c", "b", "a", None]
    out = p.send_table(pa.table({"body": [f"{i}".encode() for i in range(8)],
                                 "sharding_key": keys}), topic="orders")
    qids = out.column("queue_id").to_pylist()
    for i, k in enumerate(keys):
        if k is not None:
            assert qids[i] == sharding_queue(k, 4)
    a_rows = [i for i, k in enumerate(keys) if k == "a"]
    offsets = out.column("queue_offset").to_pylist()
    assert [offsets[i] for i in a_rows] == sorted(offsets[i] for i in a_rows)  # table order
    out = p.send_table(pa.table({"topic": ["orders", "fresh"], "body": [b"x", b"y"],
                                 "queue_id": pa.array([2, None], pa.int16())}))
    assert out.column("queue_id").to_pylist()[0] == 2
    for table, match in (
        (pa.table({"body": [b"x"], "queue_id": [7]}), "row 0: queue_id=7 .* allowed: 0 to 3"),
        (pa.table({"body": [b"x"], "queue_id": ["1"]}), "integer type"),
        (pa.table({"body": [b"x"], "sharding_key": [""]}), "row 0: sharding_key is empty"),
        (pa.table({"body": [b"x"], "sharding_key": ["k"], "queue_id": [1]}), "both given"),
    ):
        with pytest.raises(InvalidMessageError, match=match):
            p.send_table(table, topic="orders")


def test_the_sink_places_rows_by_key(store, clock):
    sink = store.sink("orders-sink")
    table = pa.table({"topic": ["orders"] * 6, "body": [b"%d" % i for i in range(6)],
                      "sharding_key": ["k1", "k2", "k1", "k2", "k1", None]})
    txs = sink.stage(table)
    sink.commit(0, txs)
    views = visible(store, "orders")
    assert len(views) == 6
    for v in views:
        i = int(v.body)
        key = table.column("sharding_key")[i].as_py()
        if key is not None:
            assert v.queue_id == sharding_queue(key, 4)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["o1", "o2", "o3", "o4", "o5", None]), min_size=1, max_size=60))
def test_every_keys_rows_share_a_queue_in_order(fresh_dir, keys):
    path = fresh_dir("ordered")
    with MessageStore.open(str(path)) as store:
        p = store.producer("g")
        p.send_table(pa.table({"body": [b"%d" % i for i in range(len(keys))],
                               "sharding_key": pa.array(keys, pa.string())}), topic="t")
        seen = {}
        for v in sorted(visible(store, "t"), key=lambda v: (v.queue_id, v.queue_offset)):
            i = int(v.body)
            if keys[i] is not None:
                seen.setdefault(keys[i], []).append((v.queue_id, i))
        for key, rows in seen.items():
            assert {q for q, _ in rows} == {sharding_queue(key, 4)}
            assert [i for _, i in rows] == [i for i, k in enumerate(keys) if k == key]
