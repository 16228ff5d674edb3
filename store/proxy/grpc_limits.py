"""What one client can make the gRPC endpoint hold: held calls, telemetry streams, and log
lines.

The endpoint answers short calls on one event loop (:mod:`store.proxy.aio_calls`); the calls
that wait run in a pool of threads, and such a call holds its thread until it ends.
Long-polling receives (up to 30 s each) are **held calls**; every other call is short.  So
that held calls never take the threads that answer short ones, the pool has room for
:data:`MAX_HELD_CALLS` held calls plus :data:`SHORT_CALL_WORKERS` threads that only short
calls reach, and :class:`HeldCalls` counts held calls in all, per client id, per peer
address and per account: a receive beyond its client's, address's or account's bound does
not long-poll, it answers at once with what is there (``MESSAGE_NOT_FOUND`` when nothing),
as a receive with a zero polling time does; one beyond the bound in all takes the place of
the oldest held call of the account (else the address) that holds the most, when that one
holds two more than the newcomer's (so one account or address inventing client ids cannot
take the pool from the others).

**Telemetry streams** (one per client, for its life, idle nearly all of it) hold no thread:
a stream waits for its next command on the event loop, so one costs memory only (about
20 KiB: 1,000 idle streams measured +19 MiB, and no thread).  They have bounds of their own (:class:`TelemetryStreams`), apart
from the held calls', so that idle clients never take the room of the calls that work:
:data:`MAX_TELEMETRY_STREAMS_PER_PEER` from one peer address and
:data:`MAX_TELEMETRY_STREAMS` in all.  A stream beyond a bound is not refused: the **least
recently active** stream (of that address, else of all) is closed with the gRPC status
``RESOURCE_EXHAUSTED`` (the official clients open it again after a pause).  A stream is
active when its client sends a command on it or a heartbeat with its client id (the
official clients heartbeat every 10 s): idle streams go first, a working client's last.
The peer address of a stream or a receive a worker process passes on (``--grpc-processes``)
is the client's, vouched for by the worker with the store's secret, for that call and client
id and for :data:`VOUCH_VALID_MS` (:func:`vouched_peer`); a heartbeat a worker answers
itself does not count as activity (its stream's commands do).  Every bound per address
counts an IP address: clients behind one NAT address share it (``rmq serve`` raises it:
:mod:`store.operations.face_limits`).

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

#: Held calls (long polls) at once: in all, per client id, per peer address, per account.
MAX_HELD_CALLS = 1024
MAX_HELD_CALLS_PER_CLIENT = 64
MAX_HELD_CALLS_PER_PEER = 512
MAX_HELD_CALLS_PER_ACCOUNT = 512
#: Telemetry streams open at once, in all and per peer address.
MAX_TELEMETRY_STREAMS = 8192
MAX_TELEMETRY_STREAMS_PER_PEER = 1024
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


def peer_host(peer: str) -> str:
    """The address of a gRPC peer without its port (``ipv4:10.1.2.3:5000`` is ``10.1.2.3``,
    ``ipv6:[::1]:5000`` is ``::1``); a peer of another kind, whole."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return rest.rpartition(":")[0].strip("[]")
    return peer


#: The header with which a worker process vouches for the peer address of a call it passes
#: on: ``ADDRESS MS TAG``, the tag made with the store's secret over the call's method, the
#: address, the client id and ``MS`` (when it was made, epoch milliseconds).
PEER_HEADER = "x-rmq-peer"
#: How long a vouching header is taken, either side of its time (the worker and the primary
#: share a host, and so a clock): a header seen on loopback and replayed later is refused.
VOUCH_VALID_MS = 30_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def vouch(method: str, peer: str, client_id: str, signer, now_ms: int | None = None
          ) -> tuple[str, str]:
    """The header vouching that the ``method`` call (``"Telemetry"``, ``"ReceiveMessage"``)
    of client ``client_id`` passed on comes from ``peer`` (an address), made now (or at
    ``now_ms``) and signed by ``signer`` (a :class:`~store.proxy.handles.Signer` of the
    store's secret)."""
    at = str(_wall_ms() if now_ms is None else now_ms)
    return PEER_HEADER, f"{peer} {at} {signer.tag('peer', method, peer, client_id, at)}"


