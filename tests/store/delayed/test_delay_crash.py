"""SIGKILL of a real process while it delivers delayed messages, then reopen: exactly once.

A child process opens a prepared store on a fixed clock and runs ``deliver_due`` with a kill
planted at one point of the delivery (before or after an append, halfway through writing a
CommitLog chunk, between TimerLog units and the wheel update, in the middle of a wheel update,
around each progress save), or is killed by the parent at a random moment.  The store is then
reopened (recovery runs) and delivery finished; every message must be in its topic exactly
once, and cancelled ones nowhere.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from store import Message, MessageStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
T0 = 1_700_000_000_000
TOPICS = ("orders", "payments", "audit")

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from conftest import SMALL
    from store import MessageStore
    from store.files import broker_files
    from store.core import appender
    from store.delayed import restore as bulk, delay_levels as schedule, delay_offset_file
    from store.timer import slot_firing as firing, wheel_placement as placement
    from store.timer import timer_service as service, timer_checkpoint as ckpt, timer_log, wheel

    path, now, plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    bulk.RESTORE_CHUNK = 40
    placement.ENQUEUE_CHUNK = 60
    firing.DEQUEUE_CHUNK = 50
    firing.MARKER_CHUNK = 60
    schedule.SCHEDULE_CHUNK = 30
    calls = {{}}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def planted(name, original, obj=None):
        def wrapper(*args, **kwargs):
            n = calls[name] = calls.get(name, 0) + 1
            if plan and plan["point"] == name and plan["call"] == n:
                if plan["when"] == "before":
                    die()
                if plan["when"] == "torn":  # half the bytes of the first piece, then death
                    chunks = list(args[1]) if name == "commit" else None
                    if chunks:
                        appender_ = args[0]
                        core = appender_.core
                        core.checkpoint.set("write_in_progress", appender_.write_offset)
                        off, data = chunks[0]
                        core.commit_log.write(off, data[:len(data) // 2])
                    die()
                if plan["when"] == "mid":  # wheel.put: only the first field of each slot
                    self, times, first = args[0], args[1], args[2]
                    idx = self.ticks(times) % self.slots
                    self._slots["first_pos"][idx] = first
                    self._slots["last_pos"][idx] = 10**12
                    die()
                result = original(*args, **kwargs)
                die()
            return original(*args, **kwargs)
        return wrapper

    appender.Appender.commit = planted("commit", appender.Appender.commit)
    service.ckpt.save = planted("ckpt_save", ckpt.save)
    delay_offset_file.write_config = planted("json_save", broker_files.write_config)
    timer_log.TimerLog.write = planted("log_write", timer_log.TimerLog.write)
    wheel.TimerWheel.put = planted("wheel_put", wheel.TimerWheel.put)

    store = MessageStore.open(path, SMALL, clock=lambda: now, flush_service=False)
    print("opened", flush=True)
    total = 0
    while True:
        n = store.deliver_due()
        total += n
        if n == 0:
            break
    store.close()
    print("done", total, flush=True)
""")


def _prepare(path):
    """A store with timer messages in the wheel and in the queue, delay levels, cancels.

    Returns ``{msg_id: topic}`` of the messages that must arrive and the ids cancelled.
    """
    clock = [T0]
    s = MessageStore.open(path, _small(), clock=lambda: clock[0], flush_service=False)
    p = s.producer("g")
    rng = random.Random(5)
    expected, cancelled = {}, set()
    for i in range(300):
        topic = TOPICS[i % 3]
        r = p.send(Message(topic, f"w{i}".encode(), tags=f"t{i % 4}"),
                   delay_ms=rng.choice([500, 2_000, 20_000, 150_000, 900_000]) + i)
        expected[r.msg_id] = topic
    shared = T0 + 20_050  # one slot reached both from the wheel and from the queue
    for i in range(20):
        r = p.send(Message("orders", f"s{i}".encode()), deliver_at_ms=shared)
        expected[r.msg_id] = "orders"
    s.deliver_due()  # these are in the wheel now
    for i in range(20):
        r = p.send(Message("payments", f"u{i}".encode()), deliver_at_ms=shared)
        expected[r.msg_id] = "payments"
    for i in range(200):
        topic = TOPICS[i % 3]
        r = p.send(Message(topic, f"q{i}".encode()), delay_ms=rng.randint(100, 400_000))
        expected[r.msg_id] = topic
    for i in range(150):
        r = p.send(Message(TOPICS[i % 3], f"l{i}".encode()), delay_level=1 + i % 3)
        expected[r.msg_id] = TOPICS[i % 3]
    for msg_id in list(expected)[::37]:
        if expected[msg_id] and p.cancel(expected[msg_id], msg_id):
            cancelled.add(msg_id)
    s.close()
    return expected, cancelled


