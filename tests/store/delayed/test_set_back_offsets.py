"""A delay level's offset in ``config/delayOffset.json`` set back (a restored backup, a stale
``.bak``, an edit, damage to a smaller value) or moved forward (damage to a larger value, the
newer file of a restored store, another process's file) is checked against the CommitLog
before it is used: every entry the file calls delivered must have a delivered copy in the log
(its ``__RMQ_DELAY_ORIGIN``). Nothing is delivered twice, nothing is lost, nothing surfaces
early, and the file heals with the next save."""

from __future__ import annotations

import collections
import os
import random
import shutil

import pytest
from conftest import SMALL, FakeClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queue_reading import visible

from store import Message, MessageStore
from store.files.broker_files import read_lenient_json, write_config

LEVELS = (1, 2, 3)  # 1 s, 5 s, 10 s


def _path(root: str) -> str:
    return os.path.join(root, "config", "delayOffset.json")


def _counts(store) -> collections.Counter:
    return collections.Counter(v.body for v in visible(store, "t"))


def _send(store, kind: bytes, n: int = 10) -> None:
    """``n`` messages per level, ``<kind>-<level>-<i>``."""
    p = store.producer("g")
    for i in range(n):
        for level in LEVELS:
            p.send(Message("t", b"%s-%d-%d" % (kind, level, i)), delay_level=level)


def _store_with_delivered(root: str, clock: FakeClock, n: int = 10) -> None:
    """``n`` messages per level delivered, then ``n`` more per level pending (due later)."""
    with MessageStore.open(root, SMALL, clock=clock) as s:
        _send(s, b"old", n)
        clock.advance(10_000)
        assert s.deliver_due() == n * len(LEVELS)
        _send(s, b"new", n)


def _edit(root: str, change) -> None:
    path = _path(root)
    data = read_lenient_json(path)
    table = {int(k): v for k, v in data["offsetTable"].items()}
    data["offsetTable"] = change(table)
    write_config(path, data)  # keeps savedAt and seal as they were: the seal breaks


def _deliver_everything(root: str, clock: FakeClock, n: int = 10) -> collections.Counter:
    with MessageStore.open(root, SMALL, clock=clock) as s:
        s.deliver_due()
        early = [b for b in _counts(s) if b.startswith(b"new-")]
        assert not early, f"delivered before they were due: {sorted(early)[:5]}"
        clock.advance(10_000)
        s.deliver_due()
        got = _counts(s)
        assert s.deliver_due() == 0
        assert s.delay_levels.pending_count() == 0
    want = {b"%s-%d-%d" % (k, level, i) for k in (b"old", b"new") for level in LEVELS
            for i in range(n)}
    assert set(got) == want, f"lost: {sorted(want - set(got))[:5]}"
    doubled = {b: c for b, c in got.items() if c > 1}
    assert not doubled, f"delivered twice: {sorted(doubled)[:5]}"
    return got


@pytest.mark.parametrize("where", ["zero", "middle", "negative", "not a number"])
def test_a_set_back_offset_delivers_nothing_twice(tmp_path, where):
    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    value = {"zero": 0, "middle": 5, "negative": -7, "not a number": "x"}[where]
    _edit(root, lambda table: {level: value for level in table})
    _deliver_everything(root, clock)


@pytest.mark.parametrize("where", ["zero", "middle", "not a number"])
def test_a_set_back_offset_is_not_counted_as_pending(tmp_path, where):
    """Before any run heals the file, the entries it calls undelivered that have a delivered
    copy are neither counted nor listed as pending."""
    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    value = {"zero": 0, "middle": 5, "not a number": "x"}[where]
    _edit(root, lambda table: {level: value for level in table})
    with MessageStore.open(root, SMALL, clock=clock) as s:
        assert s.delay_levels.pending_count() == 10 * len(LEVELS)  # the "new" ones only
        assert len(s.delay_levels.pending_due_ms()) == 10 * len(LEVELS)
        s.producer("g").send(Message("other", b"x"))  # the scan goes on over it
        assert s.delay_levels.pending_count() == 10 * len(LEVELS)
    _deliver_everything(root, clock)


def test_a_restored_backup_delivers_nothing_twice(tmp_path):
    """A backup is self-consistent (its seal holds): what was delivered after it was saved is
    found from its ``savedAt`` on."""
    clock, root = FakeClock(), str(tmp_path / "s")
    with MessageStore.open(root, SMALL, clock=clock) as s:
        _send(s, b"old")
        clock.advance(1_000)
        assert s.deliver_due() == 10  # level 1 only
    shutil.copy(_path(root), str(tmp_path / "backup.json"))
    with MessageStore.open(root, SMALL, clock=clock) as s:
        clock.advance(9_000)
        assert s.deliver_due() == 20  # levels 2 and 3
        _send(s, b"new")
    shutil.copy(str(tmp_path / "backup.json"), _path(root))
    _deliver_everything(root, clock)


