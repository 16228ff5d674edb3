"""What a client can make ``rmq serve --grpc`` hold is bounded: idle telemetry streams and
long polls never take the threads that answer short calls, a GZIP bomb is refused without
being inflated, and refused calls are logged at a bounded rate."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import zlib

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

import grpc  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2 as pb  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as rpc  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc  # noqa: E402

from store.proxy import GrpcEndpoint  # noqa: E402
from store.proxy.grpc_limits import HeldCalls, LogBudget, TelemetryStreams  # noqa: E402
from tests.store.proxy.signing import (  # noqa: E402
    Stream,
    hold_idle_telemetry,
    hold_long_poll,
    message,
    producer_session,
    stub,
)

pytestmark = pytest.mark.xdist_group("grpc")

TOPIC = "idle"


class HeldLoad:
    """``streams`` idle telemetry streams and ``polls`` long-polling receives, each of its
    own client id, held open by an asyncio loop in a thread."""

    def __init__(self, endpoint: str, streams: int, polls: int) -> None:
        self.endpoint, self.streams, self.polls = endpoint, streams, polls
        self.codes: list = []
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self.loop.run_until_complete,
                                        args=(self._main(),), daemon=True)

    async def _stream(self, s, i: int) -> None:  # never sends: an idle client
        await hold_idle_telemetry(s, f"idle-{i}", asyncio.Event().wait, self._calls,
                                  self.codes)

    async def _poll(self, s, i: int) -> None:
        await hold_long_poll(s, "g", TOPIC, [("x-mq-client-id", f"poll-{i}")], self._calls,
                             self.codes)

    async def _main(self) -> None:
        self._calls: list = []
        self._stop = asyncio.Event()
        async with grpc.aio.insecure_channel(self.endpoint) as channel:
            s = service_pb2_grpc.MessagingServiceStub(channel)
            tasks = [asyncio.ensure_future(self._stream(s, i)) for i in range(self.streams)]
            tasks += [asyncio.ensure_future(self._poll(s, i)) for i in range(self.polls)]
            await asyncio.sleep(0)
            self._started.set()
            await self._stop.wait()
            for call in self._calls:
                call.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> HeldLoad:
        self._thread.start()
        self._started.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)


def _short_calls_answer_within(endpoint: str, seconds: float, n: int = 10) -> list[float]:
    s, channel = stub(endpoint)
    took = []
    try:
        for i in range(n):
            start = time.monotonic()
            r = s.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)),
                             timeout=seconds)
            assert r.status.code == pb.Code.OK
            r = s.SendMessage(rpc.SendMessageRequest(messages=[message(f"short-{i % 3}")]),
                              timeout=seconds)
            assert r.status.code == pb.Code.OK
            took.append(time.monotonic() - start)
    finally:
        channel.close()
    return took


def _held(endpoint: GrpcEndpoint) -> int:
    """Long polls held and telemetry streams open (the code before counted both as held)."""
    streams = getattr(endpoint.service, "streams", None)
    return endpoint.service.held.held + (streams.open if streams is not None else 0)


def _wait_held(endpoint: GrpcEndpoint, count: int, timeout: float = 60) -> None:
    if not hasattr(endpoint.service, "held"):  # the code before: no count to wait for
        time.sleep(5)
        return
    end = time.monotonic() + timeout
    while _held(endpoint) < count and time.monotonic() < end:
        time.sleep(0.1)
    assert _held(endpoint) >= count, (endpoint.service.held.held, _held(endpoint))


@pytest.mark.slow
def test_400_idle_streams_and_300_long_polls_leave_short_calls_answering(endpoint_of):
    """The default bounds hold all 700 (the code before served everything from 256 threads:
    short calls waited for a held call to end)."""
    endpoint = endpoint_of()
    _short_calls_answer_within(endpoint.endpoint, 10, n=1)  # the topic exists
    with HeldLoad(endpoint.endpoint, streams=400, polls=300):
        _wait_held(endpoint, 400 + 300)
        took = _short_calls_answer_within(endpoint.endpoint, 1.0)
    assert max(took) < 1.0, took


def test_held_calls_and_streams_beyond_their_bounds_are_answered_or_closed(endpoint_of):
    """A small configured pool (40 held calls, 4 short-call threads) and 50 streams under
    100 streams and 60 long polls: the receives beyond answer at once, the streams beyond
    close the least recently active ones (RESOURCE_EXHAUSTED), short calls answer within 1 s
    throughout."""
    endpoint = endpoint_of(max_held_calls=40, short_call_workers=4, max_telemetry_streams=50)
    _short_calls_answer_within(endpoint.endpoint, 10, n=1)
    with HeldLoad(endpoint.endpoint, streams=100, polls=60) as load:
        _wait_held(endpoint, 40 + 50)
        end = time.monotonic() + 30
        while len(load.codes) < 50 + 20 and time.monotonic() < end:
            time.sleep(0.1)
        took = _short_calls_answer_within(endpoint.endpoint, 1.0)
        assert endpoint.service.held.held == 40
        assert endpoint.service.streams.open == 50
        codes = list(load.codes)
    assert max(took) < 1.0, took
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 50, codes
    assert codes.count("MESSAGE_NOT_FOUND") == 20, codes
    assert endpoint.service.streams.closed == 50


def test_held_calls_per_client_are_bounded():
    held = HeldCalls(total=10, per_client=2)
    a1, a2 = held.acquire("a"), held.acquire("a")
    assert a1 and a2
    assert held.acquire("a") is None
    assert held.acquire("b")
    held.release(a1)
    assert held.acquire("a")
    assert held.held == 3


def test_held_calls_per_account_and_per_peer_refuse_the_newcomer():
    """Many client ids of one account (or from one address) hold no more than its bound;
    the holder's own earlier calls stay held, other holders are untouched."""
    held = HeldCalls(total=100, per_client=64, per_peer=5, per_account=3)
    mine = [held.acquire(f"id{i}", "thief", f"10.0.0.{i}") for i in range(10)]
    assert sum(c is not None for c in mine) == 3 and held.of("account", "thief") == 3
    from_one = [held.acquire(f"nat{i}", "", "10.9.9.9") for i in range(10)]
    assert sum(c is not None for c in from_one) == 5 and held.of("peer", "10.9.9.9") == 5
    assert held.acquire("honest", "orders-svc", "10.9.9.8") is not None
    assert held.pushed_out == 0 and not any(c.pushed_out for c in mine if c)
    held.release(mine[0])
    assert held.acquire("id99", "thief", "10.0.0.99") is not None
    with pytest.raises(ValueError, match="allowed"):
        HeldCalls(per_account=0)


