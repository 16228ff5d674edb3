"""Damage inside the timer wheel (``timerwheel``) or the TimerLog (``timerlog/``) is found
when the store opens (the files checked against each other and the CommitLog): the damaged
files are copied aside and the timer rebuilt from its queue, so every timer message is
delivered once and never early."""

from __future__ import annotations

import collections
import os
import random
import shutil

import pytest
from conftest import SMALL, FakeClock

from store import Message, MessageStore
from store.timer import validation
from store.timer.validation import timer_files_problem

#: delays of the pending messages (ms): near slots, far slots, past the wheel (rolled)
DELAYS = (1_500, 2_300, 7_000, 30_000, 200_000, 600_000)
N = 60


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A store with timer messages delivered already, pending in many slots, rolled, one
    cancelled; returns (path, clock time, {body: due ms}, cancelled body)."""
    root = str(tmp_path_factory.mktemp("timer-damage") / "s")
    clock = FakeClock()
    due = {}
    with MessageStore.open(root, SMALL, clock=clock) as s:
        p = s.producer("g")
        for i in range(20):
            body = b"done-%d" % i
            p.send(Message("t", body), delay_ms=300 + 10 * i)
            due[body] = clock() + 300 + 10 * i
        clock.advance(1_000)
        s.deliver_due()  # those fired: the wheel holds fired slots as well
        for i in range(N):
            body = b"m-%d" % i
            delay = DELAYS[i % len(DELAYS)] + 37 * i
            p.send(Message("t", body), delay_ms=delay)
            due[body] = clock() + delay
        gone = p.send(Message("t", b"cancelled"), delay_ms=9_000)
        assert p.cancel("t", gone.msg_id)
        clock.advance(200)
        s.deliver_due()  # every pending one placed in the wheel (rolls included)
        assert timer_files_problem(s, s.timer.wheel, s.timer.log, s.timer.state()) is None
    return root, clock(), due


def _deliver_all(root, now, due) -> None:
    clock = FakeClock(now)
    with MessageStore.open(root, SMALL, clock=clock) as s:
        end = max(due.values()) + 5_000
        while clock() < end:
            s.deliver_due()
            clock.advance(997)
        s.deliver_due()
        counts = collections.Counter()
        for q in s.queue_ids("t"):
            for v in s.pull("t", q, 0, 10_000):
                counts[v.body] += 1
                assert v.store_timestamp_ms >= due[v.body], f"{v.body!r} early"
    assert b"cancelled" not in counts
    lost = sorted(b for b in due if counts[b] == 0)
    doubled = sorted(b for b, c in counts.items() if c > 1)
    assert not lost and not doubled, f"lost {lost[:5]}, doubled {doubled[:5]}"


def _flip(path, rng, lo=0, hi=None, bits=3):
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    hi = len(data.rstrip(b"\0")) if hi is None else hi
    where = []
    for _ in range(bits):
        i = rng.randrange(lo, hi)
        data[i] ^= 1 << rng.randrange(8)
        where.append(i)
    with open(path, "wb") as fh:
        fh.write(data)
    return where


def _live_slot_bytes(root) -> list[int]:
    """Byte offsets of the wheel's slots holding units (flips there matter)."""
    import numpy as np

    from store.timer.wheel import SLOT_DTYPE

    slots = np.fromfile(os.path.join(root, "timerwheel"), dtype=SLOT_DTYPE)
    return (np.flatnonzero(slots["last_pos"] >= 0) * SLOT_DTYPE.itemsize).tolist()


@pytest.mark.parametrize("seed", range(8))
def test_flipped_wheel_bytes_lose_nothing(template, tmp_path, seed):
    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    rng = random.Random(seed)
    start = rng.choice(_live_slot_bytes(copy)[-40:])  # a slot still to fire, mostly
    _flip(os.path.join(copy, "timerwheel"), rng, start, start + 28, bits=1 + seed % 3)
    _deliver_all(copy, now, due)


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "crashed"])
@pytest.mark.parametrize("seed", range(8))
def test_flipped_timer_log_bytes_lose_nothing(template, tmp_path, seed, monkeypatch, sealed):
    """Without the seal (a crash) the checkpoint's CRC of the TimerLog finds the flips."""
    if seed % 2:
        monkeypatch.setattr(validation, "CHECK_CHUNK", 5)
    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    if not sealed:
        os.unlink(os.path.join(copy, "config", "timercheck.seal"))
    rng = random.Random(100 + seed)
    directory = os.path.join(copy, "timerlog")
    name = os.path.join(directory, max(os.listdir(directory)))
    _flip(name, rng, bits=1 + seed % 3)
    _deliver_all(copy, now, due)


