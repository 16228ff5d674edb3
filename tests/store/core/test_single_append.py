"""The single-record path (``StoreCore.append_one``, under ``Producer.send``): the same bytes
as the general path, through segment ends and the writable mappings."""

from __future__ import annotations

import dataclasses
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Message, MessageStore, SendResult, StoreConfig
from store.formats.record_codec import FIELD_OFFSET, RecordSpec, encode_properties
from store.files.consume_queue import ENTRY_SIZE
from store.files.mapped_file import WRITE_WINDOW, MappedFileQueue
from store.formats.message import RESERVED_PROPERTY_NAMES

from conftest import SMALL, FakeClock

_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=12)
#: user property names: any text but RocketMQ's reserved names (a send refuses those)
_NAME = _TEXT.filter(lambda t: t not in RESERVED_PROPERTY_NAMES and not t.startswith("__RMQ"))
#: where the record landed: differs by design (queue ids too when chosen round robin)
_PLACED = {"queue_id": 4, "queue_offset": 8, "physical_offset": 8}


def _raw(store, offset: int) -> bytearray:
    buf, pos, _ = store.commit_log.buffer_at(offset)
    size = int.from_bytes(buf[pos:pos + 4], "big")
    raw = bytearray(buf[pos:pos + size])
    for name, width in _PLACED.items():
        raw[FIELD_OFFSET[name]:FIELD_OFFSET[name] + width] = bytes(width)
    return raw


def _entry(store, topic: str, queue_id: int, queue_offset: int) -> tuple[int, int, int]:
    return store.consume_queue(topic, queue_id).entry(queue_offset)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(body=st.binary(min_size=1, max_size=600), topic=st.sampled_from(["a", "orders", "t-1"]),
       tags=st.none() | _TEXT, user=st.dictionaries(_NAME, _TEXT, max_size=3),
       flag=st.integers(-2**31, 2**31 - 1), queue_id=st.none() | st.integers(0, 3),
       born=st.integers(0, 2**40))
def test_append_one_writes_the_bytes_of_append(fresh_dir, body, topic, tags, user, flag,
                                               queue_id, born):
    clock = FakeClock()
    path = str(fresh_dir("one"))
    cfg = StoreConfig(commitlog_file_size_bytes=4096, consume_queue_file_entries=64)
    with MessageStore.open(path, cfg, clock=clock) as s:
        props = dict(user)
        if tags:
            props["TAGS"] = tags
        props["UNIQ_KEY"] = "0" * 32
        for _ in range(3):  # a few rounds, so that segment ends and blanks come up
            spec = RecordSpec(topic=topic, body=body, properties=props, queue_id=queue_id,
                              flag=flag, born_timestamp_ms=born)
            general = s.append([spec])[0]
            one = s.append_one(topic, body, encode_properties(props), tags, flag, born,
                               queue_id)
            if queue_id is not None:
                assert one.queue_id == general.queue_id == queue_id
            assert _raw(s, one.commitlog_offset) == _raw(s, general.commitlog_offset)
            assert one.store_timestamp_ms == general.store_timestamp_ms == clock()
            assert one.queue_offset == s.max_offset(topic, one.queue_id) - 1
            rec = s.read_record(one.commitlog_offset)
            assert (rec.queue_offset, rec.physical_offset) == (one.queue_offset,
                                                               one.commitlog_offset)
            e_one = _entry(s, topic, one.queue_id, one.queue_offset)
            e_gen = _entry(s, topic, general.queue_id, general.queue_offset)
            assert e_one[0] == one.commitlog_offset and e_one[1:] == e_gen[1:]
            clock.advance(1)


def test_send_builds_the_properties_of_the_general_path(store):
    p = store.producer("g")
    m = Message("props", b"body", tags="TagA", keys=["k1", "k2"], properties={"a": "1", "b": "2"},
                flag=7)
    r = p.send(m)
    assert r == SendResult(r.msg_id, "props", r.queue_id, r.queue_offset, r.commitlog_offset)
    spec = p._spec(m, r.msg_id, 0)
    rec = store.read_record(r.commitlog_offset)
    buf, pos, _ = store.commit_log.buffer_at(r.commitlog_offset)
    raw = bytes(buf[pos:pos + rec.total_size])
    assert raw.endswith(encode_properties(spec.properties))  # the same pairs, in order
    assert rec.flag == 7 and rec.body == b"body"
    view = store.pull("props", r.queue_id, r.queue_offset, 1)[0]
    assert (view.tags, view.keys, view.properties) == ("TagA", ("k1", "k2"), {"a": "1", "b": "2"})
    assert store.consume_queue("props", r.queue_id).entry(r.queue_offset)[2] != 0  # tag hash


