"""The timer wheel end to end: sends, firing, rolls, cancels, flow control, restarts."""

from __future__ import annotations

import numpy as np
import pytest
from queue_reading import visible  # noqa: E402  (tests/ helper)

from store import InvalidDelayError, InvalidMessageError, Message, MessageStore
from store.formats.record_codec import encode_record
from store.core.retention import delete_expired_segments
from store.base.errors import TimerFlowControlError
from store.formats.message import TIMER_TOPIC, java_string_hash
from store.timer import timer_checkpoint as ckpt

P = 100  # the SMALL config's timer precision


def bodies(store, topic):
    return sorted(v.body for v in visible(store, topic))


def test_ten_topics_relative_and_absolute(store, clock):
    p = store.producer("g")
    sent = {}
    for t in range(10):
        for i in range(5):
            body = f"{t}-{i}".encode()
            if i % 2:
                r = p.send(Message(f"topic{t}", body), delay_ms=3_000 + 100 * i)
            else:
                r = p.send(Message(f"topic{t}", body), deliver_at_ms=clock() + 2_000 + 37 * i)
            assert (r.topic, r.stored_topic, r.queue_offset) == (f"topic{t}", TIMER_TOPIC, -1)
            sent[r.msg_id] = (f"topic{t}", body, r.deliver_at_ms)
    assert store.deliver_due() == 0
    assert store.timer.pending_count() == 50
    assert all(not visible(store, f"topic{t}") for t in range(10))
    clock.advance(5_000)
    assert store.deliver_due() == 50
    assert store.timer.pending_count() == 0
    for t in range(10):
        views = visible(store, f"topic{t}")
        assert len(views) == 5
        for v in views:
            topic, body, due = sent[v.msg_id]
            assert (v.topic, v.body, v.deliver_timestamp_ms) == (topic, body, due)
            assert v.store_timestamp_ms >= v.deliver_timestamp_ms
            assert "TIMER_ENQUEUE_MS" in v.system_properties
            assert v.system_properties["TIMER_DEQUEUE_MS"] == str(clock())
            assert not set(v.properties) & {"REAL_TOPIC", "TIMER_OUT_MS", "__RMQ_DELIVER_MS"}
    assert store.deliver_due() == 0


def test_never_early_and_at_most_one_precision_late(store, clock):
    p = store.producer("g")
    rng = np.random.default_rng(7)
    due = {}
    for d in rng.integers(1, 700, size=60).tolist():
        r = p.send(Message("t", str(d).encode()), delay_ms=d)
        due[r.msg_id] = r.deliver_at_ms
    seen = {}
    for _ in range(110):
        clock.advance(7)
        store.deliver_due()
        now = clock()
        for v in visible(store, "t"):
            seen.setdefault(v.msg_id, v)
            assert v.store_timestamp_ms >= due[v.msg_id]  # never early
        for msg_id, d in due.items():
            if d + P <= now:  # at most one precision late (deliver_due runs every 7 ms)
                assert msg_id in seen, (msg_id, d, now)
    assert len(seen) == len(due) == len(visible(store, "t"))


def test_deliver_time_in_the_past_is_immediate(store, clock):
    p = store.producer("g")
    r = p.send(Message("t", b"late"), deliver_at_ms=clock() - 10_000)
    assert r.topic == "t" and r.deliver_at_ms is None
    assert bodies(store, "t") == [b"late"]
    with pytest.raises(Exception):
        store.max_offset(TIMER_TOPIC, 0)  # the wheel's topic was never used


def test_delay_beyond_the_maximum_is_refused(store, clock):
    p = store.producer("g")
    limit = store.config.timer_max_delay_ms
    assert limit >= 365 * 86_400_000
    with pytest.raises(InvalidDelayError, match="timer_max_delay_ms"):
        p.send(Message("t", b"x"), delay_ms=limit + 1)
    with pytest.raises(InvalidDelayError, match="timer_max_delay_ms"):
        p.send(Message("t", b"x"), deliver_at_ms=clock() + limit + 1)
    r = p.send(Message("t", b"x"), delay_ms=limit)  # the maximum itself works
    assert r.deliver_at_ms == clock() + limit


def _stepper(store, clock, until, step):
    """Advance in ``step`` ms steps to ``until``, delivering each time."""
    while clock() < until:
        clock.advance(step)
        store.deliver_due()


@pytest.fixture
def narrow(store_path, clock, small_config):
    """A store whose roll window is 2 slots (RocketMQ's roll test)."""
    s = MessageStore.open(store_path, small_config.replace(timer_roll_window_slots=2), clock=clock)
    yield s
    s.close()


