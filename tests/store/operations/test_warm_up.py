"""warm_up(): its throw-away store is small and never left behind, even by a killed process."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from store import warm_up
from store.operations import warm_up as warm_up_module
from store.operations.warm_up import LOCK_NAME, PREFIX, sweep_stale

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _leftovers(root) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith(PREFIX))


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_a_warm_up_leaves_nothing_behind(temp_root):
    assert warm_up() > 0
    assert _leftovers(temp_root) == []


def test_the_sweep_removes_only_directories_whose_owner_has_gone(tmp_path):
    now = time.time()

    def make(name, *, lock=True, age_s=3 * 3600):
        path = tmp_path / name
        (path / "store").mkdir(parents=True)
        (path / "store" / "commitlog").write_bytes(b"x" * 100)
        if lock:
            (path / LOCK_NAME).write_bytes(b"")
        os.utime(path, (now - age_s, now - age_s))
        return path

    gone = make(f"{PREFIX}1-gone")
    alive = make(f"{PREFIX}2-alive")
    young = make(f"{PREFIX}3-young", age_s=5)
    old_format = make(f"{PREFIX}4-old", lock=False)
    recent_old_format = make(f"{PREFIX}5-old", lock=False, age_s=600)
    other = tmp_path / "someone-else"
    other.mkdir()
    os.utime(other, (now - 86400, now - 86400))
    holder = os.open(alive / LOCK_NAME, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a live owner (flock locks are per open file)
    try:
        removed = sweep_stale(str(tmp_path), now_s=now)
    finally:
        os.close(holder)
    assert sorted(removed) == sorted([str(gone), str(old_format)])
    assert not gone.exists() and not old_format.exists()
    assert alive.exists() and young.exists() and recent_old_format.exists() and other.exists()


@pytest.mark.slow
def test_a_killed_warm_up_is_cleaned_by_the_next(temp_root, monkeypatch):
    """A process SIGKILLed while warming up leaves its store; the next warm-up removes it."""
    env = dict(os.environ, TMPDIR=str(temp_root),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    child = subprocess.Popen([sys.executable, "-c",
                              "import store, time\n"
                              "from store.operations import warm_up as w\n"
                              "real = w._exercise\n"
                              "def slow(path):\n"
                              "    real(path)\n"
                              "    print('ready', flush=True)\n"
                              "    time.sleep(60)\n"
                              "w._exercise = slow\n"
                              "store.warm_up()\n"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        left = _leftovers(temp_root)
        assert len(left) == 1 and left[0].startswith(f"{PREFIX}{child.pid}-")
        monkeypatch.setattr(warm_up_module, "SWEEP_MIN_AGE_S", 0.0)
        assert sweep_stale(str(temp_root)) == []  # its owner is alive: kept
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert _leftovers(temp_root) == left
    size = sum(os.stat(os.path.join(d, f)).st_blocks * 512  # allocated bytes
               for d, _, fs in os.walk(temp_root / left[0]) for f in fs)
    assert size < 8 * 1024 * 1024, size  # the small throw-away store, not 40 MB of timer wheel
    warm_up()
    assert _leftovers(temp_root) == []
