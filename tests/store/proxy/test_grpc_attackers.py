"""The ``grpc.aio`` endpoint against clients that hold, cut off or flood what they start:
half-open calls (headers sent, request never), requests trickled or cut mid-message,
connections that open and send nothing or dribble their handshake, telemetry streams dropped
at random moments, responses a client never reads, an oversized request; one process and
``--grpc-processes 2``.  Whatever they do, the others' short calls answer within 1 s and the
server stays up."""

from __future__ import annotations

import asyncio
import os
import random
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Self

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from store import StoreConfig
from tests.store.proxy.signing import (
    hold_idle_telemetry,
    hold_long_poll,
    message,
    metadata,
    producer_session,
    serving,
    stored,
    stub,
    write_acl,
)

pytestmark = pytest.mark.xdist_group("grpc")

TOPIC = "attacked"
SEND = "/apache.rocketmq.v2.MessagingService/SendMessage"


@pytest.fixture
def many_files():
    """The soft open-files limit raised to the hard one (thousands of sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _short_calls_take(endpoint: str, n: int = 10, timeout: float = 5.0) -> list[float]:
    """Seconds of ``n`` short calls (a route and a send each) on a connection of their own,
    once it is open (its first route, untimed, may take up to 10 s)."""
    s, channel = stub(endpoint)
    took = []
    try:
        s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), timeout=10)
        for i in range(n):
            start = time.monotonic()
            r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)),
                             timeout=timeout)
            assert r.status.code == pb.Code.OK, r.status
            r = s.SendMessage(rpc.SendMessageRequest(messages=[message(TOPIC, b"short")]),
                              timeout=timeout)
            assert r.status.code == pb.Code.OK, r.status
            took.append(time.monotonic() - start)
    finally:
        channel.close()
    return took


class _LoopCalls:
    """``count`` calls spread over ``connections`` connections, held by an asyncio loop in
    a thread until the ``with`` block ends; ``codes`` gets the status each ends with.  A
    subclass makes the calls (:meth:`_tasks`)."""

    #: how long the calls get to reach the server before the ``with`` block starts (s)
    settle_s = 0.0

    def __init__(self, endpoint: str, count: int, connections: int) -> None:
        self.endpoint, self.count, self.connections = endpoint, count, connections
        self.codes: list = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),),
                                        daemon=True)
        self._started = threading.Event()

    def _tasks(self, channels) -> list:
        raise NotImplementedError

    async def _main(self) -> None:
        self._stop, self._calls = asyncio.Event(), []
        channels = [grpc.aio.insecure_channel(self.endpoint, options=[
            ("grpc.use_local_subchannel_pool", 1)]) for _ in range(self.connections)]
        tasks = self._tasks(channels)
        await asyncio.sleep(self.settle_s)
        self._started.set()
        await self._stop.wait()
        for call in self._calls:
            call.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()

    def __enter__(self) -> Self:
        self._thread.start()
        self._started.wait(60)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)


class HalfOpen(_LoopCalls):
    """``count`` calls of ``path`` that send their headers and never their request, spread
    over ``connections`` connections, held by an asyncio loop in a thread; ``codes`` gets
    the status each ends with."""

    settle_s = 0.5

    def __init__(self, endpoint: str, count: int, connections: int, path: str = SEND) -> None:
        super().__init__(endpoint, count, connections)
        self.path = path

    async def _one(self, channel) -> None:
        async def never():
            await self._stop.wait()
            yield b""

        call = channel.stream_unary(self.path, request_serializer=bytes,
                                    response_deserializer=bytes)(never())
        self._calls.append(call)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            self.codes.append(exc.code())

    def _tasks(self, channels) -> list:
        return [asyncio.ensure_future(self._one(channels[i % self.connections]))
                for i in range(self.count)]


def _wait(predicate, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        time.sleep(0.05)
    return predicate()


# --------------------------------------------------------------------------- half-open calls
def test_1500_half_open_calls_leave_short_calls_answering(endpoint_of):
    """The code before bounded calls in all (1,280): as many half-open streams, which cost
    their client nothing, had every other call refused (RESOURCE_EXHAUSTED)."""
    endpoint = endpoint_of()
    _short_calls_take(endpoint.endpoint, n=1)
    with HalfOpen(endpoint.endpoint, 1500, connections=15):
        waits = getattr(endpoint.service, "waits", None)
        if waits is None:  # the code before: no count to wait for
            time.sleep(3)
        else:
            assert _wait(lambda: waits.waiting >= 1000), waits.waiting
        took = _short_calls_take(endpoint.endpoint, timeout=1.0)
    assert max(took) < 1.0, took


@pytest.mark.slow
def test_3000_half_open_calls_leave_two_processes_answering(tmp_path):
    """Spread over both processes (the code before: 1,280 calls at most in each)."""
    with serving(str(tmp_path / "store"), StoreConfig(max_message_size_bytes=1 << 20),
                 grpc_processes=2) as (srv, _):
        endpoint = srv.grpc_endpoint
        _short_calls_take(endpoint, n=1)
        with HalfOpen(endpoint, 3000, connections=30):
            time.sleep(3.0)
            took = [t for _ in range(4) for t in _short_calls_take(endpoint, n=3, timeout=1.0)]
    assert max(took) < 1.0, took


def test_calls_waiting_for_their_request_give_up_in_time_and_beyond_the_bound(endpoint_of):
    """At most ``limit`` calls wait: the ones that waited longest give up first, the rest
    after ``wait_s``; each ends DEADLINE_EXCEEDED and nothing is left waiting."""
    endpoint = endpoint_of()
    waits = endpoint.service.waits
    waits.limit, waits.wait_s = 50, 1.0
    _short_calls_take(endpoint.endpoint, n=1)
    with HalfOpen(endpoint.endpoint, 150, connections=3) as load:
        assert _wait(lambda: waits.given_up >= 100, timeout=10), waits.given_up
        assert waits.waiting <= 50
        assert _wait(lambda: len(load.codes) == 150, timeout=10), len(load.codes)
        assert waits.waiting == 0
    assert set(load.codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}, set(load.codes)


class _Waiting:
    """A call's context whose request arrives when the test says."""

    def __init__(self) -> None:
        self.arrived = asyncio.get_running_loop().create_future()

    def done(self) -> bool:
        return False

    async def read(self):
        return await self.arrived


