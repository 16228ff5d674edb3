"""Crash points: the named durable writes of the timer, the delay levels, the recurring
schedules, the delay keys and the transactions, where a test can have the process killed.

Each write site calls :func:`crash_point` just before the write (``"before"``) and just after
it (``"after"``).  A test arms one point for a child process with the environment variable

    RMQ_CRASH_AT=<point>:<before|after>:<n>

and the child kills itself with SIGKILL the ``n``-th time it reaches that side of that point:
a crash exactly there, found from the code rather than by a random sleep
(``tests/store/test_crash_points.py`` kills a workload at every point and reopens).  When
nothing is armed (always, outside such tests) a point costs one global lookup.

:data:`POINTS` lists every point with the write it stands for; a site must use one of them.
"""

from __future__ import annotations

import os
import signal

#: Point -> the write it marks.
POINTS: dict[str, str] = {
    "timer.log_append": "TimerLog units of newly enqueued (or rolled) timer messages",
    "timer.wheel_update": "the wheel slots pointing at those units",
    "timer.checkpoint": "the timer checkpoint (config/timercheck)",
    "timer.roll": "a long delay's copy re-put to the timer topic (one roll)",
    "timer.key_table": "the delay keys' table (timerkeys)",
    "delivery.append": "due messages appended to their real topics (levels and timer)",
    "delay_levels.offset_save": "the delay levels' offsets (config/delayOffset.json)",
    "schedules.mark": "the recurring schedules' delivery mark",
    "schedules.fire_append": "the copies a schedule firing appends",
    "schedules.book": "the schedule book (config/rmq_schedules.json)",
    "transaction.half": "a half message",
    "transaction.commit_copy": "the committed copies of ended transactions",
    "transaction.op": "the op messages that end transactions",
    "transaction.put_back": "a check round's put-back copies of open halves",
    "transaction.progress": "the check loop's progress file",
}

WHEN = ("before", "after")


def _armed() -> tuple[str, str, int] | None:
    spec = os.environ.get("RMQ_CRASH_AT")
    if not spec:
        return None
    point, when, n = spec.rsplit(":", 2)
    if point not in POINTS or when not in WHEN or not n.isdigit() or int(n) < 1:
        raise ValueError(f"RMQ_CRASH_AT={spec!r}; allowed: <point>:<before|after>:<n >= 1> "
                         f"with a point of {sorted(POINTS)}")
    return point, when, int(n)


_ARMED = _armed()
_reached: dict[tuple[str, str], int] = {}


def crash_point(point: str, when: str) -> None:
    """Mark that the process is ``when`` (``"before"`` / ``"after"``) the write ``point``;
    kills the process there when a test armed it (see the module docstring)."""
    if _ARMED is None:
        return
    n = _reached[(point, when)] = _reached.get((point, when), 0) + 1
    if (point, when, n) == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
