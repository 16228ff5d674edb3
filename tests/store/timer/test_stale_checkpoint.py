"""A whole, valid but stale ``config/timercheck`` (a restored backup, an old copy): its read
time, offsets and slotDone are older than what the timer really reached.  What was delivered
after it was saved (from the wheel, straight from the queue, or re-put as a roll) is never
delivered again, nothing the timer log holds is skipped, and the pending count is right."""

from __future__ import annotations

import collections
import os
import shutil

import pytest
from conftest import SMALL, FakeClock
from queue_reading import visible

from store import Message, MessageStore

#: (body, delay ms): wheel slots a few seconds out, one straight from the queue (sent while
#: no delivery runs, already due when enqueued) and one rolled (past the roll window)
PLAN = [(b"soon%d" % i, 2_000 + 300 * i) for i in range(12)] + [(b"roll", 150_000)]
#: deliver_due steps (fake ms after the sends); a backup of the checkpoint after each.  The
#: roll's re-put (at about 102 s) grows the TimerLog, which the open's check of the log
#: against the checkpoint finds for the backups before it; the one after it (120 s, before
#: the roll's delivery at 160 s) is stale in its read time only
STEPS = (500, 2_500, 4_000, 6_000, 120_000, 160_000)


def _check(root: str) -> str:
    return os.path.join(root, "config", "timercheck")


def _counts(store) -> collections.Counter:
    return collections.Counter(v.body for v in visible(store, "t"))


def _run_with_backups(root: str, backups: str, clock: FakeClock) -> None:
    os.makedirs(backups)
    with MessageStore.open(root, SMALL, clock=clock) as store:
        start = clock()
        p = store.producer("g")
        for body, delay in PLAN:
            p.send(Message("t", body), delay_ms=delay)
        for i, at in enumerate(STEPS):
            if i == 2:  # sent with no run until it is due: delivered straight from the queue
                p.send(Message("t", b"direct"), delay_ms=200)
            clock.advance(start + at - clock())
            store.deliver_due()
            shutil.copyfile(_check(root), os.path.join(backups, str(i)))


def _restore(tmp_path, backup: int) -> tuple[str, FakeClock, collections.Counter]:
    """The store after the whole plan's steps, its checkpoint replaced by backup ``backup``;
    what the topic held before."""
    clock, root = FakeClock(), str(tmp_path / "s")
    _run_with_backups(root, str(tmp_path / "b"), clock)
    with MessageStore.open(root, SMALL, clock=clock) as store:
        before = _counts(store)
    shutil.copyfile(str(tmp_path / "b" / str(backup)), _check(root))  # the backup put back
    return root, clock, before


@pytest.mark.parametrize("backup", range(len(STEPS) - 1))
def test_a_stale_checkpoint_delivers_nothing_twice(tmp_path, backup):
    root, clock, before = _restore(tmp_path, backup)
    with MessageStore.open(root, SMALL, clock=clock) as store:
        store.deliver_due()
        assert _counts(store) == before  # nothing again, nothing early
        clock.advance(200_000)
        store.deliver_due()
        counts = _counts(store)
    assert set(counts) == {body for body, _ in PLAN} | {b"direct"}
    assert set(counts.values()) == {1}


@pytest.mark.parametrize("backup", range(len(STEPS) - 1))
def test_a_stale_checkpoint_counts_what_is_pending(tmp_path, backup, caplog):
    root, clock, before = _restore(tmp_path, backup)
    pending = len(PLAN) + 1 - sum(before.values())
    with MessageStore.open(root, SMALL, clock=clock) as store:
        assert store.timer.pending_count() == pending
        assert store.pending_delayed_stats()["timer_pending"] == pending
    # the store says so: a stale read time (the last backup), or a TimerLog grown past the
    # checkpoint's end (the earlier ones: rebuilt)
    assert ("a stale copy" if backup == len(STEPS) - 2 else "rebuilt") in caplog.text


def test_the_newest_checkpoint_costs_no_scan(tmp_path, monkeypatch):
    """A checkpoint that is the newest is proven by a scan of what was appended since its
    save only (nothing here): the records delivered before are not read again."""
    from store.timer import timer_service

    clock, root = FakeClock(), str(tmp_path / "s")
    _run_with_backups(root, str(tmp_path / "b"), clock)
    scanned = []
    real = timer_service.timer_origins_since

    def counting(store, start, end=None):
        scanned.append(store.confirmed_offset() - start)
        return real(store, start, end)

    monkeypatch.setattr(timer_service, "timer_origins_since", counting)
    with MessageStore.open(root, SMALL, clock=clock) as store:
        clock.advance(200_000)
        store.deliver_due()
        assert sum(_counts(store).values()) == len(PLAN) + 1
    assert scanned == []


def test_a_backup_taken_before_a_slot_fired(tmp_path):
    """The simplest case: the backup was taken after the messages were placed in the wheel,
    the slot fired, the backup was put back (the old code delivered all 21 again)."""
    clock, root, n = FakeClock(), str(tmp_path / "s"), 21
    with MessageStore.open(root, SMALL, clock=clock) as store:
        p = store.producer("g")
        for i in range(n):
            p.send(Message("t", b"early%d" % i), delay_ms=4_000)
            p.send(Message("t", b"late%d" % i), delay_ms=30_000)
        clock.advance(500)
        store.deliver_due()  # placed in the wheel
        shutil.copyfile(_check(root), str(tmp_path / "backup"))
        clock.advance(5_000)
        store.deliver_due()
    shutil.copyfile(str(tmp_path / "backup"), _check(root))
    with MessageStore.open(root, SMALL, clock=clock) as store:
        store.deliver_due()
        assert sum(_counts(store).values()) == n
        assert store.timer.pending_count() == n
        clock.advance(30_000)
        store.deliver_due()
        counts = _counts(store)
    assert len(counts) == 2 * n and set(counts.values()) == {1}