def vouched_peer(method: str, metadata: dict, signer, now_ms: int | None = None
                 ) -> str | None:
    """The peer address :func:`vouch` put in ``metadata``, the headers of a ``method``
    call, if ``signer`` checks it for this method and the call's client id, and it was made
    within :data:`VOUCH_VALID_MS` of now (or of ``now_ms``); else ``None`` (a client's own
    header is never taken at its word, nor one replayed)."""
    peer, _, rest = metadata.get(PEER_HEADER, "").partition(" ")
    at, _, tag = rest.partition(" ")
    if not (peer and at.isdigit() and len(at) <= 16):
        return None
    now = _wall_ms() if now_ms is None else now_ms
    if abs(now - int(at)) > VOUCH_VALID_MS:
        return None
    client_id = metadata.get("x-mq-client-id", "")
    return peer if signer.valid(tag, "peer", method, peer, client_id, at) else None


class TelemetryStreams:
    """Open telemetry streams in all and per peer address, least recently active first (see
    the module docstring); thread-safe.  A stream is any hashable object (a session)."""

    def __init__(self, total: int = MAX_TELEMETRY_STREAMS,
                 per_peer: int = MAX_TELEMETRY_STREAMS_PER_PEER) -> None:
        if total < 1 or per_peer < 1:
            raise ValueError(f"telemetry stream bounds {total}, {per_peer}; allowed: 1 or more")
        self.total = total
        self.per_peer = per_peer
        self._lock = threading.Lock()
        self._all: OrderedDict[object, str] = OrderedDict()  # stream: its peer; idlest first
        self._by_peer: dict[str, OrderedDict[object, None]] = {}
        #: streams closed to make room (what a test reads)
        self.closed = 0

    @property
    def open(self) -> int:
        return len(self._all)

    def of_peer(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def add(self, stream, peer: str) -> list[tuple[object, str]]:
        """Count ``stream``, from ``peer``; the streams to close to make room for it, each
        with why (no longer counted): the least recently active of ``peer``'s when it has
        :attr:`per_peer`, and of all when there are :attr:`total`."""
        closing = []
        with self._lock:
            mine = self._by_peer.get(peer)
            if mine is not None and len(mine) >= self.per_peer:
                closing.append((self._drop(next(iter(mine))),
                                f"{self.per_peer} streams are open from {peer}"))
            if len(self._all) >= self.total:
                closing.append((self._drop(next(iter(self._all))),
                                f"{self.total} streams are open in all"))
            self._all[stream] = peer
            self._by_peer.setdefault(peer, OrderedDict())[stream] = None
            self.closed += len(closing)
        return closing

    def touch(self, stream) -> None:
        """``stream``'s client was heard from: it is now the most recently active."""
        with self._lock:
            peer = self._all.get(stream)
            if peer is not None:
                self._all.move_to_end(stream)
                self._by_peer[peer].move_to_end(stream)

    def remove(self, stream) -> None:
        """``stream`` ended (nothing if it is no longer counted)."""
        with self._lock:
            if stream in self._all:
                self._drop(stream)

    def _drop(self, stream):
        peer = self._all.pop(stream)
        mine = self._by_peer[peer]
        del mine[stream]
        if not mine:
            del self._by_peer[peer]
        return stream


class HeldCall:
    """One held call counted by :class:`HeldCalls`: whose it is, and whether a newcomer
    pushed it out (it then answers with what it has, at once)."""

    __slots__ = ("account", "client", "peer", "pushed_one_out", "pushed_out")

    def __init__(self, client: str, account: str, peer: str | None) -> None:
        self.client = client
        self.account = account
        self.peer = peer
        self.pushed_out = False
        #: this call took the place of another (whose waiter is to be woken)
        self.pushed_one_out = False


class HeldCalls:
    """Counts held calls in all and per client id, per account and per peer address (see
    the module docstring); thread-safe.

    A call beyond its client's, its account's or its address's bound is refused (answered
    at once): those bounds are its own holder's, and refusing keeps that holder's earlier
    calls held (pushing them out would only make all of them poll again, each pushing out
    the next).  A call beyond the bound in all takes the place of the oldest call of the
    holder with the most (the account, else the address), when that holder has at least two
    more than the newcomer's: so the pool is shared out fairly, a holder with few calls is
    always held, and one that fills the pool gives its calls up to the others as they come.
    """

    def __init__(self, total: int = MAX_HELD_CALLS,
                 per_client: int = MAX_HELD_CALLS_PER_CLIENT,
                 per_peer: int = MAX_HELD_CALLS_PER_PEER,
                 per_account: int = MAX_HELD_CALLS_PER_ACCOUNT) -> None:
        if min(total, per_client, per_peer, per_account) < 1:
            raise ValueError(f"held call bounds {total}, {per_client}, {per_peer}, "
                             f"{per_account}; allowed: 1 or more")
        self.total = total
        self.per_client = per_client
        self.per_peer = per_peer
        self.per_account = per_account
        self._lock = threading.Lock()
        self._held: OrderedDict[HeldCall, None] = OrderedDict()  # oldest first
        self._by_client: dict[str, int] = {}
        self._by: dict[str, dict[str, OrderedDict[HeldCall, None]]] = {
            "account": {}, "peer": {}}
        #: calls pushed out to make room (what a test reads)
        self.pushed_out = 0

    @property
    def held(self) -> int:
        return len(self._held)

    def of(self, kind: str, holder: str) -> int:
        """Held calls of ``holder``, an account (``kind`` ``"account"``) or a peer address
        (``"peer"``)."""
        return len(self._by[kind].get(holder, ()))

    def acquire(self, client: str, account: str = "", peer: str | None = None
                ) -> HeldCall | None:
        """Count one more held call of ``client`` (a client id), ``account`` (an access
        key; ``""``: no account, not counted) from ``peer`` (an address; ``None``: not
        counted); ``None`` (nothing counted) when it is refused.  When the call took the
        place of another, that one's :attr:`HeldCall.pushed_out` is set and this one's
        :attr:`HeldCall.pushed_one_out`."""
        call = HeldCall(client, account, peer)
        with self._lock:
            if (self._by_client.get(client, 0) >= self.per_client
                    or (account and self.of("account", account) >= self.per_account)
                    or (peer is not None and self.of("peer", peer) >= self.per_peer)):
                return None
            if len(self._held) >= self.total:
                oldest = self._fairest_to_push_out(call)
                if oldest is None:
                    return None
                self._drop(oldest)
                oldest.pushed_out = call.pushed_one_out = True
                self.pushed_out += 1
            self._held[call] = None
            self._by_client[client] = self._by_client.get(client, 0) + 1
            for kind, holder in (("account", account), ("peer", peer)):
                if holder:
                    self._by[kind].setdefault(holder, OrderedDict())[call] = None
        return call

    def _fairest_to_push_out(self, call: HeldCall) -> HeldCall | None:
        """The oldest call of the holder with the most held calls, if it has two more than
        ``call``'s at least; else ``None``.  Holders are accounts when ``call`` has one
        (then an account that spreads its calls over addresses gains nothing), else peer
        addresses."""
        kind, mine = ("account", call.account) if call.account else ("peer", call.peer)
        holders = self._by[kind]
        if mine is None or not holders:
            return None
        biggest = max(holders.values(), key=len)
        if len(biggest) >= len(holders.get(mine, ())) + 2:
            return next(iter(biggest))
        return None

    def release(self, call: HeldCall) -> None:
        """``call`` ended (nothing if it was pushed out)."""
        with self._lock:
            if call in self._held:
                self._drop(call)

    def _drop(self, call: HeldCall) -> None:
        del self._held[call]
        left = self._by_client[call.client] - 1
        if left > 0:
            self._by_client[call.client] = left
        else:
            del self._by_client[call.client]
        for kind, holder in (("account", call.account), ("peer", call.peer)):
            if holder:
                mine = self._by[kind][holder]
                del mine[call]
                if not mine:
                    del self._by[kind][holder]


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
