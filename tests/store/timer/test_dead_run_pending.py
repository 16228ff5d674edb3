"""A delivery run killed after it appended some copies (its mark saved, its progress not):
until the next run redoes it, the pending counts leave out what it delivered."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import SMALL, FakeClock
from queue_reading import visible

from store import Message, MessageStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SOON, LATER = 10, 20

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from conftest import SMALL
    from store import MessageStore
    store = MessageStore.open(sys.argv[1], SMALL, clock=lambda: int(sys.argv[2]))
    store.deliver_due()  # killed at the armed point
    raise SystemExit("the crash point was not reached")
""")


def _counts(store) -> collections.Counter:
    return collections.Counter(v.body for v in visible(store, "t"))


@pytest.mark.parametrize("arm, dead_delivered", [
    ("delivery.append:after:1", 1),  # the one straight from the queue (enqueued first)
    ("timer.checkpoint:before:2", SOON + 1),  # all it had to deliver, its progress unsaved
])
def test_pending_after_a_dead_run(tmp_path, arm, dead_delivered):
    clock, root = FakeClock(), str(tmp_path / "s")
    with MessageStore.open(root, SMALL, clock=clock) as store:
        p = store.producer("g")
        for i in range(SOON):
            p.send(Message("t", b"soon%d" % i), delay_ms=2_000)
        clock.advance(500)
        store.deliver_due()
        p.send(Message("t", b"direct"), delay_ms=1_000)  # due before the next run: straight
        for i in range(LATER):
            p.send(Message("t", b"later%d" % i), delay_ms=60_000)
        # cancelled: neither counts nor is delivered
        sent = p.send(Message("t", b"gone"), delay_ms=2_500)
        p.cancel("t", sent.msg_id)
    clock.advance(4_000)
    script = CHILD.format(root=ROOT, tests=os.path.join(ROOT, "tests"))
    env = dict(os.environ, RMQ_CRASH_AT=arm)
    child = subprocess.run([sys.executable, "-c", script, root, str(clock())], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == -9, child.stderr
    with MessageStore.open(root, SMALL, clock=clock) as store:
        assert store.timer.state().deliver_mark >= 0  # the dead run's mark
        delivered = sum(_counts(store).values())
        assert delivered == dead_delivered  # the dead run's copies
        assert store.timer.pending_count() == SOON + 1 + LATER - delivered
        assert store.pending_delayed_stats()["timer_pending"] == SOON + 1 + LATER - delivered
        store.deliver_due()
        assert store.timer.pending_count() == LATER
        clock.advance(60_000)
        store.deliver_due()
        counts = _counts(store)
        assert store.timer.pending_count() == 0
    assert sum(counts.values()) == SOON + 1 + LATER and set(counts.values()) == {1}