def test_roll_window_of_two_rolls_once_for_four_precisions(narrow, clock):
    clock.set(clock() - clock() % P)
    r = narrow.producer("g").send(Message("t", b"x"), delay_ms=4 * P)
    _stepper(narrow, clock, r.deliver_at_ms + 3 * P, P // 2)
    [v] = visible(narrow, "t")
    assert v.system_properties["TIMER_ROLL_TIMES"] == "1"
    assert v.store_timestamp_ms >= r.deliver_at_ms


def test_long_delays_roll_many_times_and_arrive_once(narrow, clock):
    p = narrow.producer("g")
    rs = [p.send(Message("t", str(d).encode()), delay_ms=d) for d in (13 * P + 37, 40 * P)]
    _stepper(narrow, clock, max(r.deliver_at_ms for r in rs) + 2 * P, P)
    views = visible(narrow, "t")
    assert sorted(v.body for v in views) == [str(d).encode() for d in (13 * P + 37, 40 * P)]
    for v in views:
        assert int(v.system_properties["TIMER_ROLL_TIMES"]) >= 3  # a roll covers 2-3 P
        assert v.deliver_timestamp_ms <= v.store_timestamp_ms <= v.deliver_timestamp_ms + 2 * P


def test_roll_boundaries_in_the_default_window(store, clock):
    """Delays just under, at and past the roll window (1024 slots) and its thirds."""
    clock.set(clock() - clock() % P)
    p = store.producer("g")
    window = store.config.timer_roll_window_slots * P
    delays = [window - P, window, window + P, window + window // 3, 3 * window + 11]
    rs = [p.send(Message("t", str(d).encode()), delay_ms=d) for d in delays]
    store.deliver_due()
    _stepper(store, clock, max(r.deliver_at_ms for r in rs) + P, 50 * P)
    store.deliver_due()
    views = {int(v.body): v for v in visible(store, "t")}
    assert sorted(views) == sorted(delays)
    assert "TIMER_ROLL_TIMES" not in views[window - 2 * P + P].system_properties
    assert int(views[3 * window + 11].system_properties["TIMER_ROLL_TIMES"]) >= 2
    for v in views.values():
        assert v.store_timestamp_ms >= v.deliver_timestamp_ms


def test_cancel_with_the_send_result(store, clock):
    """The result of a delayed send names the user's topic, so it can cancel the message."""
    p = store.producer("g")
    r = p.send(Message("orders", b"close-if-unpaid"), delay_ms=60_000)
    assert (r.topic, r.stored_topic) == ("orders", TIMER_TOPIC)
    assert p.cancel(r.topic, r.msg_id) is True
    clock.advance(61_000)
    store.deliver_due()
    assert not visible(store, "orders")


def test_cancel_rules(store, clock):
    p = store.producer("g")
    rs = [p.send(Message("orders", str(i).encode()), delay_ms=2_000) for i in range(5)]
    other = p.send(Message("payments", b"p"), delay_ms=2_000)
    assert p.cancel("orders", rs[2].msg_id) is True
    assert p.cancel("orders", rs[2].msg_id) is False  # again: already cancelled
    assert p.cancel("orders", "XXX") is False
    assert p.cancel("orders", "0" * 32) is False
    assert p.cancel("payments", rs[3].msg_id) is False  # same id, another topic
    assert p.cancel("orders", other.msg_id) is False
    with pytest.raises(InvalidMessageError):
        p.cancel("orders", None)
    clock.advance(3_000)
    assert store.deliver_due() == 5
    assert bodies(store, "orders") == [b"0", b"1", b"3", b"4"]
    assert bodies(store, "payments") == [b"p"]
    assert p.cancel("orders", rs[0].msg_id) is False  # already delivered
    assert set(store.topics()) - {"warmup"} == {"orders", "payments"}  # no marker topic


def test_cancel_after_enqueue_and_before_enqueue(store, clock):
    p = store.producer("g")
    a = p.send(Message("t", b"a"), delay_ms=1_000)
    store.deliver_due()  # a is in the wheel now
    b = p.send(Message("t", b"b"), delay_ms=1_000)  # b is still only in the queue
    assert p.cancel("t", a.msg_id) and p.cancel("t", b.msg_id)
    clock.advance(100_000)  # both due and overdue when the next run sees the markers
    assert store.deliver_due() == 0
    assert visible(store, "t") == []


def test_cancel_of_a_long_rolled_message(narrow, clock):
    p = narrow.producer("g")
    keep = p.send(Message("t", b"keep"), delay_ms=30 * P)
    drop = p.send(Message("t", b"drop"), delay_ms=30 * P)
    _stepper(narrow, clock, clock() + 9 * P, P)  # both have rolled a few times
    assert p.cancel("t", drop.msg_id)
    _stepper(narrow, clock, keep.deliver_at_ms + 2 * P, P)
    assert bodies(narrow, "t") == [b"keep"]


def test_delay_level_messages_cannot_be_cancelled(store, clock):
    p = store.producer("g")
    r = p.send(Message("t", b"x"), delay_level=1)
    assert p.cancel("t", r.msg_id) is False
    clock.advance(1_000)
    store.deliver_due()
    assert bodies(store, "t") == [b"x"]


def test_flow_control_per_slot(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config.replace(timer_congest_num_each_slot=100),
                          clock=clock)
    p = s.producer("g")
    due = clock() + 5_000
    passed = refused = 0
    for i in range(500):
        try:
            p.send(Message("t", b"x"), deliver_at_ms=due)
            passed += 1
        except TimerFlowControlError as exc:
            assert "timer_congest_num_each_slot=100" in str(exc)
            refused += 1
        if i % 50 == 0:
            s.deliver_due()
    assert 100 < passed <= 200 and refused == 500 - passed
    assert 0 < passed - 100 < 120
    clock.advance(6_000)
    assert s.deliver_due() == passed
    s.close()


def test_restart_keeps_progress_and_rebuilds_a_corrupt_slot(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    due = clock() + 10_000
    for i in range(250):
        p.send(Message("t", str(i).encode()), deliver_at_ms=due)
    clock.advance(1_000)
    s.deliver_due()
    before = ckpt.load(s.timer._check_path)
    slot = (round_down(due) // P) % small_config.timer_wheel_slots
    s.close()
    # corrupt the slot: its lastPos points past the end of the TimerLog
    wheel = np.memmap(f"{store_path}/timerwheel", dtype=">i8", mode="r+")
    wheel[slot * 4 + 2] = 10**9
    wheel.flush()
    del wheel
    s = MessageStore.open(store_path, small_config, clock=clock)
    after = ckpt.load(s.timer._check_path)
    assert (after.last_read_time_ms, after.last_timer_queue_offset,
            after.last_timer_log_flush_pos) == (before.last_read_time_ms,
                                                before.last_timer_queue_offset,
                                                before.last_timer_log_flush_pos)
    clock.advance(10_000)
    assert s.deliver_due() == 250
    assert bodies(s, "t") == sorted(str(i).encode() for i in range(250))
    s.close()


def round_down(deliver_ms):
    return deliver_ms - P if deliver_ms % P == 0 else deliver_ms - deliver_ms % P


def test_downtime_far_beyond_the_wheel_span(store_path, clock, small_config):
    span = small_config.timer_wheel_slots * P  # 409.6 s with the SMALL config
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    delays = [1_000, span // 2, span - 1_000, span + 5_000, 3 * span, 40 * span]
    for d in delays:
        p.send(Message("t", str(d).encode()), delay_ms=d)
    s.deliver_due()
    s.close()
    clock.advance(21 * 86_400_000)  # three weeks later
    s = MessageStore.open(store_path, small_config, clock=clock)
    assert s.deliver_due() == len(delays)
    views = visible(s, "t")
    assert sorted(int(v.body) for v in views) == sorted(delays)
    assert s.deliver_due() == 0
    # new messages after the outage still work
    p = s.producer("g")
    p.send(Message("t", b"fresh"), delay_ms=500)
    clock.advance(600)
    assert s.deliver_due() == 1
    s.close()


def test_messages_whose_record_was_removed_are_skipped(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    p.send(Message("t", b"lost"), delay_ms=5_000)
    s.deliver_due()
    for _ in range(2000):  # fill a few 64 KiB segments
        p.send(Message("filler", b"f" * 100))
    kept = p.send(Message("t", b"kept"), delay_ms=5_000)
    # retention keeps pending records; remove the old segments anyway (as a damaged or
    # hand-cleaned store would have lost them)
    assert s.clean_expired_files(force=True) == 0
    with s.write_lock():
        assert delete_expired_segments(s, s._retention_listeners, force=True) >= 1
    clock.advance(6_000)
    assert s.deliver_due() == 1
    assert [v.msg_id for v in visible(s, "t")] == [kept.msg_id]
    s.close()


def test_two_stores_on_one_directory_share_the_work(store_path, clock, small_config):
    a = MessageStore.open(store_path, small_config, clock=clock)
    b = MessageStore.open(store_path, small_config, clock=clock)
    pa, pb = a.producer("g"), b.producer("g")
    sent = []
    for i in range(40):
        prod = pa if i % 2 else pb
        sent.append(prod.send(Message("t", str(i).encode()), delay_ms=100 + 50 * i).msg_id)
    total = 0
    for step in range(60):
        clock.advance(50)
        total += (a if step % 3 else b).deliver_due()
    assert total == 40
    assert sorted(v.msg_id for v in visible(a, "t")) == sorted(sent)
    assert sorted(v.msg_id for v in visible(b, "t")) == sorted(sent)
    a.close()
    b.close()


def test_delivered_record_is_the_source_with_appended_properties(store, clock):
    p = store.producer("g")
    p.send(Message("t", b"body-1", tags="TagA", keys="k1 k2", properties={"a": "1"}),
           delay_ms=500)
    p.send(Message("t", b"body-2"), delay_level=1)
    clock.advance(1_000)
    assert store.deliver_due() == 2
    for v in visible(store, "t"):
        rec = store.read_record(v.commitlog_offset)
        src = store.read_record(int(rec.properties["__RMQ_DELAY_ORIGIN"]))
        extra = {k: rec.properties[k] for k in rec.properties if k not in src.properties}
        assert {**src.properties, **extra} == rec.properties
        assert src.body == rec.body and src.born_timestamp_ms == rec.born_timestamp_ms
        # byte for byte what the store's own encoder makes of that record
        spec = src.to_spec(topic=rec.topic, queue_id=rec.queue_id, properties=rec.properties)
        raw = encode_record(spec, queue_id=rec.queue_id, queue_offset=rec.queue_offset,
                            physical_offset=rec.physical_offset,
                            store_timestamp_ms=rec.store_timestamp_ms)
        buf, pos, _ = store.commit_log.buffer_at(rec.physical_offset)
        assert bytes(buf[pos:pos + len(raw)]) == raw
        entry = store.queue_entries("t", rec.queue_id, rec.queue_offset, rec.queue_offset + 1)
        expected = 2598919 if v.tags == "TagA" else 0  # Java hash of "TagA"
        assert int(entry["tags_code"][0]) == expected


def test_checkpoint_makes_restart_cheap(store_path, clock, small_config):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(20):
        p.send(Message("t", b"x"), delay_ms=60_000)
    s.deliver_due()
    s.close()
    s = MessageStore.open(store_path, small_config, clock=clock)
    state = ckpt.load(s.timer._check_path)
    assert state.deliver_mark == -1 and state.last_timer_queue_offset == 20
    assert state.precision_ms == P and state.wheel_slots == small_config.timer_wheel_slots
    assert s.deliver_due() == 0  # nothing re-enqueued
    assert ckpt.load(s.timer._check_path).counter == state.counter
    s.close()


def test_pending_due_times_for_stats(store, clock):
    p = store.producer("g")
    a = p.send(Message("t", b"a"), delay_ms=2_000)
    p.send(Message("t", b"b"), delay_ms=2_000)
    p.send(Message("t", b"c"), delay_ms=90_000)
    level = p.send(Message("t", b"l"), delay_level=2)
    due, num = store.timer.pending_due_ms()  # still queued
    assert int(num.sum()) == 3 and set(due.tolist()) == {a.deliver_at_ms, clock() + 90_000}
    store.deliver_due()  # now in the wheel
    due, num = store.timer.pending_due_ms()
    assert int(num.sum()) == 3
    assert sorted(zip(due.tolist(), num.tolist())) == [(a.deliver_at_ms, 2), (clock() + 90_000, 1)]
    assert store.delay_levels.pending_due_ms().tolist() == [level.deliver_at_ms]
    stats = store.pending_delayed_stats()
    assert (stats["pending"], stats["timer_pending"], stats["schedule_pending"]) == (4, 3, 1)


def test_repeated_rolls_keep_one_pair_per_key(narrow, clock):
    """Each roll re-puts the record with the restore's pairs replaced, never repeated."""
    r = narrow.producer("g").send(Message("t", b"far"), delay_ms=40 * P)
    _stepper(narrow, clock, r.deliver_at_ms + 2 * P, P)
    [v] = visible(narrow, "t")
    buf, pos, _ = narrow.commit_log.buffer_at(v.commitlog_offset)
    rec = narrow.read_record(v.commitlog_offset)
    raw = bytes(buf[pos:pos + rec.total_size])
    for key in ("TIMER_ROLL_TIMES", "__RMQ_DELAY_ORIGIN", "TIMER_DEQUEUE_MS",
                "TIMER_ENQUEUE_MS", "__RMQ_DELIVER_MS", "UNIQ_KEY", "REAL_TOPIC"):
        assert raw.count(b"\x02" + key.encode() + b"\x01") \
            + raw.count(b"\x00" + key.encode() + b"\x01") <= 1, key
        assert key in rec.properties, key
    assert int(rec.properties["TIMER_ROLL_TIMES"]) >= 3
    assert int(rec.properties["__RMQ_DELIVER_MS"]) == r.deliver_at_ms


def test_one_run_over_many_segments_honours_cancels(store, clock):
    """Sources spread over many 64 KiB segments, cancels among them, one delivery run."""
    p = store.producer("g")
    sent = [p.send(Message("t", b"m%04d" % i, tags=f"T{i % 3}", keys=f"k{i}",
                           properties={"n": str(i)}), delay_ms=2_000 + (i % 7) * 10)
            for i in range(1500)]
    assert store.commit_log.files.files[-1].start >= 5 * 65536  # many segments
    cancelled = {r.msg_id for r in sent[::5]}
    for msg_id in cancelled:
        assert store.timer.cancel("t", msg_id)
    clock.advance(5_000)
    assert store.deliver_due() == 1500 - len(cancelled)
    views = visible(store, "t")
    assert sorted(v.msg_id for v in views) == sorted(r.msg_id for r in sent
                                                     if r.msg_id not in cancelled)
    for v in views:
        i = int(v.body[1:])
        assert v.tags == f"T{i % 3}" and v.properties["n"] == str(i)
        entry = store.queue_entries("t", v.queue_id, v.queue_offset, v.queue_offset + 1)
        assert int(entry["tags_code"][0]) == java_string_hash(f"T{i % 3}")


@pytest.mark.parametrize("damage", ["wheel-short", "wheel-long", "timerlog-short"])
def test_timer_file_of_the_wrong_length_is_set_aside_and_rebuilt(store_path, clock,
                                                                 small_config, damage):
    """A damaged timerwheel or TimerLog segment does not make the store unopenable: it is
    moved aside (kept) and the timer files are rebuilt from the timer ConsumeQueue; every
    pending message is delivered once, none early, and those already delivered stay once."""
    import glob
    import os

    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    early = [p.send(Message("t", f"e{i}".encode()), delay_ms=500).msg_id for i in range(30)]
    late = [p.send(Message("t", f"l{i}".encode()), delay_ms=20_000).msg_id for i in range(300)]
    clock.advance(1_000)
    assert s.deliver_due() == 30
    s.close()
    if damage.startswith("wheel"):
        path = f"{store_path}/timerwheel"
        size = os.path.getsize(path)
        os.truncate(path, size // 2 if damage == "wheel-short" else size + 4096)
    else:
        (path,) = sorted(glob.glob(f"{store_path}/timerlog/*"))[:1]
        os.truncate(path, 1000)
    s = MessageStore.open(store_path, small_config, clock=clock)
    aside = glob.glob(f"{store_path}/*.damaged-1")
    assert len(aside) == 1  # kept for inspection, never deleted
    assert s.deliver_due() == 0  # nothing early
    assert sorted(v.msg_id for v in visible(s, "t")) == sorted(early)
    clock.advance(20_000)
    assert s.deliver_due() == 300
    assert sorted(v.msg_id for v in visible(s, "t")) == sorted(early + late)
    assert s.deliver_due() == 0
    s.close()


@pytest.mark.parametrize("kind", ["timer", "levels", "keyed"])
def test_one_call_delivers_every_due_message_before_the_compiled_loops_are_in(
        tmp_path, clock, monkeypatch, kind, small_config):
    """A fresh process steps through due work in small bounded runs until its compiled loops
    are in: a step that only enqueued timer records, or only skipped replaced ones, delivers
    nothing yet is not the end (the old loop stopped at it: one ``deliver_due()`` of a fresh
    process under load delivered nothing of 300 due messages)."""
    from store.base import jit

    monkeypatch.setattr(jit, "ready", lambda: False)
    monkeypatch.setattr(jit, "FALLBACK_MAX_WORK", 40)
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        p = store.producer()
        for i in range(300):
            if kind == "timer":
                p.send(Message("orders", b"%d" % i), delay_ms=60_000)
            elif kind == "levels":
                p.send(Message("orders", b"%d" % i), delay_level=3)
            else:  # 300 sends over 3 keys: 297 replaced, skipped without a copy
                p.send(Message("orders", b"%d" % i), delay_ms=60_000, key=f"k{i % 3}")
        clock.advance(120_000)
        assert store.deliver_due() == (3 if kind == "keyed" else 300)
        assert store.deliver_due() == 0