def test_sends_across_small_segments_read_back_everywhere(tmp_path):
    path = str(tmp_path / "s")
    cfg = StoreConfig(commitlog_file_size_bytes=4096, consume_queue_file_entries=50)
    sent = []
    with MessageStore.open(path, cfg) as s:
        p = s.producer("g")
        reader = MessageStore.open(path, read_only=True)
        try:
            for i in range(400):
                body = bytes([i % 251]) * (1 + (i * 37) % 300)
                r = p.send(Message("seg", body, keys=f"k{i}"))
                sent.append((r.queue_id, r.queue_offset, body, f"k{i}"))
            for q, off, body, key in sent:  # another process's view, while still open
                v = reader.pull("seg", q, off, 1)[0]
                assert (v.body, v.keys) == (body, (key,))
        finally:
            reader.close()
        assert len(s.commit_log.segment_paths()) > 20
    with MessageStore.open(path, cfg) as s:
        assert not s.recovered
        for q, off, body, key in sent:
            v = s.pull("seg", q, off, 1)[0]
            assert (v.body, v.keys) == (body, (key,))
        assert sum(s.max_offset("seg", q) for q in s.queue_ids("seg")) == 400


def test_mapped_writes_cross_the_window_and_match_pwrite(tmp_path):
    size = 3 * WRITE_WINDOW
    mapped = MappedFileQueue(str(tmp_path / "m"), size)
    plain = MappedFileQueue(str(tmp_path / "p"), size)
    rng = np.random.default_rng(7)
    pos = WRITE_WINDOW - 3000
    while pos < WRITE_WINDOW + 3000:  # records straddle the window boundary
        n = int(rng.integers(1, 700))
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        mapped.write(pos, data, mapped=True)
        plain.write(pos, data)
        pos += n
    a, b = mapped.find(0), plain.find(0)
    assert a.buffer()[:] == b.buffer()[:]
    with open(a.path, "rb") as fh:  # on the file too, not only in this process's mapping
        assert fh.read() == b.buffer()[:]
    mapped.close()
    plain.close()


def test_queue_entries_of_sends_are_those_of_the_general_path(tmp_path):
    clock = FakeClock()
    with MessageStore.open(str(tmp_path / "s"), SMALL, clock=clock) as s:
        p = s.producer("g")
        rs = [p.send(Message("q", b"x" * 10, tags="T"), queue_id=1) for _ in range(30)]
        cq = s.consume_queue("q", 1)
        data = cq.files.find(0).buffer()[:30 * ENTRY_SIZE]
        offsets = [r.commitlog_offset for r in rs]
        assert [r.queue_offset for r in rs] == list(range(30))
        arr = np.frombuffer(data, dtype=">i8,>i4,>i8")
        assert arr["f0"].tolist() == offsets
        assert set(arr["f1"].tolist()) == {s.read_record(offsets[0]).total_size}


def test_append_one_refuses_a_topic_whose_tags_code_has_a_rule(store):
    from store.base.errors import InvalidMessageError

    before = store.confirmed_offset()
    with pytest.raises(InvalidMessageError, match="use append"):
        store.append_one("SCHEDULE_TOPIC_XXXX", b"x", b"")
    assert store.confirmed_offset() == before  # nothing written
    store.append_one("plain", b"x", b"")  # a topic met before a rule is registered ...
    store.register_system_topic("plain", 4, lambda props, ts: 7)
    with pytest.raises(InvalidMessageError):  # ... is checked again afterwards
        store.append_one("plain", b"x", b"")


class GeneralPathMessage(Message):
    """``Producer.send`` takes its general path (a ``RecordSpec``) for a subclass."""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(body=st.binary(min_size=1, max_size=300), tags=st.none() | _TEXT,
       keys=st.none() | _TEXT | st.lists(_TEXT, max_size=2),
       user=st.dictionaries(_NAME, _TEXT, max_size=2), flag=st.integers(-2**31, 2**31 - 1),
       queue=st.sampled_from([("queue_id", 2), ("sharding_key", "order-7"), ("queue_id", 0)]),
       delay=st.sampled_from([("delay_ms", 1), ("delay_ms", 2500), ("deliver_at_ms", 10_000),
                              ("delay_ms", 0), ("deliver_at_ms", -5)]))
