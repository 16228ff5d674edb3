"""Bad delay input: each is a clear StoreError or a documented behaviour, never a corrupt store."""

from __future__ import annotations

import pytest

from store import InvalidDelayError, InvalidMessageError, Message, StoreError


def _all(store, topic):
    out = []
    for q in store.queue_ids(topic):
        out.extend(store.pull(topic, q, 0, 1000))
    return out


@pytest.mark.parametrize("kwargs, match", [
    ({"delay_level": 2, "delay_ms": 1000}, "delay_level and delay_ms"),
    ({"delay_ms": 1000, "deliver_at_ms": 5}, "delay_ms and deliver_at_ms"),
    ({"delay_ms": -1}, "delay_ms=-1"),
    ({"deliver_at_ms": -5}, "deliver_at_ms=-5"),
    ({"delay_level": -2}, "delay_level=-2"),
    ({"delay_ms": "10"}, "delay_ms='10'"),
    ({"delay_ms": 10**15}, "timer_max_delay_ms"),
])
def test_refused_delays(store, kwargs, match):
    with pytest.raises(InvalidDelayError, match=match) as info:
        store.producer("g").send(Message("t", b"x"), **kwargs)
    assert isinstance(info.value, StoreError)


def test_store_still_works_after_refusals(store, clock):
    p = store.producer("g")
    for kwargs in ({"delay_ms": -1}, {"delay_level": 1, "delay_ms": 5}):
        with pytest.raises(InvalidDelayError):
            p.send(Message("t", b"bad"), **kwargs)
    p.send(Message("t", b"good"), delay_ms=300)
    clock.advance(400)
    assert store.deliver_due() == 1
    assert [v.body for v in _all(store, "t")] == [b"good"]


def test_a_batch_cannot_be_delayed(store):
    p = store.producer("g")
    with pytest.raises(TypeError):
        p.send_batch([Message("t", b"a")], delay_ms=1000)  # no such argument
    results = p.send_batch([Message("t", b"a"), Message("t", b"b")])
    assert all(r.deliver_at_ms is None and r.topic == "t" for r in results)


def test_past_and_zero_delays_deliver_at_once(store, clock):
    p = store.producer("g")
    a = p.send(Message("t", b"past"), deliver_at_ms=clock() - 1)
    b = p.send(Message("t", b"now"), deliver_at_ms=clock())
    c = p.send(Message("t", b"zero"), delay_ms=0)
    d = p.send(Message("t", b"level0"), delay_level=0)
    assert {r.topic for r in (a, b, c, d)} == {"t"}
    assert sorted(v.body for v in _all(store, "t")) == [b"level0", b"now", b"past", b"zero"]


def test_cancel_of_an_unknown_id_returns_false(store, clock):
    p = store.producer("g")
    r = p.send(Message("t", b"x"), delay_ms=1000)
    assert p.cancel("t", "not-an-id") is False
    assert p.cancel("t", r.msg_id[:-1] + ("0" if r.msg_id[-1] != "0" else "1")) is False
    assert p.cancel("nosuchtopic", r.msg_id) is False
    for bad in (("t", 5), (None, r.msg_id), ("t", "")):
        with pytest.raises(InvalidMessageError):
            p.cancel(*bad)
    clock.advance(1_100)
    assert store.deliver_due() == 1


def test_properties_must_leave_room_for_delivery(store, clock):
    from store import MessageTooLargeError

    p = store.producer("g")
    big = {"p": "x" * 32_600}
    with pytest.raises(MessageTooLargeError, match="delivery bookkeeping"):
        p.send(Message("t", b"x", properties=big), delay_ms=1_000)
    with pytest.raises(MessageTooLargeError, match="delivery bookkeeping"):
        p.send(Message("t", b"x", properties=big), delay_level=1)
    near = {"p": "x" * 32_300}  # fits with the headroom: delivered with its bookkeeping
    p.send(Message("t", b"x", properties=near), delay_ms=1_000)
    clock.advance(1_100)
    assert store.deliver_due() == 1
    [v] = _all(store, "t")
    assert v.properties == near
