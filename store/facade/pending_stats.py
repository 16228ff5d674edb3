"""Store-wide figures for dashboards and ``rmq stats``: pending delayed messages by due time."""

from __future__ import annotations

import numpy as np

from ..delayed.delay_levels import DelayLevelService
from ..timer.timer_service import TimerService

#: RocketMQ's timer distribution buckets (seconds ahead of now), plus "overdue" and "later".
DUE_BUCKETS_S = (5, 60, 300, 900, 3600, 14400, 28800, 86400)


def _label(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def pending_delayed_stats(now: int, schedule: DelayLevelService, timer: TimerService) -> dict:
    """Pending delay-level and timer messages, with counts per due-time bucket.

    Returns ``{"pending", "schedule_pending", "timer_pending", "next_due_ms", "by_due"}`` where
    ``by_due`` is a list of ``{"label", "upper_s", "count"}`` (``upper_s`` None = later).
    """
    level_due = schedule.pending_due_ms()
    timer_due, timer_num = timer.pending_due_ms()
    due = np.concatenate([level_due, timer_due])
    weight = np.concatenate([np.ones(len(level_due), np.int64), timer_num])
    ahead_s = (due - now) / 1000.0
    edges = np.array((0,) + DUE_BUCKETS_S, dtype=np.float64)
    # bucket 0: overdue (not yet moved); bucket i: (edges[i-1], edges[i]]; last: later
    idx = np.searchsorted(edges, ahead_s, side="left")
    counts = np.bincount(idx, weights=weight, minlength=len(edges) + 1).astype(np.int64)
    by_due = [{"label": "due now", "upper_s": 0, "count": int(counts[0])}]
    for i, upper in enumerate(DUE_BUCKETS_S, start=1):
        by_due.append({"label": f"≤ {_label(upper)}", "upper_s": upper, "count": int(counts[i])})
    by_due.append({"label": f"> {_label(DUE_BUCKETS_S[-1])}", "upper_s": None,
                   "count": int(counts[-1])})
    return {
        "pending": int(weight.sum()),
        "schedule_pending": int(len(level_due)),
        "timer_pending": int(timer_num.sum()),
        "next_due_ms": int(due.min()) if len(due) else None,
        "by_due": by_due,
    }