def test_a_stale_bak_delivers_nothing_twice(tmp_path):
    """The file damaged past reading: the ``.bak`` (the save before the last) is read."""
    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    with open(_path(root), "wb") as fh:
        fh.write(b"\xff\xfe{")
    _deliver_everything(root, clock)


def test_random_damage_to_smaller_offsets(tmp_path):
    rng = random.Random(5)
    for case in range(6):
        clock, root = FakeClock(), str(tmp_path / f"s{case}")
        _store_with_delivered(root, clock)
        _edit(root, lambda table: {level: rng.randrange(0, off + 1)
                                   for level, off in table.items()})
        _deliver_everything(root, clock)


def test_the_file_heals_and_is_trusted_again(tmp_path, caplog):
    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    _edit(root, lambda table: {level: 0 for level in table})
    with MessageStore.open(root, SMALL, clock=clock) as s:
        with caplog.at_level("WARNING", logger="store"):
            clock.advance(10_000)
            assert s.deliver_due() == 30  # the new ones only
        assert "seal does not hold" in caplog.text
        assert s.delay_levels.offsets() == {1: 20, 2: 20, 3: 20}
    data = read_lenient_json(_path(root))
    assert data["seal"] and data["savedAt"] > 0 and data["deliverMark"] == -1


def test_two_processes_alternating_deliver_each_message_once(tmp_path):
    """Each sees the other's file as not its own: checked from its ``savedAt`` on."""
    clock, root = FakeClock(), str(tmp_path / "s")
    a = MessageStore.open(root, SMALL, clock=clock)
    b = MessageStore.open(root, SMALL, clock=clock)
    try:
        for i in range(12):
            (a if i % 2 else b).producer("g").send(Message("t", b"m%d" % i), delay_level=1)
            clock.advance(400)
            (b if i % 3 else a).deliver_due()
        clock.advance(2_000)
        a.deliver_due()
        b.deliver_due()
        got = _counts(a)
        assert got == {b"m%d" % i: 1 for i in range(12)}
    finally:
        b.close()
        a.close()


# ---------------------------------------------------------------- moved forward
@pytest.mark.parametrize("where", ["by one", "middle", "end"])
def test_a_moved_forward_offset_skips_nothing(tmp_path, where):
    """Each level's queue holds 10 delivered entries then 10 pending: the offset (10) moved
    to 11, to 15 or to the queue's end (20)."""
    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    value = {"by one": 11, "middle": 15, "end": 20}[where]
    _edit(root, lambda table: {level: value for level in table})
    _deliver_everything(root, clock)


def test_moved_forward_with_the_seal_kept(tmp_path):
    """A larger offset sealed as if rmq wrote it (the file of another process, or forged):
    the seal says nothing about the CommitLog, so the entries are still checked."""
    from store.delayed.delay_offset_file import _seal

    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    data = read_lenient_json(_path(root))
    table = {int(k): 15 for k in data["offsetTable"]}
    data["offsetTable"] = table
    data["seal"] = _seal(table, data["savedAt"], data["storeId"])
    write_config(_path(root), data)
    _deliver_everything(root, clock)


def test_a_restored_store_with_a_newer_offsets_file(tmp_path):
    """The store restored from a backup, and ``delayOffset.json`` from a later one: the file
    calls delivered what the restored CommitLog never delivered."""
    clock, root = FakeClock(), str(tmp_path / "s")
    backup = str(tmp_path / "backup")
    with MessageStore.open(root, SMALL, clock=clock) as s:
        _send(s, b"old")
        clock.advance(1_000)
        assert s.deliver_due() == 10  # level 1 only
    shutil.copytree(root, backup)
    with MessageStore.open(root, SMALL, clock=clock) as s:
        clock.advance(9_000)
        assert s.deliver_due() == 20  # levels 2 and 3
    newer = str(tmp_path / "newer.json")
    shutil.copy(_path(root), newer)
    shutil.rmtree(root)
    shutil.copytree(backup, root)
    with MessageStore.open(root, SMALL, clock=clock) as s:
        _send(s, b"new")  # the restored store goes on: its CommitLog passes savedAt
    shutil.copy(newer, _path(root))
    _deliver_everything(root, clock)


