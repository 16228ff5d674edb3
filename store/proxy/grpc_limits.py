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

**Calls whose request has not arrived.**  A call is an HTTP/2 stream: its headers open it,
its request message may come later, or never (a half-open stream costs its client nothing).
So no bound counts calls in all (``grpc.aio``'s ``maximum_concurrent_rpcs`` did: about 1,300
half-open streams from one client had every other call refused).  Instead
(:class:`RequestWaits`) a call waits for its request at most :data:`REQUEST_WAIT_S`, and at
most :data:`MAX_WAITING_REQUESTS` calls wait at once in all: one more makes the call that
waited longest give up (``DEADLINE_EXCEEDED``), which is never a client sending whole
requests (they arrive within milliseconds).  The transport bounds the rest
(:func:`transport_options`): streams per connection, connections, and how long a connection
may stay without a call or without finishing its handshake.

Refused calls are logged, at most :data:`REFUSALS_LOGGED_PER_S` lines a second
(:class:`LogBudget`); the lines left out are counted in the next one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict

#: Held calls (telemetry streams and long polls) at once, in all and per client.
MAX_HELD_CALLS = 1024
MAX_HELD_CALLS_PER_CLIENT = 64
#: Threads beyond the held calls': what answers short calls however many calls are held.
SHORT_CALL_WORKERS = 64
#: Lines a second logged about refused calls.
REFUSALS_LOGGED_PER_S = 20
#: How long a call may wait for its request message, and how many calls may wait at once.
REQUEST_WAIT_S = 30.0
MAX_WAITING_REQUESTS = 4096
#: HTTP/2 streams (calls in progress) one connection may have open (a client opening more
#: at once may see the extra ones refused, UNAVAILABLE).
MAX_STREAMS_PER_CONNECTION = 1024
#: Connections at once (beyond: closed as they come), and how long one may go without a call
#: in progress or without finishing its TCP/TLS and HTTP/2 handshake.
MAX_CONNECTIONS = 4096
IDLE_CONNECTION_S = 300
HANDSHAKE_S = 10


def transport_options() -> list[tuple[str, int]]:
    """The gRPC server options that bound connections and streams (see the module
    docstring)."""
    return [("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
            ("grpc.max_connection_idle_ms", IDLE_CONNECTION_S * 1000),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_S * 1000)]


class RequestWaits:
    """Calls waiting for their request message (see the module docstring); used from the
    event loop only.  One timer sweeps out the calls that waited too long (every
    ``wait_s / 4``, at most a second), rather than a timer per call."""

    def __init__(self, limit: int = MAX_WAITING_REQUESTS, wait_s: float = REQUEST_WAIT_S
                 ) -> None:
        if limit < 1 or wait_s <= 0:
            raise ValueError(f"request waits {limit}, {wait_s} s; allowed: 1 or more calls, "
                             "a time above 0")
        self.limit = limit
        self.wait_s = wait_s
        self._waiting: OrderedDict[asyncio.Task, float] = OrderedDict()  # oldest first
        self._sweep_timer: asyncio.TimerHandle | None = None
        #: calls that gave up waiting (what a test reads)
        self.given_up = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def request(self, context):
        """What ``context.read()`` gives (the request message, or ``grpc.aio.EOF`` when the
        stream ended first); ``None`` when nothing came in time (the call waited too long,
        or was pushed out by newer ones)."""
        task = asyncio.current_task()
        loop = task.get_loop()
        self._waiting[task] = loop.time()
        if len(self._waiting) > self.limit:
            oldest, _ = self._waiting.popitem(last=False)
            oldest.cancel()
        if self._sweep_timer is None:
            self._sweep_timer = loop.call_later(min(1.0, self.wait_s / 4), self._sweep, loop)
        try:
            request = await context.read()
        except asyncio.CancelledError:
            if task.cancelling() > 1 or context.done():  # (not ours: the call ended)
                raise
            task.uncancel()
            self.given_up += 1
            return None
        finally:
            self._waiting.pop(task, None)
        return request

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep_timer = None
        since = loop.time() - self.wait_s
        while self._waiting:
            task, started = next(iter(self._waiting.items()))
            if started > since:
                break
            self._waiting.popitem(last=False)
            task.cancel()
        if self._waiting:
            self._sweep_timer = loop.call_later(min(1.0, self.wait_s / 4), self._sweep, loop)


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
