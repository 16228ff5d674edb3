"""The file fuzzer (tools/fuzz_store.py) in the suite: damaged copies of every file kind the
store writes give no raw Python error, lose no message whose CommitLog record is intact,
serve no damaged body with verification on, and never make the store unopenable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fuzzer():
    return load_tool("fuzz_store")


def _check(report):
    problems = [f"[{kind}] {case}: {details}" for kind, case, details in report["problems"]]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("seed", [11, 12])
def test_fuzzed_files(tmp_path, seed):
    report = _fuzzer().fuzz(25, seed, work=str(tmp_path), log=None)
    assert report["counts"]["cases"] == 25
    _check(report)


@pytest.mark.slow
def test_fuzzed_files_many(tmp_path):
    """300 cases: 150 in a second process (``tools/fuzz_store.py``, which exits 1 on any
    problem) while this one runs 150: the suite runs on one core, the other is idle here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    other = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tools", "fuzz_store.py"), "--cases", "150",
         "--seed", "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        cwd=str(tmp_path))
    try:
        report = _fuzzer().fuzz(150, 7, work=str(tmp_path / "here"), log=None)
    finally:
        out, _ = other.communicate(timeout=900)
    _check(report)
    assert other.returncode == 0, out[-5000:]
    assert '"cases": 150' in out, out[-2000:]


def test_the_fuzzer_can_fail(tmp_path, monkeypatch):
    """A store that loses a queue silently is caught: the judge is not blind."""
    fuzz = _fuzzer()
    from store.core import integrity

    monkeypatch.setattr(integrity, "lost_queues", lambda store: [])
    base = fuzz.build_base(str(tmp_path / "base"))
    import random

    out = fuzz.run_case(base, str(tmp_path / "case"), "consumequeue/orders/1/" + "0" * 20,
                        "delete", random.Random(1), True)
    assert out.lost


def test_the_fuzzer_sees_a_refused_message(tmp_path, monkeypatch):
    """A store that reports a damaged queue instead of rebuilding it is caught too: intact
    messages refused with a typed error count against it."""
    fuzz = _fuzzer()
    from store.core import reading

    monkeypatch.setattr(reading.ReadableStore, "_heal", lambda self, topic, queue_id: False)
    base = fuzz.build_base(str(tmp_path / "base"))
    import random

    out = fuzz.run_case(base, str(tmp_path / "case"), "consumequeue/orders/1/" + "0" * 20,
                        "zero", random.Random(2), True)
    assert out.refused and not out.lost


def test_damaged_progress_fields_are_judged_by_delivery(tmp_path):
    """Fields of the timer checkpoint and the delay levels' offsets made wrong: every delayed
    message delivered once, none early."""
    report = _fuzzer().fuzz(12, 21, work=str(tmp_path), log=None, only="config/",
                            kinds=("field",))
    assert report["counts"]["kind:field"] == 12
    _check(report)


def test_damaged_timer_files_are_judged_by_delivery(tmp_path):
    """Bits flipped and ranges zeroed inside the timer wheel and the TimerLog: judged by what
    is delivered (every delayed message once, none early), as every other file is."""
    fuzz = _fuzzer()
    assert not hasattr(fuzz, "DELIVERY_UNCHECKED")
    report = fuzz.fuzz(10, 31, work=str(tmp_path), log=None, only="timer",
                       kinds=("flip", "zero"))
    assert report["counts"]["cases"] == 10
    _check(report)


def test_the_delivery_judge_sees_lost_timer_messages(tmp_path, monkeypatch):
    """A store that does not check its timer files loses the timer messages a damaged slot
    names, and the fuzzer says so."""
    from store.timer import timer_service as service

    fuzz = _fuzzer()
    monkeypatch.setattr(service, "timer_files_problem", lambda *args: None)
    base = fuzz.build_base(str(tmp_path / "base"))
    wheel = os.path.join(base.path, "timerwheel")
    import numpy as np

    from store.timer.wheel import SLOT_DTYPE

    slots = np.fromfile(wheel, dtype=SLOT_DTYPE)
    live = np.flatnonzero((slots["last_pos"] >= 0) & (slots["time"] >= slots["time"].max()))
    with open(wheel, "rb") as fh:
        data = bytearray(fh.read())
    at = int(live[0]) * SLOT_DTYPE.itemsize
    data[at + 16:at + 24] = bytes(8)  # the far-* slot's lastPos zeroed: its chain is lost
    with open(wheel, "wb") as fh:
        fh.write(data)
    out = fuzz.Outcome("timerwheel: a live slot's lastPos zeroed")
    fuzz._judge_delivery(base.path, base.clock_ms, out)
    assert out.undelivered


def test_the_delivery_judge_can_fail(tmp_path, monkeypatch):
    """Delivering every delayed message twice is seen (the judge is not blind)."""
    from store.facade.message_store import MessageStore

    fuzz = _fuzzer()
    real = MessageStore.deliver_due

    def twice(self, max_messages=None):
        n = real(self, max_messages)
        if n:
            for q in self.queue_ids("reminders"):
                end = self.max_offset("reminders", q)
                views = self.pull("reminders", q, max(0, end - n), n)
                self.producer("x").send_batch(
                    [fuzz.Message("reminders", v.body) for v in views])
        return n

    monkeypatch.setattr(MessageStore, "deliver_due", twice)
    report = fuzz.fuzz(2, 21, work=str(tmp_path), log=None, only="config/", kinds=("field",))
    assert report["counts"].get("cases with doubled", 0) >= 1
