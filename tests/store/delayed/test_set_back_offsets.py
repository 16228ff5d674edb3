"""A delay level's offset in ``config/delayOffset.json`` set back (a restored backup, a stale
``.bak``, an edit, damage to a smaller value) is checked against the CommitLog before it is
used: nothing is delivered twice, nothing is lost, nothing surfaces early, and the file heals
with the next save."""

from __future__ import annotations

import collections
import os
import random
import shutil

import pytest
from conftest import SMALL, FakeClock
from queue_reading import visible

from store import Message, MessageStore
from store.files.broker_files import read_lenient_json, write_config

LEVELS = (1, 2, 3)  # 1 s, 5 s, 10 s


def _path(root: str) -> str:
    return os.path.join(root, "config", "delayOffset.json")


def _counts(store) -> collections.Counter:
    return collections.Counter(v.body for v in visible(store, "t"))


def _store_with_delivered(root: str, clock: FakeClock, n: int = 10) -> None:
    """``n`` messages per level delivered, then ``n`` more per level pending (due later)."""
    with MessageStore.open(root, SMALL, clock=clock) as s:
        p = s.producer("g")
        for i in range(n):
            for level in LEVELS:
                p.send(Message("t", b"old-%d-%d" % (level, i)), delay_level=level)
        clock.advance(10_000)
        assert s.deliver_due() == n * len(LEVELS)
        for i in range(n):
            for level in LEVELS:
                p.send(Message("t", b"new-%d-%d" % (level, i)), delay_level=level)


def _edit(root: str, change) -> None:
    path = _path(root)
    data = read_lenient_json(path)
    table = {int(k): v for k, v in data["offsetTable"].items()}
    data["offsetTable"] = change(table)
    write_config(path, data)  # keeps savedAt and seal as they were: the seal breaks


def _deliver_everything(root: str, clock: FakeClock, n: int = 10) -> collections.Counter:
    with MessageStore.open(root, SMALL, clock=clock) as s:
        s.deliver_due()
        early = [b for b, _ in _counts(s).items() if b.startswith(b"new-3-")]
        assert not early, "delivered before they were due"
        clock.advance(10_000)
        s.deliver_due()
        got = _counts(s)
        assert s.deliver_due() == 0
    want = {b"%s-%d-%d" % (k, level, i) for k in (b"old", b"new") for level in LEVELS
            for i in range(n)}
    assert set(got) == want, "lost or unknown messages"
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


def test_a_restored_backup_delivers_nothing_twice(tmp_path):
    """A backup is self-consistent (its seal holds): what was delivered after it was saved is
    found from its ``savedAt`` on."""
    clock, root = FakeClock(), str(tmp_path / "s")
    with MessageStore.open(root, SMALL, clock=clock) as s:
        p = s.producer("g")
        for i in range(10):
            for level in LEVELS:
                p.send(Message("t", b"old-%d-%d" % (level, i)), delay_level=level)
        clock.advance(1_000)
        assert s.deliver_due() == 10  # level 1 only
    shutil.copy(_path(root), str(tmp_path / "backup.json"))
    with MessageStore.open(root, SMALL, clock=clock) as s:
        clock.advance(9_000)
        assert s.deliver_due() == 20  # levels 2 and 3
        p = s.producer("g")
        for i in range(10):
            for level in LEVELS:
                p.send(Message("t", b"new-%d-%d" % (level, i)), delay_level=level)
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
