"""A damaged timer checkpoint (config/timercheck) is checked against what it derives from
(the timer queue, the TimerLog, the CommitLog) before it is used: a field that cannot be right
has the timer rebuilt, and every pending message is delivered once, when due."""

from __future__ import annotations

import os

import pytest
from conftest import SMALL, FakeClock

from store import Message, MessageStore
from store.timer import timer_checkpoint as ckpt

N = 21
FIELDS = [f for f in ckpt.CHECKPOINT_FIELDS]


def _visible(store, topic="t") -> int:
    if topic not in store.topics():
        return 0
    return sum(store.max_offset(topic, q) for q in store.queue_ids(topic))


def _pending_store(path, clock):
    store = MessageStore.open(path, SMALL, clock=clock)
    p = store.producer("g")
    for i in range(N):
        p.send(Message("t", b"m%d" % i), delay_ms=4_000)
    clock.advance(500)
    store.deliver_due()  # enqueued into the wheel: the checkpoint holds progress
    store.close()


def _damage(path, offset: int, size: int = 8, flip: bool = False) -> None:
    name = os.path.join(path, "config", "timercheck")
    data = bytearray(open(name, "rb").read())
    for i in range(offset, offset + size):
        data[i] = data[i] ^ 0xFF if flip else 0
    with open(name, "wb") as fh:
        fh.write(data)


def _deliver_all(path, clock) -> tuple[int, int]:
    with MessageStore.open(path, SMALL, clock=clock) as store:
        early = store.deliver_due()
        early += _visible(store)
        clock.advance(4_000)
        for _ in range(3):
            store.deliver_due()
            clock.advance(SMALL.timer_precision_ms)
        return early, _visible(store)


@pytest.mark.parametrize("field", FIELDS + ["whole file"])
@pytest.mark.parametrize("flip", [False, True], ids=["zeroed", "flipped"])
def test_a_damaged_field_never_loses_doubles_or_hurries_a_timer(tmp_path, field, flip):
    clock = FakeClock()
    path = str(tmp_path / "s")
    _pending_store(path, clock)
    if field == "whole file":
        _damage(path, 0, ckpt.CHECKPOINT_FILE_SIZE, flip)
    else:
        _damage(path, 8 * FIELDS.index(field), 8, flip)
    early, delivered = _deliver_all(path, clock)
    assert early == 0
    assert delivered == N



def test_a_zeroed_queue_offset_is_found_behind_rolled_units(tmp_path):
    """The newest units below the checkpointed end are rolls (long delays re-put): the check
    looks past them (the fuzzer found timer messages delivered twice here)."""
    clock, path = FakeClock(), str(tmp_path / "s")
    with MessageStore.open(path, SMALL, clock=clock) as store:
        p = store.producer("g")
        for i in range(5):
            p.send(Message("t", b"short%d" % i), delay_ms=1_000 + 100 * i)
        clock.advance(200)
        store.deliver_due()
        for i in range(5):  # past the SMALL wheel (409.6 s): their units are rolls
            p.send(Message("t", b"long%d" % i), delay_ms=3_600_000)
        clock.advance(3_000)
        assert store.deliver_due() == 5
    _damage(path, 8 * FIELDS.index("last_timer_queue_offset"))
    with MessageStore.open(path, SMALL, clock=clock) as store:
        store.deliver_due()
        clock.advance(3_600_000)
        for _ in range(3):
            store.deliver_due()
        assert _visible(store) == 10


def test_another_process_grown_timer_log_is_no_damage(tmp_path, caplog):
    """A process that opened the store earlier does not take a TimerLog end in a file
    another process added since for damage (it would rebuild the timer)."""
    path = str(tmp_path / "s")
    clock = FakeClock()
    first = MessageStore.open(path, SMALL, clock=clock)
    second = MessageStore.open(path, SMALL, clock=clock)  # its TimerLog file list: one file
    try:
        per_file = SMALL.timer_log_file_size_bytes // 52
        p = first.producer("g")
        for i in range(per_file + 50):
            p.send(Message("t", b"m%d" % i), delay_ms=60_000)
        first.deliver_due()  # placed: the TimerLog goes on in a second file
        want = first.timer.state()
        assert want.last_timer_log_flush_pos > SMALL.timer_log_file_size_bytes
        with caplog.at_level("WARNING", logger="store"):
            assert second.timer.state() == want  # no rebuild
        assert "rebuilt" not in caplog.text
    finally:
        second.close()
        first.close()


