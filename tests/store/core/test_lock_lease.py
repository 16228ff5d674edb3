"""The lease on the append lock (store/core/lock_lease.py): kept between one process's appends,
given back when the process goes idle or another one waits, never shared."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

from store import InvalidConfigError, Message, MessageStore, StoreConfig
from store.core.lock_lease import (
    LEASE_APPENDS,
    SHARED_NS,
    SPARSE_APPENDS,
    SPARSE_NS,
    STALE_HINT_NS,
    WAITING_SINCE,
    WAITING_SINCE_OFFSET,
    LockLease,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def other_handle_gets_lock(path: str) -> bool:
    """Whether another open file description of ``lock`` can take the ``flock`` right now
    (flock excludes descriptions, so this is what another process would see)."""
    fd = os.open(os.path.join(path, "lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also gives back a lock it took
    return True


def hint(path: str) -> int:
    with open(os.path.join(path, "lock"), "rb") as fh:
        return WAITING_SINCE.unpack_from(fh.read(), WAITING_SINCE_OFFSET)[0]


def wait_until(predicate, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.001)
    return predicate()


def test_a_lease_is_kept_between_appends_and_given_back_when_idle(tmp_path):
    path = str(tmp_path / "s")
    # a lease long enough that a loaded machine cannot end it before the check below
    with MessageStore.open(path, StoreConfig(append_lock_lease_ms=500)) as store:
        p = store.producer("g")
        p.send(Message("T", b"a"))
        assert not other_handle_gets_lock(path)  # kept after the append returned
        assert wait_until(lambda: other_handle_gets_lock(path))  # given back while idle
        store._lease.sparse_until_ns = 0  # (one append did not pay for it: see below)
        p.send(Message("T", b"b"))  # and taken again
        assert not other_handle_gets_lock(path)
    assert other_handle_gets_lock(path)  # closing gives it back


def test_a_lease_that_covered_few_appends_is_not_taken_again_for_a_while(tmp_path):
    path = str(tmp_path / "s")
    # leases long enough that a loaded machine sends SPARSE_APPENDS within one
    with MessageStore.open(path, StoreConfig(append_lock_lease_ms=200)) as store:
        p = store.producer("g")
        p.send(Message("T", b"x"))  # creates the topic
        assert wait_until(lambda: other_handle_gets_lock(path))
        lease = store._lease
        lease.sparse_until_ns = 0
        for _ in range(SPARSE_APPENDS - 1):  # fewer appends than a lease must cover
            p.send(Message("T", b"x"))
        assert lease.held
        assert wait_until(lambda: other_handle_gets_lock(path))  # its time ran out
        assert lease.sparse_until_ns - time.monotonic_ns() > SPARSE_NS // 2
        p.send(Message("T", b"y"))
        assert not lease.held and other_handle_gets_lock(path)  # no lease, no thread woken
        lease.sparse_until_ns = time.monotonic_ns() - 1  # SPARSE_NS later: one is tried again
        for _ in range(SPARSE_APPENDS):  # a lease that covers enough, then runs out of time
            p.send(Message("T", b"z"))
        assert lease.held
        assert wait_until(lambda: other_handle_gets_lock(path))
        assert lease.sparse_until_ns < time.monotonic_ns()  # it paid: leases go on
        p.send(Message("T", b"w"))
        assert lease.held


def test_no_lease_when_turned_off(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig(append_lock_lease_ms=0)) as store:
        store.producer("g").send(Message("T", b"a"))
        assert other_handle_gets_lock(path)


def test_a_lease_ends_after_its_appends(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig(append_lock_lease_ms=1000)) as store:
        p = store.producer("g")
        p.send(Message("T", b"x"))  # creates the topic (an append of its own, no lease)
        store._lease.release()
        releases = []
        lease = store._lease
        real = lease.release
        lease.release = lambda: (releases.append(1), real())[1]
        for i in range(3 * LEASE_APPENDS):
            p.send(Message("T", b"x"))
        assert len(releases) == 3  # not one per append, not never


@pytest.mark.parametrize("value", [-1, 1001])
def test_lease_setting_is_checked(value):
    with pytest.raises(InvalidConfigError, match="append_lock_lease_ms"):
        StoreConfig(append_lock_lease_ms=value)


def test_a_waiter_writes_its_hint_and_clears_it_once_served(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path).close()
    other = os.open(os.path.join(path, "lock"), os.O_RDWR)
    fd = os.open(os.path.join(path, "lock"), os.O_RDWR)
    lease = LockLease(fd, 1, threading.RLock())
    try:
        fcntl.flock(other, fcntl.LOCK_EX)  # another process holds the lock
        waiter = threading.Thread(target=lease.acquire)
        waiter.start()
        assert wait_until(lambda: hint(path) != 0)
        fcntl.flock(other, fcntl.LOCK_UN)
        waiter.join(5)
        assert not waiter.is_alive()
        assert hint(path) == 0
        assert not lease.held  # it had to wait: no lease this time
        assert not other_handle_gets_lock(path)  # but it holds the lock for its append
        lease.release()
        lease.acquire()
        assert not lease.held  # nor for SHARED_NS after
        assert lease.shared_until_ns - time.monotonic_ns() > SHARED_NS // 2
        lease.release()
    finally:
        lease.close()
        os.close(fd)
        os.close(other)


def test_no_lease_while_another_process_waits_or_lately_appended(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path).close()
    fd = os.open(os.path.join(path, "lock"), os.O_RDWR)
    lease = LockLease(fd, 20, threading.RLock())
    try:
        with open(os.path.join(path, "lock"), "r+b") as fh:  # a process waits
            fh.seek(WAITING_SINCE_OFFSET)
            fh.write(WAITING_SINCE.pack(time.monotonic_ns()))
        lease.acquire()
        assert not lease.held  # this append only
        lease.release()
        with open(os.path.join(path, "lock"), "r+b") as fh:  # the waiter got in and left
            fh.seek(WAITING_SINCE_OFFSET)
            fh.write(WAITING_SINCE.pack(0))
        lease.acquire()
        assert not lease.held  # still none: it appended lately
        lease.release()
        lease.shared_until_ns = time.monotonic_ns() - 1  # SHARED_NS later
        lease.acquire()
        assert lease.held
        lease.release()

        with open(os.path.join(path, "lock"), "r+b") as fh:  # a stale hint is ignored
            fh.seek(WAITING_SINCE_OFFSET)
            fh.write(WAITING_SINCE.pack(time.monotonic_ns() - STALE_HINT_NS - 1))
        lease.acquire()
        assert lease.held
    finally:
        lease.close()
        os.close(fd)


def test_two_handles_in_one_process_take_no_lease(tmp_path):
    path = str(tmp_path / "s")
    a = MessageStore.open(path, StoreConfig(append_lock_lease_ms=500))
    b = MessageStore.open(path, StoreConfig(append_lock_lease_ms=500))
    try:
        t0 = time.monotonic()
        for i in range(50):  # each would wait for the other's lease to time out
            a.producer("a").send(Message("T", b"a"))
            b.producer("b").send(Message("T", b"b"))
            assert other_handle_gets_lock(path)
        assert time.monotonic() - t0 < 5
    finally:
        b.close()
    a.producer("a").send(Message("T", b"a"))  # alone again: leases again
    assert not other_handle_gets_lock(path)
    a.close()


WRITER = """
import sys, time
from store import Message, MessageStore
path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with MessageStore.open(path) as store:
    p = store.producer(name)
    while not __import__("os").path.exists(path + ".go"):
        time.sleep(0.001)
    worst, last = 0.0, time.perf_counter()
    for i in range(n):
        p.send(Message("T", f"{name}-{i}".encode()))
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
print(worst)
"""


def test_two_processes_appending_at_once_each_get_their_turn(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path).close()
    n = 3000
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, name, str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for name in ("a", "b")]
    time.sleep(1)
    open(path + ".go", "w").close()
    worst = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        worst.append(float(out))
    assert max(worst) < 2.0, worst  # nobody starved behind the other's leases
    with MessageStore.open(path) as store:
        bodies = []
        for q in store.queue_ids("T"):
            bodies += [m.body.decode() for m in store.pull("T", q, 0, 10 * n)]
    assert sorted(bodies) == sorted(f"{w}-{i}" for w in "ab" for i in range(n))


HOLDER = """
import sys, time
from store import Message, MessageStore, StoreConfig
store = MessageStore.open(sys.argv[1], StoreConfig(append_lock_lease_ms=1000))
store.producer("holder").send(Message("T", b"before the kill"))
print("SENT", flush=True)
time.sleep(60)
"""


def test_a_process_killed_holding_a_lease_leaves_the_lock_and_the_store_usable(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path).close()
    env = dict(os.environ, PYTHONPATH=ROOT)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "SENT", holder.stderr.read()
        assert not other_handle_gets_lock(path)  # the holder keeps its lease (1 s)
        holder.kill()  # SIGKILL: no close, no release
        holder.wait(10)
        assert other_handle_gets_lock(path)  # the lock went with the process
        with MessageStore.open(path) as store:
            store.producer("after").send(Message("T", b"after the kill"))
            bodies = sorted(m.body for q in store.queue_ids("T")
                            for m in store.pull("T", q, 0, 10))
        assert bodies == [b"after the kill", b"before the kill"]
    finally:
        holder.kill()
