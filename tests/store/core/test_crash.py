"""SIGKILL of real writer processes: no acknowledged message lost, nothing torn visible."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from store import Message, MessageStore, StoreConfig

sys.path.insert(0, os.path.dirname(__file__))
from writer_proc import SMALL, body_of, check_view  # noqa: E402

AFTER = itertools.count()

WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "writer_proc.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SYNC = StoreConfig(flush_disk_type="SYNC_FLUSH", **SMALL)
TOPICS = ("a", "b")


def spawn(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, WRITER, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        raise AssertionError(f"writer did not start: {line!r} {proc.stderr.read()}")
    return proc


def acks(path: str) -> list[tuple]:
    """Complete ack lines: (msg_id, topic, queue_id, queue_offset, commitlog_offset, w, seq)."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        text = fh.read()
    out = []
    for line in text.split("\n")[:-1]:  # a line cut by the kill has no newline yet
        m, t, q, qo, co, w, s = line.split()
        out.append((m, t, int(q), int(qo), int(co), int(w), int(s)))
    return out


def kill_at_random(proc: subprocess.Popen, ack: str, rng: random.Random) -> None:
    """Let the writer acknowledge a random number of messages, then SIGKILL it."""
    target = rng.randint(1, 120)
    deadline = time.monotonic() + 60
    while len(acks(ack)) < target and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.01))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()


def verify(store: MessageStore, acked: list[tuple]) -> dict[tuple[str, int], int]:
    """Every acknowledged message is there, intact; every visible message is intact and
    queue offsets are contiguous.  Returns the max offset of each queue."""
    for msg_id, topic, q, qoff, coff, w, s in acked:
        views = store.pull(topic, q, qoff)
        assert views, f"acknowledged message {msg_id} ({topic}/{q}/{qoff}) is lost"
        v = views[0]
        assert (v.msg_id, v.commitlog_offset) == (msg_id, coff)
        assert check_view(v) == (w, s)
    maxes = {}
    for topic in TOPICS:
        if topic not in store.topics():
            continue
        for q in store.queue_ids(topic):
            lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
            views = store.pull(topic, q, lo, hi - lo + 1)
            assert [v.queue_offset for v in views] == list(range(lo, hi))
            for v in views:
                check_view(v)  # nothing torn is visible
            maxes[(topic, q)] = hi
    return maxes


def append_continues(store: MessageStore, maxes: dict) -> None:
    """After recovery, appends land right after the last record of each queue."""
    p = store.producer("after")
    for _ in range(4):
        seq = next(AFTER)
        r = p.send(Message("a", body_of(-1, seq), properties={"w": "-1", "s": str(seq)}))
        assert r.queue_offset == maxes.get(("a", r.queue_id), 0)
        assert r.commitlog_offset + store.read_record(r.commitlog_offset).total_size == (
            store.confirmed_offset())
        maxes[("a", r.queue_id)] = r.queue_offset + 1