def test_timer_and_plain_sends_write_the_bytes_of_the_general_path(
        tmp_path_factory, body, tags, keys, user, flag, queue, delay):
    clock = FakeClock()
    name, value = delay
    if name == "deliver_at_ms":
        value += clock()
    kwargs = {queue[0]: queue[1], name: value}
    with MessageStore.open(str(tmp_path_factory.mktemp("t")), SMALL, clock=clock) as s:
        p = s.producer("g")
        s.id_generator.next_id = lambda now=None: "C0A8000100002A9F0000000000000001"
        fast = p.send(Message("orders", body, tags, keys, user, flag), **kwargs)
        general = p.send(GeneralPathMessage("orders", body, tags, keys, user, flag), **kwargs)
        assert _raw(s, fast.commitlog_offset) == _raw(s, general.commitlog_offset)
        moved = ("commitlog_offset", "queue_offset", "stored_queue_offset")
        assert dataclasses.replace(fast, **{f: 0 for f in moved}) == dataclasses.replace(
            general, **{f: 0 for f in moved})
        assert fast.commitlog_offset < general.commitlog_offset
        if fast.deliver_at_ms is None:
            assert fast.stored_topic is None and fast.queue_offset + 1 == general.queue_offset
        else:
            assert fast.stored_topic == "rmq_sys_wheel_timer" and fast.queue_offset == -1
            assert fast.stored_queue_offset + 1 == general.stored_queue_offset
            clock.advance(20_000)
            assert s.deliver_due() == 2
            views = s.pull("orders", fast.queue_id, 0, 10)
            assert [v.body for v in views] == [body, body]
            assert views[0].msg_id == views[1].msg_id == fast.msg_id
            assert views[0].properties == views[1].properties == user


def test_timer_sends_round_robin_like_plain_ones(store, clock):
    p = store.producer("g")
    count = len(store.queue_ids("rr")) if "rr" in store.topics() else None
    results = [p.send(Message("rr", b"x"), delay_ms=1000) for _ in range(8)]
    count = count or len(store.queue_ids("rr"))
    qids = [r.queue_id for r in results]
    assert sorted(set(qids)) == list(range(min(8, count)))
    assert all(r.deliver_at_ms == clock() + 1000 for r in results)
    clock.advance(5000)
    assert store.deliver_due() == 8
    for r in results:
        v = [v for v in store.pull("rr", r.queue_id, 0, 10) if v.msg_id == r.msg_id]
        assert len(v) == 1


def test_threads_sending_at_once_get_distinct_places_and_ordered_store_times(tmp_path):
    import threading

    cfg = StoreConfig(commitlog_file_size_bytes=64 * 1024, consume_queue_file_entries=100)
    with MessageStore.open(str(tmp_path / "s"), cfg) as s:
        p = s.producer("g")
        results: list = []
        errors: list = []

        def sender(t: int) -> None:
            try:
                for i in range(300):
                    kwargs = {"queue_id": i % 2} if i % 3 == 0 else {}
                    r = p.send(Message("mt", f"{t}-{i}".encode(), tags=f"T{t}"), **kwargs)
                    results.append((t, i, r))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors
        assert len({(r.queue_id, r.queue_offset) for _, _, r in results}) == 1200
        assert len({r.commitlog_offset for _, _, r in results}) == 1200
        assert len({r.msg_id for _, _, r in results}) == 1200
        seen = {}
        for q in s.queue_ids("mt"):
            views = s.pull("mt", q, 0, 2000)
            assert [v.queue_offset for v in views] == list(range(len(views)))
            seen.update({v.msg_id: v for v in views})
        for t, i, r in results:
            v = seen[r.msg_id]
            assert (v.body, v.tags, v.queue_id) == (f"{t}-{i}".encode(), f"T{t}", r.queue_id)
        by_offset = sorted(seen.values(), key=lambda v: v.commitlog_offset)
        times = [v.store_timestamp_ms for v in by_offset]
        assert times == sorted(times)  # taken under the append lock
