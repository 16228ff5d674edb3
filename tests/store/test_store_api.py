"""The store's read API: pull, min/max, offset_for_timestamp, topics, read-only opens."""

from __future__ import annotations

import pytest

from store import (InvalidMessageError, Message, MessageStore, OffsetOutOfRangeError,
                   StoreClosedError, StoreConfig, StoreNotFoundError, UnknownTopicError)


def test_pull_min_max(store, clock):
    p = store.producer("g")
    sent = []
    for i in range(40):
        clock.advance(5)
        sent.append(p.send(Message("orders", f"o{i}".encode(), tags="created", keys=f"o-{i}",
                                   properties={"k": str(i)})))
    q0 = [r for r in sent if r.queue_id == 0]
    assert store.min_offset("orders", 0) == 0
    assert store.max_offset("orders", 0) == len(q0) == 10
    views = store.pull("orders", 0, 0, 100)
    assert [v.msg_id for v in views] == [r.msg_id for r in q0]
    v = views[3]
    i = sent.index(q0[3])
    assert (v.topic, v.queue_id, v.queue_offset) == ("orders", 0, 3)
    assert v.body == f"o{i}".encode() and v.tags == "created" and v.keys == (f"o-{i}",)
    assert v.properties == {"k": str(i)}  # system properties hidden
    assert v.system_properties["UNIQ_KEY"] == v.msg_id
    assert v.born_timestamp_ms == v.store_timestamp_ms == 1_700_000_000_000 + 5 * (i + 1)
    assert v.deliver_timestamp_ms is None and v.transaction_id is None
    assert v.reconsume_times == 0 and v.commitlog_offset == q0[3].commitlog_offset
    # paging and the end of the queue
    assert [x.queue_offset for x in store.pull("orders", 0, 4, 3)] == [4, 5, 6]
    assert store.pull("orders", 0, 10) == []
    with pytest.raises(OffsetOutOfRangeError) as info:
        store.pull("orders", 0, 11)
    assert "0 to 10" in str(info.value)
    with pytest.raises(OffsetOutOfRangeError):
        store.pull("orders", 0, -1)
    with pytest.raises(InvalidMessageError):
        store.pull("orders", 0, 0, max_messages=0)


def test_offset_for_timestamp(store, clock):
    p = store.producer("g")
    stamps = []
    for i in range(30):
        clock.advance(10)
        stamps.append(clock())
        p.send(Message("ts", str(i).encode()))
        if i == 15:  # three messages sharing one store time
            p.send(Message("ts", b"same1"))
            p.send(Message("ts", b"same2"))
    q = 0
    views = store.pull("ts", q, 0, 100)
    times = [v.store_timestamp_ms for v in views]
    for k, v in enumerate(views):
        # exact: the first message stored at that time (the leftmost of equal times)
        assert store.offset_for_timestamp("ts", q, v.store_timestamp_ms) == times.index(times[k])
        # 2 ms earlier: still that message (nothing is stored in between)
        assert store.offset_for_timestamp("ts", q, v.store_timestamp_ms - 2) == times.index(
            times[k])
    assert store.offset_for_timestamp("ts", q, 0) == 0  # far earlier: the first entry
    assert store.offset_for_timestamp("ts", q, stamps[-1] + 1) == store.max_offset("ts", q)
    # an empty queue of an existing topic answers 0
    store.producer("g").send(Message("one", b"x"))
    empty = [qid for qid in store.queue_ids("one") if store.max_offset("one", qid) == 0][0]
    assert store.offset_for_timestamp("one", empty, clock()) == 0


def test_topics_and_queue_ids(store):
    p = store.producer("g")
    for t in ("b-topic", "a-topic", "c|x"):
        p.send(Message(t, b"x"))
    names = store.topics()
    assert {"a-topic", "b-topic", "c|x"} <= set(names) and names == sorted(names)
    assert store.queue_ids("a-topic") == [0, 1, 2, 3]
    assert not any(t.startswith("rmq_sys_") or t == "SCHEDULE_TOPIC_XXXX" for t in names)


