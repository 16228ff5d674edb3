"""What one client can make the Flight server hold, bounded: streams at once, log lines.

* :class:`StreamLimits`: table and read streams (``DoGet``, ``DoPut``, ``DoExchange``) in
  progress, per client host and in all; a call past either bound is refused at once with
  :class:`~store.remote.wire.Overloaded` (the client may retry later) instead of queueing
  behind the others.  Actions are short and not counted.
* :class:`RateLimitedLog`: refused calls are logged, at most ``per_second`` lines a second;
  the lines dropped meanwhile are counted in the next line logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .wire import Overloaded

#: Streams in progress one client host may have (a Spark executor host runs one read per
#: core at once).
MAX_STREAMS_PER_CLIENT = 64
#: Streams in progress in all.
MAX_STREAMS = 256
#: Refused-call log lines per second.
REFUSED_LOG_PER_SECOND = 10


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``)."""
    text = peer.decode() if isinstance(peer, bytes) else str(peer)
    host = text.rsplit(":", 1)[0] if text.count(":") >= 2 else text
    return host


class StreamLimits:
    """Counts streams in progress (see the module docstring)."""

    def __init__(self, per_client: int = MAX_STREAMS_PER_CLIENT, in_all: int = MAX_STREAMS
                 ) -> None:
        self.per_client = int(per_client)
        self.in_all = int(in_all)
        self._lock = threading.Lock()
        self._by_host: dict[str, int] = {}
        self._total = 0

    def admit(self, peer: str, what: str) -> Callable[[], None]:
        """Count one stream of ``peer``; return the function that ends it (call it once).
        :class:`~store.remote.wire.Overloaded` when a bound is reached."""
        host = peer_host(peer)
        with self._lock:
            mine = self._by_host.get(host, 0)
            if mine >= self.per_client or self._total >= self.in_all:
                raise Overloaded(
                    f"{what}: {mine} streams of this client and {self._total} in all are in "
                    f"progress; allowed: at most {self.per_client} per client and "
                    f"{self.in_all} in all (retry when one ends)")
            self._by_host[host] = mine + 1
            self._total += 1
        done = []

        def release() -> None:
            with self._lock:
                if done:
                    return
                done.append(True)
                self._total -= 1
                left = self._by_host[host] - 1
                if left:
                    self._by_host[host] = left
                else:
                    del self._by_host[host]

        return release

    @property
    def in_progress(self) -> int:
        return self._total


class RateLimitedLog:
    """At most ``per_second`` warnings a second to ``logger``; the rest counted."""

    def __init__(self, logger: logging.Logger, per_second: int = REFUSED_LOG_PER_SECOND, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._per_second = int(per_second)
        self._clock = clock
        self._lock = threading.Lock()
        self._window = -1
        self._in_window = 0
        self.dropped = 0

    def warning(self, message: str, *args) -> bool:
        """Log ``message % args`` unless this second's lines are spent; whether it was."""
        with self._lock:
            window = int(self._clock())
            if window != self._window:
                self._window, self._in_window = window, 0
            if self._in_window >= self._per_second:
                self.dropped += 1
                return False
            self._in_window += 1
            dropped, self.dropped = self.dropped, 0
        if dropped:
            message += " (and %d refused call(s) not logged)"
            args = (*args, dropped)
        self._log.warning(message, *args)
        return True