@pytest.mark.slow
def test_sigkill_of_a_sync_writer_loses_no_acknowledged_message(tmp_path):
    seed = int(os.environ.get("RMQ_CRASH_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    path = str(tmp_path / "store")
    acked: list[tuple] = []
    for round_ in range(4):
        ack = str(tmp_path / f"ack{round_}")
        proc = spawn("write", "--store", path, "--writer", str(round_), "--topics",
                     ",".join(TOPICS), "--sync", "--ack", ack, "--batch-every", "3")
        kill_at_random(proc, ack, rng)
        acked += acks(ack)
        assert os.path.exists(os.path.join(path, "abort")), "a killed writer leaves its marker"
        with MessageStore.open(path, SYNC) as s:
            assert s.recovered, f"seed {seed}"
            maxes = verify(s, acked)
            append_continues(s, maxes)
            verify(s, acked)
    assert len(acked) >= 4
    with MessageStore.open(path, SYNC) as s:
        assert not s.recovered
        verify(s, acked)


@pytest.mark.slow
def test_sigkill_while_another_process_keeps_the_store_open(tmp_path):
    seed = int(os.environ.get("RMQ_CRASH_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    path = str(tmp_path / "store")
    keeper = MessageStore.open(path, SYNC)  # stays open the whole time: no crash recovery
    acked: list[tuple] = []
    try:
        for round_ in range(3):
            ack = str(tmp_path / f"ack{round_}")
            proc = spawn("write", "--store", path, "--writer", str(round_), "--topics",
                         ",".join(TOPICS), "--sync", "--ack", ack, "--batch-every", "2")
            kill_at_random(proc, ack, rng)
            acked += acks(ack)
            maxes = verify(keeper, acked)
            append_continues(keeper, maxes)  # repairs first if the kill hit an append
            assert keeper.checkpoint.get("write_in_progress") == -1
            verify(keeper, acked)

        # a kill that certainly lands inside an append: half a batch written, unconfirmed
        before = verify(keeper, acked)
        confirmed = keeper.confirmed_offset()
        proc = spawn("write", "--store", path, "--writer", "9", "--topics", "a",
                     "--sync", "--hang-mid-write")
        assert proc.stdout.readline().strip() == "MIDWRITE"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert keeper.checkpoint.get("write_in_progress") == confirmed  # left behind
        assert verify(keeper, acked) == before  # the half-written batch is invisible
        seq = next(AFTER)
        r = keeper.producer("after").send(Message("a", body_of(-1, seq),
                                                  properties={"w": "-1", "s": str(seq)}))
        assert keeper.checkpoint.get("write_in_progress") == -1
        # the unconfirmed batch was dropped whole: the next record takes its place
        assert r.commitlog_offset == confirmed or r.commitlog_offset % SMALL[
            "commitlog_file_size_bytes"] == 0
        assert r.queue_offset == before.get(("a", r.queue_id), 0)
        after = verify(keeper, acked)
        assert after == {**before, ("a", r.queue_id): r.queue_offset + 1}
    finally:
        keeper.close()
    assert not os.path.exists(os.path.join(path, "abort"))
    with MessageStore.open(path, SYNC) as s:
        assert verify(s, acked) == after
        assert s.pull("a", r.queue_id, r.queue_offset)[0].msg_id == r.msg_id


def test_sigkill_inside_a_single_send_drops_that_record_whole(tmp_path):
    """A single send killed with half its record in the CommitLog (written through the
    segment's writable mapping): never visible, and the next send takes its place."""
    path = str(tmp_path / "store")
    keeper = MessageStore.open(path, SYNC)
    try:
        p = keeper.producer("before")
        for i in range(5):
            p.send(Message("a", body_of(-2, i), properties={"w": "-2", "s": str(i)}))
        before = verify(keeper, [])
        confirmed = keeper.confirmed_offset()
        proc = spawn("write", "--store", path, "--writer", "8", "--topics", "a", "--sync",
                     "--hang-mid-write", "--single")
        assert proc.stdout.readline().strip() == "MIDWRITE"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert keeper.checkpoint.get("write_in_progress") == confirmed  # left behind
        buf, pos, _ = keeper.commit_log.buffer_at(confirmed)
        assert any(buf[pos:pos + 64])  # the first half of the record is really there
        assert verify(keeper, []) == before  # and invisible
        seq = next(AFTER)
        r = p.send(Message("a", body_of(-1, seq), properties={"w": "-1", "s": str(seq)}))
        assert keeper.checkpoint.get("write_in_progress") == -1
        assert r.commitlog_offset == confirmed
        assert r.queue_offset == before.get(("a", r.queue_id), 0)
        assert verify(keeper, []) == {**before, ("a", r.queue_id): r.queue_offset + 1}
    finally:
        keeper.close()
    with MessageStore.open(path, SYNC) as s:
        assert not s.recovered
        assert s.pull("a", r.queue_id, r.queue_offset)[0].msg_id == r.msg_id