def test_damage_is_copied_aside_and_reported(template, tmp_path, caplog):
    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    wheel = os.path.join(copy, "timerwheel")
    with open(wheel, "rb") as fh:
        data = bytearray(fh.read())
    at = _live_slot_bytes(copy)[-1]
    data[at + 16:at + 24] = bytes(8)  # the lastPos of a live slot zeroed
    with open(wheel, "wb") as fh:
        fh.write(data)
    with caplog.at_level("WARNING", logger="store"):
        MessageStore.open(copy, SMALL, clock=FakeClock(now)).close()
    assert "timer files are damaged" in caplog.text
    assert os.path.exists(wheel + ".damaged-1") and os.path.isdir(
        os.path.join(copy, "timerlog.damaged-1"))
    _deliver_all(copy, now, due)


@pytest.mark.parametrize("chunk", [None, 7])
def test_an_undamaged_store_is_not_rebuilt(template, tmp_path, caplog, monkeypatch, chunk):
    """Read in chunks of 7 units too: slots whose units span chunks are tallied right (the
    seal removed: the files are checked unit by unit)."""
    if chunk is not None:
        monkeypatch.setattr(validation, "CHECK_CHUNK", chunk)
    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    os.unlink(os.path.join(copy, "config", "timercheck.seal"))
    with caplog.at_level("WARNING", logger="store"):
        _deliver_all(copy, now, due)
    assert "rebuilt" not in caplog.text
    assert not os.path.exists(os.path.join(copy, "timerwheel.damaged-1"))


def _checks(monkeypatch) -> list:
    """The unit-by-unit checks run from now on (their results)."""
    from store.timer import timer_service

    ran = []
    monkeypatch.setattr(timer_service, "timer_files_problem",
                        lambda *a: ran.append(timer_files_problem(*a)) or ran[-1])
    return ran


def test_a_clean_close_seals_the_files_and_the_next_open_skips_the_check(template, tmp_path,
                                                                         monkeypatch):
    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    assert os.path.exists(os.path.join(copy, "config", "timercheck.seal"))
    ran = _checks(monkeypatch)
    MessageStore.open(copy, SMALL, clock=FakeClock(now)).close()
    assert ran == []  # sealed, unchanged: no check
    _deliver_all(copy, now, due)
    assert ran == []
    os.unlink(os.path.join(copy, "config", "timercheck.seal"))
    MessageStore.open(copy, SMALL, clock=FakeClock(now)).close()
    assert ran == [None]  # no seal: checked (and sound)


@pytest.mark.parametrize("what", ["wheel", "timerlog", "checkpoint", "seal"])
def test_a_seal_that_does_not_match_has_the_files_checked(template, tmp_path, monkeypatch,
                                                          what):
    """One bit changed anywhere the seal covers (or in the seal) and the check runs; damage
    in the files is then found as without a seal."""
    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    rng = random.Random(7)
    directory = os.path.join(copy, "timerlog")
    path = {"wheel": os.path.join(copy, "timerwheel"),
            "timerlog": os.path.join(directory, max(os.listdir(directory))),
            "checkpoint": os.path.join(copy, "config", "timercheck"),
            "seal": os.path.join(copy, "config", "timercheck.seal")}[what]
    if what == "wheel":
        start = _live_slot_bytes(copy)[-1]
        _flip(path, rng, start + 24, start + 28, bits=1)  # a live slot's num
    elif what == "checkpoint":
        _flip(path, rng, 40, 48, bits=1)  # dataVersion.timestamp: nothing else looks at it
    else:
        _flip(path, rng, bits=1)
    ran = _checks(monkeypatch)
    MessageStore.open(copy, SMALL, clock=FakeClock(now)).close()
    assert len(ran) == 1
    assert (ran[0] is not None) == (what in ("wheel", "timerlog"))
    _deliver_all(copy, now, due)


