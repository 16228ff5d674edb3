"""``warm_up()``: load the compiled loops before the first latency-bound call needs them.

Delivery, reads, writes and recovery run numba-compiled loops (:mod:`store.kernels`).  The
first call of each in a process loads its cached machine code (0.3-0.6 s), or on a fresh
install compiles it.  :func:`warm_up` runs those paths once on a throw-away store, on a fake
clock, so that the process's real work never waits for them.

The throw-away store lives in ``<tempdir>/rmq-warm-up-<pid>-*``.  It is small (a 4,096-slot
timer wheel, 16 MiB segments: about 1 MB on disk) and removed when the warm-up ends.  A
process killed while warming up (a Spark worker stopped with its executor, a SIGKILL) cannot
remove it, so every warm-up first removes the directories whose owner has gone: each holds an
exclusive ``flock`` on its ``lock`` file while in use, which the kernel releases when the
owner dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time

from ..base.config import MIB, StoreConfig
from ..files.abort_marker import MARKER_FILE, write_marker
from ..base import jit
from ..formats.message import Message
from ..facade.message_store import MessageStore
from ..timer.timer_seal import remove_seal

log = logging.getLogger("store.operations.warm_up")

PREFIX = "rmq-warm-up-"
LOCK_NAME = "lock"
#: A directory younger than this is never removed by another process's sweep (its owner may
#: not hold its lock yet).
SWEEP_MIN_AGE_S = 60.0

#: The throw-away store: every path the real stores run, at a small size.
WARM_UP_CONFIG = dict(timer_precision_ms=100, timer_wheel_slots=4096,
                      timer_roll_window_slots=1024, timer_log_file_size_bytes=MIB,
                      commitlog_file_size_bytes=16 * MIB, consume_queue_file_entries=1000)


def warm_up(*, background: bool = False, timeout_s: float | None = None):
    """Load the compiled loops delivery, reads and writes run (numba's import and its cached
    machine code, 0.3-0.6 s; on a fresh install their compilation, see docs/benchmarks.md):
    run those paths on a throw-away store on a fake clock, then wait until :mod:`store.base.jit`
    has compiled every loop they ran as Python.

    Returns the seconds it took; with ``background=True`` it runs in a daemon thread and
    returns the thread at once (``rmq serve`` and a streaming query's delivery start it as
    they open their store; until it is done the Python versions serve small batches).
    ``timeout_s`` bounds the wait for the compiler.  The throw-away store is removed at the
    end; those of warm-ups killed before their end are removed by the next warm-up.
    """
    if background:
        thread = threading.Thread(target=_warm_up_logged, name="rmq-warm-up", daemon=True)
        thread.start()
        return thread
    t0 = time.monotonic()
    root = tempfile.gettempdir()
    sweep_stale(root)
    tmp = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)
    lock = os.open(os.path.join(tmp, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _exercise(os.path.join(tmp, "store"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(lock)
    jit.wait_compiled(timeout_s)
    return time.monotonic() - t0


def sweep_stale(root: str, *, now_s: float | None = None) -> list[str]:
    """Remove the warm-up directories in ``root`` whose owner has gone; returns their paths.

    A directory goes when its ``lock`` can be locked (no live process holds it) and it is older
    than :data:`SWEEP_MIN_AGE_S`.  One with no ``lock`` file (left by a version before locks)
    goes once it is an hour old.
    """
    now_s = time.time() if now_s is None else now_s
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(root, name)
        try:
            age = now_s - os.stat(path).st_mtime
        except OSError:
            continue
        if age < SWEEP_MIN_AGE_S:
            continue
        try:
            fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR)
        except FileNotFoundError:
            if age >= 3600 and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
            continue
        except OSError:  # not ours to open (another user's, or not a directory)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner is alive
            os.close(fd)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed


def _exercise(path: str) -> None:
    """Send, deliver, read, verify and recover once on a store at ``path``."""
    import pyarrow as pa

    now = [time.time_ns() // 1_000_000]
    config = StoreConfig(**WARM_UP_CONFIG)
    with MessageStore.open(path, config, clock=lambda: now[0], flush_service=False) as store:
        producer = store.producer("warm-up")
        producer.send(Message("warm-up", b"w", tags="a", keys="k"), delay_ms=500)
        for column, value, kind in (("delay_ms", 500, pa.int64()),
                                    ("delay_level", 1, pa.int32())):
            producer.send_table(pa.table({
                "topic": ["warm-up"] * 2, "body": [b"x", b"y"], "tags": ["a", "b"],
                "keys": ["k1", "k2"], column: pa.array([value] * 2, kind)}))
        for _ in range(3):  # queued -> wheel, then due
            now[0] += 2_000
            store.deliver_due()
        for queue_id in store.queue_ids("warm-up"):
            store.read_arrow("warm-up", queue_id, 0, store.max_offset("warm-up", queue_id),
                             verify_crc=True)
        store.verify_commitlog()
        store.producer("warm-up").send(Message("warm-up", b"t"), delay_ms=500)
        store.deliver_due()  # into the wheel, not due yet
    write_marker(os.path.join(path, MARKER_FILE))  # as a killed writer leaves it
    remove_seal(os.path.join(path, "config", "timercheck"))  # (the timer files checked too)
    with MessageStore.open(path, config, clock=lambda: now[0], flush_service=False) as store:
        now[0] += 2_000  # recovery's walk, then a slot walked from the timer log
        store.deliver_due()


def _warm_up_logged() -> None:
    try:
        log.info("compiled loops loaded in %.2f s (in the background)", warm_up())
    except Exception:  # noqa: BLE001 - the loops then load where they are first needed
        log.exception("warming the compiled loops failed")