def _delivered_then_pending_store(path, clock) -> int:
    """Timer messages delivered already (10) and pending (21, due in 4 s)."""
    with MessageStore.open(path, SMALL, clock=clock) as store:
        p = store.producer("g")
        for i in range(10):
            p.send(Message("t", b"early%d" % i), delay_ms=1_000)
        clock.advance(1_500)
        assert store.deliver_due() == 10
        for i in range(N):
            p.send(Message("t", b"m%d" % i), delay_ms=4_000)
        clock.advance(500)
        store.deliver_due()
    return 10 + N


@pytest.mark.parametrize("start,end", [(12, 112), (16, 112), (8, 4096), (16, 4096), (11, 31)])
def test_a_damaged_rmq_checkpoint_is_never_taken_for_rocketmqs(tmp_path, caplog, start, end):
    """The read time intact and rmq's own fields zeroed (the fuzzer: zeroed [12, 112) after a
    crash) looked like a RocketMQ 5 broker's checkpoint: it was adopted with queue offset 0
    and every timer message delivered already was delivered again."""
    clock, path = FakeClock(), str(tmp_path / "s")
    total = _delivered_then_pending_store(path, clock)
    _damage(path, start, end - start)
    with caplog.at_level("WARNING", logger="store"), \
            MessageStore.open(path, SMALL, clock=clock) as store:
        assert "the timer is rebuilt" in caplog.text  # the store says so
        store.deliver_due()
        assert _visible(store) == 10  # nothing delivered again, nothing early
        clock.advance(4_000)
        for _ in range(3):
            store.deliver_due()
            clock.advance(SMALL.timer_precision_ms)
        bodies = [v.body for q in store.queue_ids("t")
                  for v in store.pull("t", q, 0, 100)]
        assert sorted(bodies) == sorted({*bodies}) and len(bodies) == total


@pytest.mark.parametrize("ahead_ms", [3 * 3_600_000, 1 << 36])
def test_a_read_time_moved_forward_loses_nothing(tmp_path, ahead_ms):
    """The fuzzer: bits flipped in the read time moved it hours ahead, and the slots between
    (timer messages pending) were never fired.  A read time after the checkpoint's own save
    time cannot be right."""
    clock, path = FakeClock(), str(tmp_path / "s")
    total = _delivered_then_pending_store(path, clock)
    name = os.path.join(path, "config", "timercheck")
    state = ckpt.load(name)
    state.last_read_time_ms += ahead_ms
    ckpt.save(name, state)
    with MessageStore.open(path, SMALL, clock=clock) as store:
        store.deliver_due()
        assert _visible(store) == 10  # nothing early
        clock.advance(4_000)
        for _ in range(3):
            store.deliver_due()
            clock.advance(SMALL.timer_precision_ms)
        assert _visible(store) == total


def test_a_flipped_slot_done_loses_nothing(tmp_path):
    """The fuzzer: a bit flipped in the high byte of ``slotDone`` (the units of a split slot
    already handled) skipped the rest of that slot."""
    clock, path = FakeClock(), str(tmp_path / "s")
    with MessageStore.open(path, SMALL, clock=clock) as store:
        p = store.producer("g")
        for i in range(N):
            p.send(Message("t", b"m%d" % i), delay_ms=2_000)
        assert store.deliver_due() == 0  # in the wheel, one slot
        clock.advance(3_000)
        assert store.deliver_due(max_messages=5) == 5  # the slot is split: 5 of 21 done
        assert store.timer.state().slot_done == 5
    name = os.path.join(path, "config", "timercheck")
    state = ckpt.load(name)
    state.slot_done |= 1 << 56
    ckpt.save(name, state)
    with MessageStore.open(path, SMALL, clock=clock) as store:
        for _ in range(3):
            store.deliver_due()
        bodies = [v.body for q in store.queue_ids("t") for v in store.pull("t", q, 0, 100)]
        assert sorted(bodies) == sorted(b"m%d" % i for i in range(N))