def _small():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from conftest import SMALL

    return SMALL


def _run_child(path, now, plan, *, kill_after_s=None):
    script = CHILD.format(root=ROOT, tests=os.path.join(ROOT, "tests"))
    proc = subprocess.Popen([sys.executable, "-c", script, path, str(now), json.dumps(plan)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after_s is not None:
        deadline = time.monotonic() + 30
        line = proc.stdout.readline()  # "opened"
        assert line.startswith("opened") or proc.poll() is not None, line
        time.sleep(kill_after_s)
        proc.send_signal(signal.SIGKILL)
        assert time.monotonic() < deadline
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _check(path, now, expected, cancelled):
    s = MessageStore.open(path, _small(), clock=lambda: now, flush_service=False)
    while s.deliver_due():
        pass
    counts = collections.Counter()
    for topic in TOPICS:
        for q in s.queue_ids(topic):
            offset = 0
            while True:
                batch = s.pull(topic, q, offset, 1000)
                if not batch:
                    break
                for v in batch:
                    counts[v.msg_id] += 1
                    assert expected[v.msg_id] == topic
                    assert v.store_timestamp_ms >= v.deliver_timestamp_ms
                offset += len(batch)
    s.close()
    twice = {k: c for k, c in counts.items() if c > 1}
    assert not twice, f"delivered more than once: {len(twice)}"
    assert not set(counts) & cancelled, "a cancelled message surfaced"
    return counts


PLANS = [
    {"point": "ckpt_save", "call": 1, "when": "after"},   # timer mark saved, nothing else
    {"point": "log_write", "call": 2, "when": "after"},   # units written, wheel not updated
    {"point": "wheel_put", "call": 1, "when": "mid"},     # a torn update of a live slot
    {"point": "wheel_put", "call": 2, "when": "mid"},     # a torn wheel update
    {"point": "commit", "call": 1, "when": "before"},
    {"point": "commit", "call": 3, "when": "torn"},       # half a CommitLog chunk on disk
    {"point": "commit", "call": 6, "when": "after"},
    {"point": "commit", "call": 14, "when": "after"},
    {"point": "ckpt_save", "call": 2, "when": "before"},  # all delivered, progress not saved
    {"point": "json_save", "call": 1, "when": "after"},   # schedule mark saved
    {"point": "json_save", "call": 2, "when": "before"},  # schedule delivered, not saved
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    path = str(base / "template")
    expected, cancelled = _prepare(path)
    assert cancelled
    return path, expected, cancelled


def _copy(src, dst):
    subprocess.run(["cp", "-a", src, dst], check=True)
    return dst


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"{p['point']}-{p['call']}-{p['when']}")
def test_kill_at_a_planted_point(prepared, tmp_path, plan):
    template, expected, cancelled = prepared
    path = _copy(template, str(tmp_path / "s"))
    now = T0 + 10 * 86_400_000  # everything is due
    code, out, err = _run_child(path, now, plan)
    assert code == -signal.SIGKILL, (code, out, err[-2000:])  # the planted kill fired
    counts = _check(path, now, expected, cancelled)
    assert set(counts) == set(expected) - cancelled


def test_kill_twice_at_a_partial_due_time(prepared, tmp_path):
    """Crash, crash again during the redo, then finish; later messages still come once."""
    template, expected, cancelled = prepared
    path = _copy(template, str(tmp_path / "s"))
    now = T0 + 60_000  # only part is due
    for plan in ({"point": "commit", "call": 2, "when": "after"},
                 {"point": "commit", "call": 1, "when": "torn"}):
        code, _, err = _run_child(path, now, plan)
        assert code == -signal.SIGKILL, err[-2000:]
    counts = _check(path, now, expected, cancelled)
    assert 0 < len(counts) < len(expected) - len(cancelled)
    later = T0 + 10 * 86_400_000
    counts = _check(path, later, expected, cancelled)
    assert set(counts) == set(expected) - cancelled


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_at_a_random_moment(prepared, tmp_path, seed):
    template, expected, cancelled = prepared
    path = _copy(template, str(tmp_path / "s"))
    now = T0 + 10 * 86_400_000
    code, out, err = _run_child(path, now, None, kill_after_s=random.Random(seed).uniform(0, 0.4))
    assert code in (0, -signal.SIGKILL), err[-2000:]
    counts = _check(path, now, expected, cancelled)
    assert set(counts) == set(expected) - cancelled