def test_the_normal_path_stays_a_stat(tmp_path, monkeypatch):
    """This process's own file is used as saved: no CommitLog scan."""
    from store.delayed import delay_levels as schedule
    from store.delayed import delivered_prefix
    from store.delayed import delivery as routing

    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    with MessageStore.open(root, SMALL, clock=clock) as s:
        clock.advance(1_000)
        s.deliver_due()  # the first run checks the file it found
        scans = []
        real = routing.origins_since

        def counting(*args, **kwargs):
            scans.append(args[1:])
            return real(*args, **kwargs)

        for module in (schedule, delivered_prefix):
            monkeypatch.setattr(module, "origins_since", counting)
        for _ in range(3):
            clock.advance(3_000)
            s.deliver_due()
            s.delay_levels.pending_count()
        assert scans == []


def test_a_file_from_an_earlier_process_is_proven_by_its_hint(tmp_path, monkeypatch):
    """The file says where the copy of each level's last delivered entry was appended
    (``lastCopies``): a new process checks that range, not the CommitLog since the entry."""
    from store.delayed import delay_offset_file as offset_file

    clock, root = FakeClock(), str(tmp_path / "s")
    _store_with_delivered(root, clock)
    assert set(read_lenient_json(_path(root))["lastCopies"]) == {"1", "2", "3"}

    def no_probe(*args, **kwargs):
        raise AssertionError("the entries were probed: the hint did not prove the offset")

    monkeypatch.setattr(offset_file, "delivered_prefix", no_probe)
    with MessageStore.open(root, SMALL, clock=clock) as s:
        clock.advance(10_000)
        assert s.deliver_due() == 30  # the pending ones; the file's offsets proven by hints


def _model_run(root: str, clock: FakeClock, sent: dict, offsets) -> None:
    """Damage the offsets (``offsets``: level -> value), reopen, deliver at a few times, and
    compare with the model: each message exactly once, never before it was due."""
    _edit(root, lambda table: {level: offsets.get(level, off) for level, off in table.items()})
    with MessageStore.open(root, SMALL, clock=clock) as s:
        for _ in range(4):  # 12 s: past the longest level (10 s)
            s.deliver_due()
            for v in visible(s, "t"):
                assert sent[v.body] <= v.store_timestamp_ms, f"{v.body!r} early"
            clock.advance(4_000)
        got = _counts(s)
    assert got == {b: 1 for b in sent}, "lost or doubled"


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_damage_both_ways_against_a_model(tmp_path_factory, data):
    clock = FakeClock()
    root = str(tmp_path_factory.mktemp("m") / "s")
    sent: dict[bytes, int] = {}
    with MessageStore.open(root, SMALL, clock=clock) as s:
        p = s.producer("g")
        for step in range(data.draw(st.integers(1, 4), label="rounds")):
            for i in range(data.draw(st.integers(0, 6), label="sends")):
                level = data.draw(st.sampled_from(LEVELS), label="level")
                body = b"%d-%d-%d" % (step, level, i)
                p.send(Message("t", body), delay_level=level)
                sent[body] = clock() + SMALL.delay_levels_ms[level - 1]
            clock.advance(data.draw(st.sampled_from((0, 1_000, 3_000, 6_000)), label="wait"))
            s.deliver_due()
        ends = {level: s.consume_queue("SCHEDULE_TOPIC_XXXX", level - 1).max_offset(
            s.confirmed_offset()) for level in LEVELS}
    damaged = {level: data.draw(st.integers(0, ends[level]), label=f"offset {level}")
               for level in LEVELS if data.draw(st.booleans(), label=f"damage {level}")}
    _model_run(root, clock, sent, damaged)


def test_a_rocketmq_stores_delivered_levels_stay_delivered(rocketmq_root, tmp_path):
    """RocketMQ's copies carry no origin: what its ``delayOffset.json`` says was delivered
    when rmq took the store over is kept (the owner mark), across reopens and damage."""
    path = str(tmp_path / "store")
    shutil.copytree(os.path.join(rocketmq_root, "clean-shutdown"), path)
    far_future = 4_000_000_000_000
    with MessageStore.open(path, clock=lambda: far_future) as store:
        assert store.delay_levels.offsets() == {1: 8, 2: 7}
        assert store.deliver_due() == 8  # level 18's, the ones RocketMQ had not delivered
    for table in (None, {1: 0, 2: 0, 18: 8}, {1: 8, 2: 7, 18: 0}):
        if table is not None:
            _edit(path, lambda _, t=table: t)
        with MessageStore.open(path, clock=lambda: far_future) as store:
            assert store.deliver_due() == 0
            assert store.delay_levels.offsets() == {1: 8, 2: 7, 18: 8}