def test_a_full_pool_of_held_calls_is_shared_out_fairly():
    """When one holder fills the pool, a newcomer with fewer takes the place of that
    holder's oldest call (which answers at once); the holder's own newcomers are refused,
    so the pool settles with every holder served, and never pushes out a smaller one."""
    held = HeldCalls(total=6, per_client=64, per_peer=64, per_account=64)
    flood = [held.acquire(f"id{i}", "thief", "10.0.0.1") for i in range(6)]
    assert all(flood) and held.acquire("id6", "thief", "10.0.0.2") is None
    honest = held.acquire("c1", "orders-svc", "10.0.0.1")  # (same address: by account)
    assert honest is not None and honest.pushed_one_out and flood[0].pushed_out
    assert held.held == 6 and held.of("account", "thief") == 5
    held.release(flood[0])  # (the pushed-out call ending: nothing more)
    assert held.held == 6
    second = held.acquire("c2", "orders-svc", "10.0.0.1")
    assert second is not None and flood[1].pushed_out
    # 4 against 2: one more, then it is even, and the smaller holder is never pushed out
    assert held.acquire("c3", "orders-svc", "10.0.0.1") is not None
    assert held.acquire("c4", "orders-svc", "10.0.0.1") is None
    assert held.acquire("id7", "thief", "10.0.0.1") is None
    assert (held.of("account", "thief"), held.of("account", "orders-svc")) == (3, 3)
    # without accounts (no ACL), the holders are peer addresses
    open_ = HeldCalls(total=4, per_client=64, per_peer=64, per_account=64)
    assert all(open_.acquire(f"id{i}", "", "10.0.0.1") for i in range(4))
    assert open_.acquire("x", "", "10.0.0.2").pushed_one_out
    assert open_.pushed_out == 1


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_gzip_bomb_is_refused_with_memory_flat(endpoint_of):
    endpoint = endpoint_of()
    deflate, zeros = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)
    bomb = b"".join(deflate.compress(zeros) for _ in range(256)) + deflate.flush()
    assert len(bomb) < 512 << 10  # 256 MiB inflated
    m = message("bombed", bomb)
    m.system_properties.body_encoding = pb.Encoding.GZIP
    s, channel = stub(endpoint.endpoint)
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # the peak starts from here
            fh.write("5")
        before = _peak_rss_bytes()
        r = s.SendMessage(rpc.SendMessageRequest(messages=[m]), timeout=60)
        grew = _peak_rss_bytes() - before
    finally:
        channel.close()
    assert r.status.code == pb.Code.MESSAGE_BODY_TOO_LARGE, r.status
    assert grew < 64 << 20, f"the peak memory grew by {grew >> 20} MiB"


