"""A store on a small or full filesystem: typed errors, never SIGBUS, nothing acknowledged lost.

Each case runs in a child process on a 16 MiB tmpfs (needs root to mount; skipped otherwise),
so that a SIGBUS fails the test instead of killing the test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_a_new_store_on_a_too_small_filesystem_is_a_typed_error(small_fs):
    code = """
        import sys
        from store import DiskFullError, MessageStore
        try:
            MessageStore.open(sys.argv[1])
        except DiskFullError as exc:
            print("typed:", exc)
    """
    path = os.path.join(small_fs, "store")
    for _ in range(2):  # and again: the failed creation left nothing half made
        done = _child(code, path)
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert "typed:" in done.stdout and "timerwheel" in done.stdout
        assert "no space left" in done.stdout


def test_filling_the_disk_loses_nothing_acknowledged(small_fs):
    code = """
        import sys
        from store import DiskFullError, Message, MessageStore, StoreConfig
        cfg = StoreConfig(commitlog_file_size_bytes=1024 * 1024, timer_wheel_slots=4096,
                          timer_roll_window_slots=1024,
                          timer_log_file_size_bytes=64 * 1024, consume_queue_file_entries=4096)
        acked = 0
        with MessageStore.open(sys.argv[1], cfg) as s:
            p = s.producer("g")
            try:
                for i in range(1_000_000):
                    p.send(Message("t", b"x" * 1000, keys=f"k{i}"))
                    acked += 1
            except DiskFullError as exc:
                print("full after", acked, "-", exc)
            for i in range(3):  # a smaller message may still fit the current segment
                try:
                    p.send(Message("t", b"again", keys=f"again{i}"))
                    acked += 1
                except DiskFullError:
                    print("still full")
        print("acked", acked)
    """
    reopen = """
        import sys
        from store import MessageStore
        with MessageStore.open(sys.argv[1], read_only=True) as s:
            n = sum(s.max_offset("t", q) - s.min_offset("t", q) for q in s.queue_ids("t"))
            keys = {v.keys[0] for q in s.queue_ids("t")
                    for v in s.pull("t", q, s.min_offset("t", q), 100_000)}
        print("readable", n, len(keys))
    """
    path = os.path.join(small_fs, "store")
    done = _child(code, path)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "full after" in done.stdout and "no space left" in done.stdout
    acked = int(done.stdout.split("acked")[-1].split()[0])
    assert acked > 1000
    done = _child(reopen, path)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    n, distinct = map(int, done.stdout.split("readable")[-1].split())
    assert n == distinct == acked  # every acknowledged send, once; nothing else