def test_no_seal_after_a_run_that_died(tmp_path, monkeypatch):
    """A process that dies inside a delivery run leaves its mark: the next close of a
    process that only redid nothing writes no seal before a run clears the mark."""
    from store.timer.timer_seal import seal_path

    clock, path = FakeClock(), str(tmp_path / "s")
    with MessageStore.open(path, SMALL, clock=clock) as s:
        s.producer("g").send(Message("t", b"x"), delay_ms=5_000)
        s.deliver_due()
        state = s.timer.state()
    seal = seal_path(os.path.join(path, "config", "timercheck"))
    assert os.path.exists(seal)
    from store.timer import timer_checkpoint as ckpt

    name = os.path.join(path, "config", "timercheck")
    state = ckpt.load(name)
    state.deliver_mark = 0  # as a run that died leaves it
    state.counter += 1
    ckpt.save(name, state)
    os.unlink(seal)
    with MessageStore.open(path, SMALL, clock=clock, flush_service=False) as s:
        s.timer._seal()
        assert not os.path.exists(seal)  # the mark is set: nothing sealed
        clock.advance(6_000)
        assert s.deliver_due() == 1
    assert os.path.exists(seal)


def _record_reads(monkeypatch) -> list:
    """How many pending units' records each step of the unit-by-unit check reads."""
    reads = []
    real = validation.record_fields

    def counting(store, entries, mask):
        reads.append(int(mask.sum()))
        return real(store, entries, mask)

    monkeypatch.setattr(validation, "record_fields", counting)
    return reads


def test_after_a_crash_the_units_the_checkpoint_certifies_are_not_read_again(
        template, tmp_path, monkeypatch):
    """No seal (the process died): the files are checked, but the records of the units the
    checkpoint's CRC of the TimerLog covers (all of them here) are not read."""
    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    os.unlink(os.path.join(copy, "config", "timercheck.seal"))
    ran, reads = _checks(monkeypatch), _record_reads(monkeypatch)
    MessageStore.open(copy, SMALL, clock=FakeClock(now)).close()
    assert ran == [None] and sum(reads) == 0
    _deliver_all(copy, now, due)


@pytest.mark.parametrize("field", ["log_crc_from", "log_crc"])
@pytest.mark.parametrize("flip", [False, True], ids=["zeroed", "flipped"])
def test_a_damaged_log_crc_costs_the_reads_and_nothing_else(template, tmp_path, monkeypatch,
                                                            field, flip):
    from store.timer.timer_checkpoint import CHECKPOINT_FIELDS

    root, now, due = template
    copy = str(tmp_path / "s")
    shutil.copytree(root, copy)
    os.unlink(os.path.join(copy, "config", "timercheck.seal"))
    name = os.path.join(copy, "config", "timercheck")
    at = 8 * CHECKPOINT_FIELDS.index(field)
    with open(name, "r+b") as fh:
        fh.seek(at)
        old = fh.read(8)
        fh.seek(at)
        fh.write(bytes(b ^ 0x10 for b in old) if flip else bytes(8))
    ran, reads = _checks(monkeypatch), _record_reads(monkeypatch)
    MessageStore.open(copy, SMALL, clock=FakeClock(now)).close()
    assert ran == [None] and sum(reads) > N // 2  # every pending unit's record read
    assert not os.path.exists(os.path.join(copy, "timerwheel.damaged-1"))
    _deliver_all(copy, now, due)


def test_the_log_crc_follows_appends_across_files_and_retention(tmp_path):
    """Runs that append across TimerLog files extend the CRC; once retention deletes the
    file it starts in, the next save starts it again at the first file left."""
    from store.timer.validation import certified_from

    clock = FakeClock()
    with MessageStore.open(str(tmp_path / "s"), SMALL, clock=clock) as s:
        p = s.producer("g")
        for i in range(8):  # 3,200 units: three 64 KiB TimerLog files
            for j in range(400):
                p.send(Message("t", b"a-%d-%d" % (i, j)), delay_ms=2_000 + 10 * j)
            clock.advance(100)
            s.deliver_due()
        log = s.timer.log
        state = s.timer.state()
        assert len(log.files.refresh()) >= 3
        assert state.log_crc_from == 1  # from the first unit on
        assert certified_from(log, state, 0) == 0
        clock.advance(10_000)
        s.deliver_due()  # every one delivered
        later = p.send(Message("t", b"later"), delay_ms=60_000)
        clock.advance(100)
        s.deliver_due()
        s.timer.on_retention(later.commitlog_offset)
        first = log.files.refresh()[0].start
        assert first > 0  # files deleted
        p.send(Message("t", b"later-2"), delay_ms=60_000)
        clock.advance(100)
        s.deliver_due()
        state = s.timer.state()
        assert state.log_crc_from == first + 1
        assert certified_from(log, state, first) == first