def test_refused_calls_are_logged_at_a_bounded_rate(caplog):
    now = [0.0]
    budget = LogBudget(logging.getLogger("store.proxy"), per_second=5, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="store.proxy"):
        logged = sum(budget.warning("refused %d", i) for i in range(1000))
        assert logged == 5 and len(caplog.records) == 5
        now[0] += 1.0
        assert budget.warning("refused again")
    assert "995 similar lines left out" in caplog.records[-1].getMessage()


def test_a_flood_of_refused_calls_logs_few_lines(endpoint_of, caplog):
    endpoint = endpoint_of()
    s, channel = stub(endpoint.endpoint)
    start = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="store.proxy"):
            for _ in range(300):
                s.SendMessage(rpc.SendMessageRequest(messages=[message("flood", b"")]))
    finally:
        channel.close()
    took = time.monotonic() - start
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) <= 20 + 20 * took + 1, (len(lines), took)  # REFUSALS_LOGGED_PER_S


def test_telemetry_streams_close_the_least_recently_active_of_the_peer_then_of_all():
    streams = TelemetryStreams(total=4, per_peer=2)
    assert streams.add("a1", "A") == [] and streams.add("a2", "A") == []
    streams.touch("a1")  # a2 is now the idlest of A
    (closed, why), = streams.add("a3", "A")
    assert closed == "a2" and "2 streams are open from A" in why
    assert streams.add("b1", "B") == [] and streams.add("b2", "B") == []
    streams.touch("a1")
    (closed, why), = streams.add("c1", "C")  # all four taken: the idlest of all goes
    assert closed == "a3" and "4 streams are open in all" in why
    streams.remove("a3")  # (closed already: nothing)
    streams.remove("b1")
    assert streams.open == 3 and streams.of_peer("A") == 1 and streams.of_peer("B") == 1
    assert streams.closed == 2
    with pytest.raises(ValueError, match="allowed"):
        TelemetryStreams(total=0)


def test_peer_addresses_and_a_worker_s_vouching():
    from store.proxy.grpc_limits import PEER_HEADER, peer_host, vouch, vouched_peer
    from store.proxy.handles import Signer

    assert peer_host("ipv4:10.1.2.3:5000") == "10.1.2.3"
    assert peer_host("ipv6:[::1]:5000") == "::1"
    assert peer_host("unix:/tmp/s") == "unix:/tmp/s"
    signer = Signer(b"k" * 32)
    header = vouch("Telemetry", "10.1.2.3", "c1", signer)
    headers = {**dict([header]), "x-mq-client-id": "c1"}
    assert vouched_peer("Telemetry", headers, signer) == "10.1.2.3"
    assert vouched_peer("Telemetry", {}, signer) is None
    _, at, tag = header[1].split()
    forged = {**headers, PEER_HEADER: f"10.9.9.9 {at} {tag}"}
    assert vouched_peer("Telemetry", forged, signer) is None  # another address under the tag
    assert vouched_peer("Telemetry", headers, Signer(b"o" * 32)) is None  # another store's


def test_a_worker_s_vouching_is_bound_to_its_time_call_and_client():
    """The header a worker vouches with carries when it was made and is bound to the call
    and the client id: seen on loopback and replayed after the window (or on another call,
    for another client id, with its time changed) it is refused.  The code before signed
    the address alone: a header, once seen, stood for that address for ever."""
    from store.proxy.grpc_limits import PEER_HEADER, VOUCH_VALID_MS, vouch, vouched_peer
    from store.proxy.handles import Signer

    signer = Signer(b"k" * 32)
    now = 1_800_000_000_000
    header = vouch("ReceiveMessage", "10.1.2.3", "c1", signer, now_ms=now)
    headers = {**dict([header]), "x-mq-client-id": "c1"}
    assert vouched_peer("ReceiveMessage", headers, signer, now_ms=now) == "10.1.2.3"
    assert vouched_peer("ReceiveMessage", headers, signer,
                        now_ms=now + VOUCH_VALID_MS) == "10.1.2.3"  # (fresh: within)
    assert vouched_peer("ReceiveMessage", headers, signer,
                        now_ms=now + VOUCH_VALID_MS + 1) is None  # replayed after
    assert vouched_peer("ReceiveMessage", headers, signer,
                        now_ms=now - VOUCH_VALID_MS - 1) is None  # (dated ahead)
    assert vouched_peer("Telemetry", headers, signer, now_ms=now) is None  # another call
    assert vouched_peer("ReceiveMessage", {**headers, "x-mq-client-id": "c2"}, signer,
                        now_ms=now) is None  # another client
    peer, at, tag = header[1].split()
    for moved in (f"{peer} {int(at) + 60_000} {tag}", f"{peer} {tag}", f"{peer} x{at} {tag}"):
        assert vouched_peer("ReceiveMessage", {**headers, PEER_HEADER: moved}, signer,
                            now_ms=int(at) + 60_000) is None, moved
    # a header made now is taken now (the wall clock by default)
    assert vouched_peer("Telemetry", {**dict([vouch("Telemetry", "10.1.2.3", "c1", signer)]),
                                      "x-mq-client-id": "c1"}, signer) == "10.1.2.3"