def test_request_waits_push_out_the_longest_waiting():
    from store.proxy.grpc_limits import RequestWaits

    async def main():
        waits = RequestWaits(limit=2, wait_s=60)
        contexts = [_Waiting() for _ in range(3)]
        tasks = [asyncio.ensure_future(waits.request(c)) for c in contexts]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        contexts[1].arrived.set_result("second")
        contexts[2].arrived.set_result("third")
        return await asyncio.gather(*tasks), waits.given_up, waits.waiting

    results, given_up, waiting = asyncio.run(main())
    assert results == [None, "second", "third"] and given_up == 1 and waiting == 0


def test_request_waits_give_up_after_their_time():
    from store.proxy.grpc_limits import RequestWaits

    async def main():
        waits = RequestWaits(limit=10, wait_s=0.2)
        late, soon = _Waiting(), _Waiting()
        start = asyncio.get_running_loop().time()
        tasks = [asyncio.ensure_future(waits.request(c)) for c in (late, soon)]
        await asyncio.sleep(0.05)
        soon.arrived.set_result("soon")
        results = await asyncio.gather(*tasks)
        return results, asyncio.get_running_loop().time() - start, waits.given_up

    results, took, given_up = asyncio.run(main())
    assert results == [None, "soon"] and given_up == 1
    assert 0.2 <= took < 0.6, took


# --------------------------------------------------------------------------- raw HTTP/2
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK header field, literal without indexing, new name (lengths below 127)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _raw_call(port: int, stream: int = 1) -> bytes:
    """The connection preface, empty settings and the headers of a ``SendMessage``."""
    headers = b"".join(_literal(k, v) for k, v in (
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", SEND.encode()),
        (b":authority", f"127.0.0.1:{port}".encode()), (b"content-type", b"application/grpc"),
        (b"te", b"trailers")))
    return PREFACE + _frame(4, 0, 0) + _frame(1, 4, stream, headers)  # SETTINGS, HEADERS