@pytest.mark.parametrize("call", [
    lambda s: s.queue_ids("missing"),
    lambda s: s.max_offset("missing", 0),
    lambda s: s.min_offset("missing", 0),
    lambda s: s.pull("missing", 0, 0),
    lambda s: s.offset_for_timestamp("missing", 0, 0),
    lambda s: s.pull("known", 9, 0),
    lambda s: s.max_offset("known", -1),
    lambda s: s.max_offset("known", "0"),
])
def test_unknown_topics_and_queues_are_typed_errors(store, call):
    store.producer("g").send(Message("known", b"x"))
    with pytest.raises(UnknownTopicError) as info:
        call(store)
    assert "missing" in str(info.value) or "queue_id" in str(info.value)


def test_closed_store_refuses_use(store_path, small_config):
    s = MessageStore.open(store_path, small_config)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.pull("t", 0, 0)
    with pytest.raises(StoreClosedError):
        s.producer("g")


def test_read_only_open(store_path, small_config, clock, tmp_path):
    with pytest.raises(StoreNotFoundError):
        MessageStore.open(str(tmp_path / "nothing"), read_only=True)
    writer = MessageStore.open(store_path, small_config, clock=clock)
    p = writer.producer("g")
    first = p.send(Message("ro", b"1"))
    reader = MessageStore.open(store_path, read_only=True)  # no config: the recorded layout
    try:
        assert reader.config.commitlog_file_size_bytes == small_config.commitlog_file_size_bytes
        assert reader.pull("ro", first.queue_id, 0)[0].body == b"1"
        # a reader sees what the writer appends later, new segments and topics included
        for i in range(600):
            p.send(Message("ro", b"y" * 150))
        p.send(Message("later", b"z"))
        assert "later" in reader.topics()
        assert sum(reader.max_offset("ro", q) for q in reader.queue_ids("ro")) == 601
        with pytest.raises(StoreClosedError):
            reader.producer("g").send(Message("ro", b"no"))
        with pytest.raises(StoreClosedError):
            reader.write_lock()
    finally:
        reader.close()
        writer.close()


def test_messages_to_three_topics_read_back_identically(tmp_path):
    """100,000 messages to three topics, reopen, every one read back in queue order."""
    path = str(tmp_path / "big")
    cfg = StoreConfig(commitlog_file_size_bytes=4 * 1024 * 1024)
    topics = ("orders", "payments", "shipments")
    sent = {}
    with MessageStore.open(path, cfg) as s:
        p = s.producer("done-when")
        n = 0
        while n < 100_000:
            t = topics[(n // 1000) % 3]
            msgs = [Message(t, f"{t}-{n + i}".encode() * (1 + (n + i) % 5),
                            tags=("created", "paid", None)[(n + i) % 3],
                            keys=[f"k{n + i}", f"g{(n + i) % 7}"] if (n + i) % 4 else None,
                            properties={"seq": str(n + i), "t": t} if (n + i) % 2 else {})
                    for i in range(1000)]
            if n % 10_000 == 0:  # some single sends among the batches
                results = [p.send(m) for m in msgs[:50]] + p.send_batch(msgs[50:])
            else:
                results = p.send_batch(msgs)
            for m, r in zip(msgs, results):
                sent.setdefault((r.topic, r.queue_id), []).append((r, m))
            n += 1000
    with MessageStore.open(path, cfg) as s:
        total = 0
        for (t, q), rows in sent.items():
            assert s.max_offset(t, q) == len(rows)
            assert [r.queue_offset for r, _ in rows] == list(range(len(rows)))
            views = []
            while len(views) < len(rows):
                views += s.pull(t, q, len(views), 4096)
            for v, (r, m) in zip(views, rows):
                assert v.msg_id == r.msg_id and v.body == m.body and v.tags == m.tags
                assert v.keys == tuple(m.key_list()) and v.properties == m.properties
            total += len(views)
        assert total == 100_000
