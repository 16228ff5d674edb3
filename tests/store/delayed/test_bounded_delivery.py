"""``deliver_due(max_messages=...)``: bounded runs drain everything, exactly once, never early."""

from __future__ import annotations

import pytest

from store import Message, MessageStore
from store.delayed import restore as bulk
from store.timer import timer_checkpoint as ckpt


def _all(store, topic):
    out = []
    for q in sorted(store.queue_ids(topic)):
        offset = 0
        while batch := store.pull(topic, q, offset, 1000):
            out.extend(batch)
            offset += len(batch)
    return out


def _send_burst(store, clock):
    """300 messages in one slot (a cancel marker last), 40 in a later slot, 30 on level 2."""
    p = store.producer("g")
    one = [p.send(Message("t", b"a%d" % i), delay_ms=1_050) for i in range(300)]
    for i in range(40):
        p.send(Message("t", b"b%d" % i), delay_ms=1_250)
    for i in range(30):
        p.send(Message("lv", b"c%d" % i), delay_level=2)
    assert p.cancel("t", one[3].msg_id)  # its marker is the slot's last unit
    assert store.deliver_due() == 0  # into the wheel
    return b"a3"


def _drain(store, max_messages):
    counts = []
    while n := store.deliver_due(max_messages=max_messages):
        assert n <= max_messages
        counts.append(n)
    return counts


def test_bounded_runs_deliver_each_message_once_and_in_order(tmp_path, clock, small_config):
    ref = MessageStore.open(str(tmp_path / "ref"), small_config, clock=clock)
    bounded = MessageStore.open(str(tmp_path / "bounded"), small_config, clock=clock)
    cancelled = _send_burst(ref, clock)
    _send_burst(bounded, clock)
    clock.advance(60_000)
    assert ref.deliver_due() == 369
    counts = _drain(bounded, 37)
    assert sum(counts) == 369 and len(counts) >= 369 // 37
    for topic in ("t", "lv"):
        want = [(v.queue_id, v.queue_offset, v.body) for v in _all(ref, topic)]
        got = [(v.queue_id, v.queue_offset, v.body) for v in _all(bounded, topic)]
        assert got == want  # same messages, same queues, same order
    bodies = [v.body for v in _all(bounded, "t")]
    assert len(bodies) == len(set(bodies)) == 339 and cancelled not in bodies
    for v in _all(bounded, "t") + _all(bounded, "lv"):
        assert v.store_timestamp_ms >= v.deliver_timestamp_ms  # never early
    assert bounded.timer.pending_count() == 0 and bounded.delay_levels.pending_count() == 0
    ref.close()
    bounded.close()


def test_a_split_slot_resumes_after_reopen_and_not_before_due(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(100):
        p.send(Message("t", b"%d" % i), delay_ms=2_050)
    s.deliver_due()
    clock.advance(1_000)
    assert s.deliver_due(max_messages=10) == 0  # not due yet: nothing, early or not
    clock.advance(2_000)
    assert s.deliver_due(max_messages=30) == 30
    state = ckpt.load(s.timer._check_path)
    assert state.slot_done == 30 and state.deliver_mark == -1
    s.close()
    s = MessageStore.open(store_path, small_config, clock=clock)
    assert s.deliver_due(max_messages=50) == 50
    assert s.deliver_due() == 20
    assert ckpt.load(s.timer._check_path).slot_done == 0
    assert sorted(int(v.body) for v in _all(s, "t")) == list(range(100))
    s.close()


def test_a_bounded_run_that_fails_midway_is_redone_once(store_path, clock, small_config,
                                                         monkeypatch):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(200):
        p.send(Message("t", b"%d" % i), delay_ms=1_050)
    s.deliver_due()
    clock.advance(5_000)
    original = bulk._append_restored
    calls = []

    def append_then_fail(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk went away")  # after two appends, before the checkpoint

    monkeypatch.setattr(bulk, "_append_restored", append_then_fail)
    monkeypatch.setattr(bulk, "RESTORE_CHUNK", 16)
    with pytest.raises(OSError):
        s.deliver_due(max_messages=90)
    assert ckpt.load(s.timer._check_path).deliver_mark >= 0  # the run is unfinished
    monkeypatch.setattr(bulk, "_append_restored", original)
    assert sum(_drain(s, 90)) == 200 - 32  # the 32 appended before the failure count once
    assert sorted(int(v.body) for v in _all(s, "t")) == list(range(200))
    s.close()