def _grpc_frame(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def test_a_request_cut_off_mid_message_stores_nothing(endpoint_of):
    endpoint = endpoint_of()
    _short_calls_take(endpoint.endpoint, n=1)
    before = stored(endpoint.service.store.root, TOPIC)
    body = rpc.SendMessageRequest(messages=[message(TOPIC, b"cut" * 1000)]).SerializeToString()
    for cut in (1, 5, len(body) // 2, len(body) + 4):
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as sock:
            sock.sendall(_raw_call(endpoint.port) + _frame(0, 0, 1, _grpc_frame(body)[:cut]))
            time.sleep(0.1)
        # (the socket closed: the stream ends with the request incomplete)
    assert _wait(lambda: endpoint.service.waits.waiting == 0, timeout=10)
    took = _short_calls_take(endpoint.endpoint, n=3, timeout=1.0)
    assert max(took) < 1.0, took
    assert stored(endpoint.service.store.root, TOPIC) == before + 3  # the short sends, no cut one


def test_a_request_trickled_byte_by_byte_is_given_up(endpoint_of):
    """A slow loris inside a stream: the request's bytes one at a time, never whole in the
    time a call may wait for its request."""
    endpoint = endpoint_of()
    endpoint.service.waits.wait_s = 1.0
    _short_calls_take(endpoint.endpoint, n=1)
    before = stored(endpoint.service.store.root, TOPIC)
    body = _grpc_frame(rpc.SendMessageRequest(
        messages=[message(TOPIC, b"slow")]).SerializeToString())
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as sock:
        sock.sendall(_raw_call(endpoint.port))
        sent_all = True
        for i in range(len(body) - 1):  # never the last byte: the request is never whole
            try:
                sock.sendall(_frame(0, 0, 1, body[i:i + 1]))
            except OSError:  # the server reset the stream or closed the connection
                sent_all = False
                break
            time.sleep(0.1)
            if endpoint.service.waits.given_up:
                break
        assert endpoint.service.waits.given_up == 1, (sent_all, endpoint.service.waits.waiting)
    assert stored(endpoint.service.store.root, TOPIC) == before


def _closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` within ``within_s`` (what it sends meanwhile, its
    own settings, is read and dropped)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            return False
        except OSError:  # reset
            return True
    return False


@pytest.mark.slow
def test_idle_connections_and_dribbled_handshakes_leave_short_calls_answering(endpoint_of,
                                                                              many_files):
    """1,500 connections that send nothing, 300 that send the preface and stop, 100 that
    dribble it a byte a second: short calls answer within 1 s, and the connections that
    never finish their handshake are closed by the server within its bound."""
    from store.proxy import grpc_limits

    if many_files < 4000:
        pytest.skip(f"the open-files limit ({many_files}) is too low for 1,900 connections")
    endpoint = endpoint_of()
    _short_calls_take(endpoint.endpoint, n=1)
    socks = []
    try:
        for i in range(1900):
            sock = socket.create_connection(("127.0.0.1", endpoint.port), timeout=10)
            if 1500 <= i < 1800:
                sock.sendall(PREFACE)
            socks.append(sock)
        dribbling = socks[1800:]
        for k in range(3):  # a byte of the preface a second
            for sock in dribbling:
                sock.sendall(PREFACE[k:k + 1])
            took = _short_calls_take(endpoint.endpoint, n=3, timeout=1.0)
            assert max(took) < 1.0, took
            time.sleep(1.0)
        start = time.monotonic()
        closed = sum(1 for sock in socks[:50] if _closed_by_peer(sock, grpc_limits.HANDSHAKE_S + 20))
        assert closed == 50 and time.monotonic() - start < grpc_limits.HANDSHAKE_S + 20
    finally:
        for sock in socks:
            sock.close()


# --------------------------------------------------------------------------- streams
async def _drop_telemetry_streams(endpoint: str, count: int, deadline: float, alive) -> int:
    """Open ``count`` telemetry streams (a producer's settings each) and cancel each at a
    random moment of its first milliseconds; how many were opened."""
    rng = random.Random(7)
    channels = [grpc.aio.insecure_channel(endpoint, options=[
        ("grpc.use_local_subchannel_pool", 1)]) for _ in range(8)]
    stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]

    async def one(i: int) -> None:
        async def commands():
            yield rpc.TelemetryCommand(settings=pb.Settings(
                client_type=pb.ClientType.PRODUCER,
                publishing=pb.Publishing(topics=[pb.Resource(name=TOPIC)])))
            await asyncio.sleep(rng.random() * 0.01)

        call = stubs[i % 8].Telemetry(commands(), metadata=[
            ("x-mq-client-id", f"dropped-{i}"), ("x-mq-language", "PYTHON")])
        await asyncio.sleep(rng.random() * 0.005)
        call.cancel()

    opened = 0
    try:
        while opened < count and time.monotonic() < deadline and alive():
            await asyncio.gather(*(one(opened + i) for i in range(100)),
                                 return_exceptions=True)
            opened += 100
    finally:
        for c in channels:
            await c.close()
    return opened


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_telemetry_streams_dropped_at_random_moments_leave_the_server_up(tmp_path, processes):
    """The code before read a stream's context from a pool thread; a client going away
    freed it under the reader: ``rmq serve`` died of a segmentation fault within seconds."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_cli.cli", "serve", "--store", str(tmp_path / "s"),
         "--create", "--grpc", f"127.0.0.1:{port}", "--grpc-processes", str(processes),
         "--log-level", "ERROR"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < end, "rmq serve never listened"
                time.sleep(0.1)
        opened = asyncio.run(_drop_telemetry_streams(
            f"127.0.0.1:{port}", 1500, time.monotonic() + 20, lambda: proc.poll() is None))
        time.sleep(0.5)
        assert proc.poll() is None, \
            f"died ({proc.returncode}) after {opened} streams: " \
            f"{proc.stderr.read().decode()[-2000:]}"
        took = _short_calls_take(f"127.0.0.1:{port}", n=3)
        assert max(took) < 1.0, took
    finally:
        proc.kill()
        proc.wait()


def test_a_client_that_never_reads_its_responses_holds_no_one_else(endpoint_of):
    """Receives of 1 MiB messages whose client never reads the answers (they wait on the
    connection's flow control): short calls still answer, and once the client goes the
    held calls are let go."""
    endpoint = endpoint_of()
    s, channel = stub(endpoint.endpoint)
    try:
        for _ in range(8):
            r = s.SendMessage(rpc.SendMessageRequest(
                messages=[message(TOPIC, os.urandom(1000 << 10))]), timeout=10)
            assert r.status.code == pb.Code.OK, r.status
    finally:
        channel.close()
    lazy = grpc.insecure_channel(endpoint.endpoint, options=[
        ("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0),
        ("grpc.max_receive_message_length", 8 << 20)])
    lazy_stub = service_pb2_grpc.MessagingServiceStub(lazy)
    calls = [lazy_stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name=f"lazy-{i}"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=TOPIC)), batch_size=8,
        invisible_duration={"seconds": 60}, long_polling_timeout={"seconds": 1}),
        metadata=[("x-mq-client-id", f"lazy-{i}")]) for i in range(8)]  # never read
    try:
        time.sleep(1.0)
        took = _short_calls_take(endpoint.endpoint, n=5, timeout=1.0)
        assert max(took) < 1.0, took
    finally:
        for call in calls:
            call.cancel()
        lazy.close()
    assert _wait(lambda: endpoint.service.held.held == 0, timeout=10), \
        endpoint.service.held.held


def test_an_oversized_request_is_refused_and_the_endpoint_serves_on(endpoint_of):
    endpoint = endpoint_of()  # a store of 1 MiB messages: gRPC's limit is 2 MiB and a little
    before = stored(endpoint.service.store.root, TOPIC)
    s, channel = stub(endpoint.endpoint)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            s.SendMessage(rpc.SendMessageRequest(messages=[message(TOPIC, bytes(3 << 20))]),
                          timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        channel.close()
    took = _short_calls_take(endpoint.endpoint, n=2, timeout=1.0)
    assert max(took) < 1.0, took
    assert stored(endpoint.service.store.root, TOPIC) == before + 2


# --------------------------------------------------------------------------- idle sessions
class IdleStreams(_LoopCalls):
    """``count`` telemetry streams, each of a client id of its own, that never send a
    command (an idle client), spread over ``connections`` connections and held by an
    asyncio loop in a thread; ``codes`` gets the status each ends with."""

    async def _one(self, s, i: int) -> None:
        await hold_idle_telemetry(s, f"idle-{i}", self._stop.wait, self._calls, self.codes)

    def _tasks(self, channels) -> list:
        stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]
        return [asyncio.ensure_future(self._one(stubs[i % self.connections], i))
                for i in range(self.count)]


def _streams_open(service) -> int:
    streams = getattr(service, "streams", None)  # (the code before counted them as held)
    return streams.open if streams is not None else service.held.held


def _long_poll_gets_what_is_sent(s, topic: str, md: list, send_md: list = ()) -> None:
    """A long poll (5 s) of group ``legit`` on ``topic`` with headers ``md`` waits (is
    held) and gets the message sent 0.8 s after it starts (with headers ``send_md``)."""
    def send_later():
        time.sleep(0.8)
        r = s.SendMessage(rpc.SendMessageRequest(messages=[message(topic, b"awaited")]),
                          metadata=list(send_md), timeout=5)
        assert r.status.code == pb.Code.OK, r.status

    sender = threading.Thread(target=send_later)
    start = time.monotonic()
    sender.start()
    answers = list(s.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name="legit"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic)), batch_size=1,
        invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 5}),
        metadata=md, timeout=10))
    polled = time.monotonic() - start
    sender.join()
    bodies = [a.message.body for a in answers if a.HasField("message")]
    assert bodies == [b"awaited"], (polled, [a.status for a in answers])
    assert 0.7 < polled < 5, polled


def test_1100_idle_telemetry_streams_leave_long_polls_sends_and_sessions_working(endpoint_of):
    """The code before held a pool thread per telemetry stream and counted streams with
    long polls (1,024 in all): 1,100 idle clients of distinct ids took every place, so a
    long-polling receive answered at once with nothing and a new client's stream was
    refused.  Now streams wait on the event loop (no thread each), have bounds of their
    own, and the least recently active ones make room."""
    endpoint = endpoint_of()
    s, channel = stub(endpoint.endpoint)
    try:
        for topic in (TOPIC, "polled"):
            r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=10)
            assert r.status.code == pb.Code.OK, r.status
        threads = threading.active_count()
        with IdleStreams(endpoint.endpoint, 1100, connections=4) as idle:
            assert _wait(lambda: _streams_open(endpoint.service) >= 1024, timeout=30), \
                _streams_open(endpoint.service)
            assert _wait(lambda: len(idle.codes) >= 1100 - 1024, timeout=10), len(idle.codes)
            grew = threading.active_count() - threads

            _long_poll_gets_what_is_sent(s, "polled", [("x-mq-client-id", "legit-consumer")])

            took = _short_calls_take(endpoint.endpoint, n=5, timeout=1.0)
            assert max(took) < 1.0, took

            producer_session(s, "legit-producer").close()  # (answered: not refused)
            codes = list(idle.codes)
    finally:
        channel.close()
    assert grew < 64, f"{grew} threads for 1,100 idle streams"
    # each stream beyond the bound closed one of the idlest (RESOURCE_EXHAUSTED), and one
    # more made room for the legitimate session; a few streams of the flood may end
    # CANCELLED on their way in, before the server ever counts them (the transport's)
    exhausted, cancelled = (codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED),
                            codes.count(grpc.StatusCode.CANCELLED))
    assert exhausted + cancelled == len(codes) and cancelled <= 10, codes
    closed = endpoint.service.streams.closed
    assert closed == 1100 - cancelled - 1024 + 1 and exhausted >= closed - 1, (closed, codes)
    assert _wait(lambda: endpoint.service.streams.open == 0, timeout=10)


TELEMETRY = "/apache.rocketmq.v2.MessagingService/Telemetry"


def _raw_telemetry_streams(port: int, source: str, count: int, name: str = "raw"
                           ) -> socket.socket:
    """A connection from ``source`` (a loopback address) opening ``count`` telemetry
    streams of client ids of their own (``name-source-i``) that never send a command."""
    return _raw_calls(port, source, count, TELEMETRY, name)


def _raw_calls(port: int, source: str, count: int, path: str, name: str,
               request: bytes | None = None) -> socket.socket:
    """A connection from ``source`` (a loopback address) opening ``count`` calls of
    ``path``, each of a client id of its own (``name-source-i``), that send ``request`` (a
    serialized message; ``None``: nothing) and then never read their answers."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    frames = [PREFACE, _frame(4, 0, 0)]
    for i in range(count):
        headers = b"".join(_literal(k, v) for k, v in (
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
            (b":authority", f"127.0.0.1:{port}".encode()),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"),
            (b"x-mq-client-id", f"{name}-{source}-{i}".encode())))
        frames.append(_frame(1, 4, 2 * i + 1, headers))  # HEADERS, END_HEADERS
        if request is not None:  # DATA, END_STREAM
            frames.append(_frame(0, 1, 2 * i + 1, _grpc_frame(request)))
    sock.sendall(b"".join(frames))
    return sock


def test_a_flood_of_streams_from_one_address_closes_only_that_address_s(endpoint_of):
    """Idle streams from 127.0.0.2 beyond the bound per address close the idlest of that
    address's, never the (older, idle) streams of clients at other addresses."""
    endpoint = endpoint_of(max_telemetry_streams_per_peer=5, max_telemetry_streams=100)
    streams = endpoint.service.streams
    s, channel = stub(endpoint.endpoint)
    sessions = []
    try:
        for client in ("first", "second"):
            sessions.append(producer_session(s, client))
        flood = _raw_telemetry_streams(endpoint.port, "127.0.0.2", 40)
        try:
            assert _wait(lambda: streams.closed >= 35, timeout=10), streams.closed
            assert streams.of_peer("127.0.0.2") == 5 and streams.of_peer("127.0.0.1") == 2
            assert all(session._reader.is_alive() for session in sessions)
        finally:
            flood.close()
        assert _wait(lambda: streams.open == 2, timeout=10), streams.open
    finally:
        for session in sessions:
            session.close()
        channel.close()


@pytest.mark.slow
def test_streams_through_a_worker_process_count_under_their_client_s_address(tmp_path):
    """With ``--grpc-processes 2`` the kernel hands some connections to the worker, which
    passes their streams on to the primary over loopback: they are counted under the
    client's address (the worker vouches for it), not under the worker's 127.0.0.1."""
    with serving(str(tmp_path / "store"), StoreConfig(max_message_size_bytes=1 << 20),
                 grpc_processes=2) as (srv, _):
        streams = srv._asks.service.streams
        port = int(srv.grpc_endpoint.rpartition(":")[2])
        socks = [_raw_telemetry_streams(port, "127.0.0.2", 5, f"c{k}") for k in range(12)]
        try:
            assert _wait(lambda: streams.of_peer("127.0.0.2") == 60, timeout=30), \
                (streams.of_peer("127.0.0.2"), streams.of_peer("127.0.0.1"))
            assert streams.of_peer("127.0.0.1") == 0
        finally:
            for sock in socks:
                sock.close()


# --------------------------------------------------------------------------- held calls
class LongPolls(_LoopCalls):
    """``count`` long-polling receives (30 s) of ``group`` on ``topic``, signed by
    ``access_key``, each with a client id of its own, held by an asyncio loop in a thread;
    ``codes`` gets the status each answers with."""

    settle_s = 1.0

    def __init__(self, endpoint: str, count: int, access_key: str, topic: str, group: str
                 ) -> None:
        super().__init__(endpoint, count, connections=2)
        self.access_key, self.topic, self.group = access_key, topic, group

    async def _one(self, s, i: int) -> None:
        await hold_long_poll(s, self.group, self.topic,
                             metadata(self.access_key, f"{self.access_key}-{i}"), self._calls,
                             self.codes)

    def _tasks(self, channels) -> list:
        stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]
        return [asyncio.ensure_future(self._one(stubs[i % self.connections], i))
                for i in range(self.count)]


def test_one_account_inventing_client_ids_leaves_another_account_s_long_poll_held(
        endpoint_of, tmp_path):
    """Long polls were bounded per client id and in all only: an account inventing client
    ids filled the pool, and every other client's long poll then answered at once with
    nothing (a busy-poll storm).  Now the pool is shared out per account: another
    account's long poll takes the place of the flooding account's oldest, waits, and gets
    its message when one is sent; the flood's own newcomers are refused (answered at once)."""
    endpoint = endpoint_of(acl=write_acl(tmp_path / "acl.json"), max_held_calls=40)
    s, channel = stub(endpoint.endpoint)
    try:
        r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="shared")),
                         metadata=metadata("orders-svc"), timeout=10)
        assert r.status.code == pb.Code.OK, r.status
        with LongPolls(endpoint.endpoint, 60, "thief", "shared", "g-thief") as flood:
            assert _wait(lambda: endpoint.service.held.held == 40, timeout=20), \
                endpoint.service.held.held
            assert _wait(lambda: len(flood.codes) >= 20, timeout=10), flood.codes

            _long_poll_gets_what_is_sent(s, "shared", metadata("orders-svc", "legit-consumer"),
                                         metadata("orders-svc"))
            assert endpoint.service.held.pushed_out == 1
            # (the message went to the flood's group too: one of its polls ended with it)
            assert endpoint.service.held.of("account", "thief") == 38
            codes = list(flood.codes)
    finally:
        channel.close()
    # the flood's calls beyond the pool, and the one pushed out, answered at once
    assert codes.count("MESSAGE_NOT_FOUND") >= 21, codes


RECEIVE = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"


def _long_polls_from(port: int, source: str, count: int, name: str) -> socket.socket:
    """``count`` long-polling receives (30 s, group ``g``, topic ``polled``) from
    ``source``, each of a client id of its own, on one raw connection."""
    return _raw_calls(port, source, count, RECEIVE, name, rpc.ReceiveMessageRequest(
        group=pb.Resource(name="g"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="polled")), batch_size=1,
        invisible_duration={"seconds": 30},
        long_polling_timeout={"seconds": 30}).SerializeToString())


def test_one_address_inventing_client_ids_leaves_another_address_s_long_poll_held(
        endpoint_of):
    """Without accounts, the pool is shared out per address: long polls of invented
    client ids from 127.0.0.2 hold at most its bound, and when they fill the pool a long
    poll from 127.0.0.1 takes the place of the oldest and gets its message when one is
    sent.  The code before counted client ids only."""
    endpoint = endpoint_of(max_held_calls=30, max_held_calls_per_peer=20)
    held = endpoint.service.held
    s, channel = stub(endpoint.endpoint)
    try:
        r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="polled")), timeout=10)
        assert r.status.code == pb.Code.OK, r.status
        floods = [_long_polls_from(endpoint.port, "127.0.0.2", 25, "a")]
        assert _wait(lambda: held.of("peer", "127.0.0.2") == 20, timeout=20), held.held
        time.sleep(0.5)  # (its 5 newcomers beyond its bound: refused, not held)
        assert held.of("peer", "127.0.0.2") == 20 and held.held == 20
        # a second flood fills the pool, then takes 127.0.0.2's places until they are even
        floods.append(_long_polls_from(endpoint.port, "127.0.0.3", 25, "b"))
        assert _wait(lambda: held.of("peer", "127.0.0.3") == 15, timeout=20), held.held
        time.sleep(0.5)
        assert (held.of("peer", "127.0.0.2"), held.of("peer", "127.0.0.3")) == (15, 15)
        assert held.held == 30 and held.pushed_out == 5
        # a newcomer from another address takes the place of a flood's oldest
        _long_poll_gets_what_is_sent(s, "polled", [("x-mq-client-id", "legit-consumer")])
        assert held.pushed_out == 6
        for sock in floods:
            sock.close()
    finally:
        channel.close()


@pytest.mark.slow
def test_long_polls_through_a_worker_process_count_under_their_client_s_address(tmp_path):
    """With ``--grpc-processes 2`` a worker passes its receives on to the primary, which
    holds them: they count under the client's address (the worker vouches for it with a
    dated header), not under the worker's 127.0.0.1."""
    with serving(str(tmp_path / "store"), StoreConfig(max_message_size_bytes=1 << 20),
                 grpc_processes=2) as (srv, s):
        r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="polled")), timeout=10)
        assert r.status.code == pb.Code.OK, r.status
        held = srv._asks.service.held
        port = int(srv.grpc_endpoint.rpartition(":")[2])
        socks = [_long_polls_from(port, "127.0.0.2", 4, f"c{k}") for k in range(12)]
        try:
            assert _wait(lambda: held.of("peer", "127.0.0.2") == 48, timeout=30), \
                (held.of("peer", "127.0.0.2"), held.of("peer", "127.0.0.1"))
            assert held.of("peer", "127.0.0.1") == 0
        finally:
            for sock in socks:
                sock.close()