def test_a_replayed_vouching_header_is_not_taken_by_the_endpoint(endpoint_of):
    """A client on loopback that saw a worker's header (signed with the store's secret) and
    sends it again after the window is counted under its own address; the header as a
    worker makes it, fresh, is taken."""
    from store.proxy.grpc_limits import VOUCH_VALID_MS, vouch

    endpoint = endpoint_of()
    streams, signer = endpoint.service.streams, endpoint.service.signer
    s, channel = stub(endpoint.endpoint)
    old_ms = time.time_ns() // 1_000_000 - VOUCH_VALID_MS - 1_000
    opened = []
    try:
        for client, header in (("replayed", vouch("Telemetry", "10.9.9.9", "replayed", signer,
                                                   now_ms=old_ms)),
                               ("fresh", vouch("Telemetry", "10.8.8.8", "fresh", signer))):
            opened.append(Stream(s, [("x-mq-client-id", client), header]))
            opened[-1].send(rpc.TelemetryCommand(settings=pb.Settings(
                client_type=pb.ClientType.PRODUCER)))
            assert opened[-1].wait(lambda c: c.HasField("settings"), 5), opened[-1].received
        assert streams.of_peer("10.8.8.8") == 1
        assert streams.of_peer("10.9.9.9") == 0 and streams.of_peer("127.0.0.1") == 1
    finally:
        for stream in opened:
            stream.close()
        channel.close()


def test_an_undated_vouching_header_is_not_taken_by_the_endpoint(endpoint_of):
    """The code before vouched with the address and its tag alone: a header seen once on
    loopback stood for that address for ever.  Such a header is not taken now."""
    from store.proxy.grpc_limits import PEER_HEADER

    endpoint = endpoint_of()
    streams, signer = endpoint.service.streams, endpoint.service.signer
    s, channel = stub(endpoint.endpoint)
    header = (PEER_HEADER, f"10.7.7.7 {signer.tag('peer', '10.7.7.7')}")
    stream = Stream(s, [("x-mq-client-id", "undated"), header])
    try:
        stream.send(rpc.TelemetryCommand(settings=pb.Settings(
            client_type=pb.ClientType.PRODUCER)))
        assert stream.wait(lambda c: c.HasField("settings"), 5), stream.received
        assert streams.of_peer("10.7.7.7") == 0 and streams.of_peer("127.0.0.1") == 1
    finally:
        stream.close()
        channel.close()


def test_a_stream_whose_client_heartbeats_outlives_idle_ones(endpoint_of):
    """Per peer address two streams: a third closes the one whose client was heard from
    least recently, not the oldest (a heartbeat with its client id counts)."""
    endpoint = endpoint_of(max_telemetry_streams_per_peer=2)
    s, channel = stub(endpoint.endpoint)
    streams = []
    try:
        for client in ("old-but-alive", "idle"):
            streams.append(producer_session(s, client))
        r = s.Heartbeat(rpc.HeartbeatRequest(), metadata=[("x-mq-client-id", "old-but-alive")],
                        timeout=5)
        assert r.status.code == pb.Code.OK
        streams.append(producer_session(s, "newcomer"))
        streams[1]._reader.join(timeout=5)
        assert streams[1].call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "least recently active" in streams[1].call.details()
        assert not streams[0]._reader.join(timeout=0.2) and streams[0]._reader.is_alive()
        assert endpoint.service.streams.open == 2 and endpoint.service.streams.closed == 1
    finally:
        for stream in streams:
            stream.close()
        channel.close()
