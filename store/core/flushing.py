"""Flushing: make appended records durable and record how far in the checkpoint.

:class:`FlushService` runs beside appends (``fdatasync`` needs no append lock) and, when
started, in a background thread every ``flush_interval_commitlog_ms``; the checkpoint's
``flushed_phy_offset`` only moves forward, and only after the data below it is on disk.  A
background failure is kept and raised (as :class:`~store.base.errors.FlushError`) by the store's
next write or ``flush()``.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from ..files.checkpoint import StoreCheckpoint
from ..files.commit_log import CommitLog

log = logging.getLogger("store")


class FlushService:
    """Flushes one store's CommitLog, queues and checkpoint (see the module docstring)."""

    def __init__(self, root: str, commit_log: CommitLog, checkpoint: StoreCheckpoint,
                 queues: Callable[[], Iterable], interval_ms: int) -> None:
        self.root = root
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.queues = queues
        self.interval_s = interval_ms / 1000
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._flushed_generation = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rmq-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def take_error(self) -> BaseException | None:
        """The background failure since the last call, if any (cleared)."""
        error, self.error = self.error, None
        return error

    def flush(self) -> None:
        """Flush what the checkpoint confirms, unless nothing was appended since last time."""
        with self._lock:
            cp = self.checkpoint
            confirm = cp.get("confirm_phy_offset")
            generation = cp.get("write_generation")
            if generation == self._flushed_generation:
                return
            self.commit_log.flush(min(cp.get("flushed_phy_offset"), confirm))
            for q in list(self.queues()):
                q.flush()
            cp.set("logics_msg_timestamp", cp.get("physic_msg_timestamp"))
            if confirm > cp.get("flushed_phy_offset"):
                cp.set("flushed_phy_offset", confirm)
            cp.flush()
            self._flushed_generation = generation

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - reported to the next caller, retried
                log.error("flush of store %s failed (the next write raises it): %s",
                          self.root, exc)
                self.error = exc
