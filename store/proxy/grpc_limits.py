"""What one client can make the gRPC endpoint hold: held calls, and log lines.

The endpoint answers short calls on one event loop (:mod:`store.proxy.aio_calls`); the calls
that wait run in a pool of threads, and such a call holds its thread until it ends.
Telemetry streams (one per client, for its life) and long-polling receives (up to 30 s each)
are **held calls**; every other call is short.  So that held calls never take the threads
that answer short ones, the pool has room for :data:`MAX_HELD_CALLS` held calls plus
:data:`SHORT_CALL_WORKERS` threads that only short calls reach, and :class:`HeldCalls`
counts held calls in all and per client:

* a Telemetry stream beyond a bound is refused with the gRPC status ``RESOURCE_EXHAUSTED``
  (the official clients open it again after a pause);
* a receive beyond a bound does not long-poll: it answers at once with what is there
  (``MESSAGE_NOT_FOUND`` when nothing), as a receive with a zero polling time does.

Refused calls are logged, at most :data:`REFUSALS_LOGGED_PER_S` lines a second
(:class:`LogBudget`); the lines left out are counted in the next one.
"""

from __future__ import annotations

import logging
import threading
import time

#: Held calls (telemetry streams and long polls) at once, in all and per client.
MAX_HELD_CALLS = 1024
MAX_HELD_CALLS_PER_CLIENT = 64
#: Threads beyond the held calls': what answers short calls however many calls are held.
SHORT_CALL_WORKERS = 64
#: Lines a second logged about refused calls.
REFUSALS_LOGGED_PER_S = 20


class HeldCalls:
    """Counts held calls in all and per client (the ``x-mq-client-id``, or the peer);
    thread-safe."""

    def __init__(self, total: int = MAX_HELD_CALLS,
                 per_client: int = MAX_HELD_CALLS_PER_CLIENT) -> None:
        if total < 1 or per_client < 1:
            raise ValueError(f"held call bounds {total}, {per_client}; allowed: 1 or more")
        self.total = total
        self.per_client = per_client
        self._lock = threading.Lock()
        self._held = 0
        self._by_client: dict[str, int] = {}

    @property
    def held(self) -> int:
        return self._held

    def acquire(self, client: str) -> bool:
        """Count one more held call of ``client``; ``False`` (nothing counted) beyond a
        bound."""
        with self._lock:
            mine = self._by_client.get(client, 0)
            if self._held >= self.total or mine >= self.per_client:
                return False
            self._held += 1
            self._by_client[client] = mine + 1
            return True

    def release(self, client: str) -> None:
        with self._lock:
            self._held -= 1
            left = self._by_client.get(client, 1) - 1
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)


class LogBudget:
    """Logs at most ``per_second`` lines a second to ``logger`` (a token bucket); the lines
    left out are counted in the next line logged."""

    def __init__(self, logger: logging.Logger, per_second: int = REFUSALS_LOGGED_PER_S,
                 clock=time.monotonic) -> None:
        self.logger = logger
        self.per_second = per_second
        self.clock = clock
        self._lock = threading.Lock()
        self._tokens = float(per_second)
        self._at = clock()
        self._skipped = 0

    def warning(self, fmt: str, *args) -> bool:
        """Log ``fmt % args`` as a warning if the budget allows; whether it was logged."""
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.per_second),
                               self._tokens + (now - self._at) * self.per_second)
            self._at = now
            if self._tokens < 1:
                self._skipped += 1
                return False
            self._tokens -= 1
            skipped, self._skipped = self._skipped, 0
        if skipped:
            self.logger.warning(fmt + " (%d similar lines left out)", *args, skipped)
        else:
            self.logger.warning(fmt, *args)
        return True