def _split_slot_store(path, clock, done: int) -> None:
    """21 timer messages in one slot, due; a bounded run delivered ``done`` of them (0: the
    read time is at their slot, not due yet: ``slotDone`` 0 counts their units)."""
    with MessageStore.open(path, SMALL, clock=clock) as store:
        p = store.producer("g")
        for i in range(N):
            p.send(Message("t", b"m%d" % i), delay_ms=2_000)
        if not done:
            clock.advance(2_000 - SMALL.timer_precision_ms)
        assert store.deliver_due() == 0  # in the wheel, one slot
        if not done:
            state = store.timer.state()
            assert store.timer.wheel.get(state.last_read_time_ms)[2] == N
        else:
            clock.advance(3_000)
            assert store.deliver_due(max_messages=done) == done  # the slot is split
        assert store.timer.state().slot_done == done


def _set_slot_done(path, value: int, *, hint: bool = True) -> None:
    name = os.path.join(path, "config", "timercheck")
    state = ckpt.load(name)
    state.slot_done = value
    if not hint:
        state.slot_done_from = 0  # as a checkpoint written before the hint existed
    ckpt.save(name, state)


def _bodies_once_due(path, clock) -> list[bytes]:
    with MessageStore.open(path, SMALL, clock=clock) as store:
        clock.advance(3_000)
        for _ in range(3):
            store.deliver_due()
            clock.advance(SMALL.timer_precision_ms)
        return sorted(v.body for q in store.queue_ids("t") for v in store.pull("t", q, 0, 100))


@pytest.mark.parametrize("done,damaged", [(0, 1), (0, 3), (5, 6), (5, 7), (5, 4), (5, 0),
                                          (5, 21)])
@pytest.mark.parametrize("hint", [True, False], ids=["hint", "no hint"])
def test_a_small_wrong_slot_done_loses_or_repeats_nothing(tmp_path, caplog, done, damaged,
                                                          hint):
    """A low bit flipped in ``slotDone`` (the units of the read time's slot handled already)
    skipped that many timer messages (too large) or delivered some twice (too small): the
    count is checked against the delivered copies of the slot's units and corrected."""
    if done == 0 and damaged == 0:
        pytest.skip("nothing to tell it by")
    clock, path = FakeClock(), str(tmp_path / "s")
    _split_slot_store(path, clock, done)
    _set_slot_done(path, damaged, hint=hint)
    with caplog.at_level("WARNING", logger="store"):
        bodies = _bodies_once_due(path, clock)
    assert bodies == sorted(b"m%d" % i for i in range(N))
    assert "corrected" in caplog.text


@pytest.mark.parametrize("done", [5, 0])
def test_a_right_slot_done_is_kept_without_a_long_scan(tmp_path, caplog, monkeypatch, done):
    """A split slot's count that is right (or a count of 0 for the slot at the read time, not
    due yet) is confirmed from where the last run appended."""
    from store.timer import validation

    clock, path = FakeClock(), str(tmp_path / "s")
    _split_slot_store(path, clock, done)
    starts = []
    real = validation.origins_since
    monkeypatch.setattr(validation, "origins_since",
                        lambda store, start, *a: starts.append(start) or real(store, start, *a))
    state = ckpt.load(os.path.join(path, "config", "timercheck"))
    assert state.slot_done_from > 1
    with caplog.at_level("WARNING", logger="store"):
        bodies = _bodies_once_due(path, clock)
    assert bodies == sorted(b"m%d" % i for i in range(N))
    assert "corrected" not in caplog.text
    assert starts == [state.slot_done_from - 1]
