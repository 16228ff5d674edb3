"""A replica's gRPC face while it does not lead: clients' calls go on to the leader's.

A replica set's RocketMQ clients are given every replica's endpoint (``"h1:8081;h2:8081"``).
The official clients make **one channel** of them (gRPC's ``pick_first`` over the
addresses: it reaches the first that answers, and another when that one goes away), and
refresh a topic's route only every 30 s; no status code makes them look elsewhere sooner
(the Java and Python clients retry a failed send at once, up to its attempts, on a queue of
the same cached route; ``TOO_MANY_REQUESTS`` alone ends the retries early).  So:

* **routes name every replica** (the replica-set file's ``grpc`` field): a client's channel
  reaches whichever replica is up, with no route refresh after a failover;
* **a follower passes the calls that belong to the leader on to it** (:class:`LeaderChannel`:
  sends, transaction ends, recalls, routes and assignments, and the consumer groups'
  receives, acks, changes of invisibility and dead-lettering), with the caller's headers
  (the leader checks the signature and the rights as for any call), once: a call passed on
  is never passed on again (:data:`FORWARDED_HEADER`), so two replicas that each think the
  other leads refuse rather than pass a call round;
* a replica that leads nobody it knows (an election under way, its lease lapsed) or that
  has no leader's address **refuses** those calls with ``HA_NOT_AVAILABLE``, which every
  official client retries; a leader that could not be reached is told to the client as the
  gRPC failure it was (``UNAVAILABLE``), also retried.

Heartbeats and telemetry streams (the client's settings) are answered by the replica the
channel reaches.  A producer's check-back comes from the leader's check rounds, which ask
the producers of the leader's sessions, so a follower **mirrors a producer's session on the
leader** (:class:`LeaderSession`): a telemetry stream of its own to the leader's endpoint,
opened with the producer's headers when the producer's settings arrive (the leader checks
the signature, and keeps only the topics the account may publish to, as for any session),
carrying the producer's settings; the leader's check-backs on it are handed to the
producer's stream here, and the producer's answer (``EndTransaction``) goes on to the
leader as any call.  That stream ends when the leader goes away or ends it, or (looked at
every :data:`LEADER_WATCH_S`) once another replica leads; the follower then waits for the
election (up to :data:`LEADER_SETTLE_S`) and, unless it was elected itself (its own rounds
then ask the producer), ends the producer's stream, so that the client opens it again with
a fresh signature (a client's headers are never used for a second stream).  A session
opened on a leader that is later deposed is mirrored on the new leader at the producer's
next settings (the official clients send them again every 5 minutes).  A FIFO
consumer group's order is kept through a follower: the follower tells the leader which
groups its sessions consume in order (:data:`FIFO_HEADER`).
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc

log = logging.getLogger("store.proxy")

#: Headers a passed-on call carries: the client's id and signature, RocketMQ's own.
_CLIENT_HEADER_PREFIX = "x-mq-"
#: Marks a call a replica passed on (it is answered where it arrives, never passed again).
FORWARDED_HEADER = "x-rmq-forwarded"
#: Set on a passed-on receive when the follower's sessions consume the group in order.
FIFO_HEADER = "x-rmq-fifo"
#: How often a follower looks whether the leader its producers' sessions are mirrored on
#: still leads (seconds).
LEADER_WATCH_S = 1.0
#: How long a follower whose producer's mirror ended waits for the election to end before
#: it ends the producer's stream (kept when this replica is elected; seconds).
LEADER_SETTLE_S = 10.0
#: Unary calls a follower passes on to its leader (see the module docstring).
FORWARDED_UNARY = ("QueryRoute", "QueryAssignment", "SendMessage", "EndTransaction",
                   "RecallMessage", "AckMessage", "ChangeInvisibleDuration",
                   "ForwardMessageToDeadLetterQueue")


def client_headers(context) -> tuple:
    """The headers of ``context``'s call that another endpoint needs to check it."""
    return tuple((k, v) for k, v in context.invocation_metadata()
                 if k.startswith(_CLIENT_HEADER_PREFIX) or k == "authorization")


def forwarded(context) -> bool:
    """Whether ``context``'s call was passed on by a replica."""
    return any(k == FORWARDED_HEADER for k, _ in context.invocation_metadata())


def forwarded_fifo(context) -> bool:
    """Whether a replica passing the call on consumes its group in order."""
    return any(k == FIFO_HEADER for k, _ in context.invocation_metadata()) and forwarded(context)


async def relay_failure(context, exc: grpc.aio.AioRpcError) -> None:
    """Fail ``context``'s call as the call passed on failed."""
    await context.abort(exc.code(), exc.details() or "the endpoint the call went on to failed")


def _timeout(context) -> float | None:
    left = context.time_remaining()
    return None if left is None or left <= 0 else left


async def forward_unary(stub, name: str, request, context, extra: tuple = ()):
    """Call ``name`` on ``stub`` with ``context``'s client headers (and ``extra``); its
    answer, or ``context`` failed as it failed."""
    try:
        return await getattr(stub, name)(request, metadata=client_headers(context) + extra,
                                         timeout=_timeout(context))
    except grpc.aio.AioRpcError as exc:
        await relay_failure(context, exc)


async def forward_stream(stub, name: str, request, context, extra: tuple = ()):
    """The responses of the server-streaming call ``name`` on ``stub`` (as
    :func:`forward_unary`)."""
    try:
        async for response in getattr(stub, name)(
                request, metadata=client_headers(context) + extra, timeout=_timeout(context)):
            yield response
    except grpc.aio.AioRpcError as exc:
        await relay_failure(context, exc)


class LeaderChannel:
    """The channel to the gRPC endpoint of the leader ``replica`` (a
    :class:`~store.replication.replica.Replica`) knows, made when the leader changes; used
    on the endpoint's event loop only.  ``tls``: the endpoint's own ``(chain, key)``; the
    leader's certificate is then checked against the system's roots."""

    def __init__(self, replica, max_message_bytes: int, tls=None) -> None:
        self.replica = replica
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes)]
        self._tls = tls is not None
        self._address: str | None = None
        self._channel = None
        self._stub = None
        self._closed = False
        self._mirrors: set[LeaderSession] = set()
        self._watcher: asyncio.Future | None = None

    def stub(self, context):
        """The leader's stub for ``context``'s call, or ``None``: the call is answered here
        (this replica leads, knows no other leader or no address of its, or the call was
        passed on already)."""
        return None if forwarded(context) else self.leader_stub()

    def leader_stub(self):
        """The leader's stub, or ``None`` when this replica leads, knows no other leader or
        no address of its."""
        replica = self.replica
        if replica.leading():
            return None
        leader = replica.leader
        address = (None if leader is None or leader == replica.me
                   else replica.replica_set.grpc_address(leader))
        if address is None:
            return None
        if address != self._address:
            old = self._channel
            self._channel = (grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(),
                                                     self._options)
                             if self._tls else grpc.aio.insecure_channel(address, self._options))
            self._stub = service_pb2_grpc.MessagingServiceStub(self._channel)
            self._address = address
            if old is not None:
                asyncio.ensure_future(old.close())
        return self._stub

    def watch(self, mirror: LeaderSession) -> None:
        """End ``mirror`` once another replica leads (looked at every
        :data:`LEADER_WATCH_S`, by one task for every mirror)."""
        self._mirrors.add(mirror)
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())

    def unwatch(self, mirror: LeaderSession) -> None:
        self._mirrors.discard(mirror)

    async def _watch(self) -> None:
        try:
            while self._mirrors:
                await asyncio.sleep(LEADER_WATCH_S)
                leader = self.replica.leader
                for mirror in [m for m in self._mirrors
                               if leader is not None and m.leader != leader]:
                    mirror.end()
        finally:
            self._watcher = None

    async def settled(self, old: str | None) -> None:
        """Return once this replica leads or knows a leader other than ``old`` (an election
        over), or after :data:`LEADER_SETTLE_S`."""
        end = asyncio.get_running_loop().time() + LEADER_SETTLE_S
        while not self.replica.leading() and self.replica.leader in (None, old) \
                and not self._closed and asyncio.get_running_loop().time() < end:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


class LeaderSession:
    """A producer's telemetry session on this follower, mirrored on the leader (see the
    module docstring); made on the event loop when the producer's stream starts (``context``
    is read then only) and used there.  ``deliver(command)``: hands a check-back to the
    producer's stream; ``lost()``: called when the leader's stream ended otherwise than by
    :meth:`close` (the leader ended it, went away, or another replica leads now)."""

    def __init__(self, channel: LeaderChannel, context, deliver, lost) -> None:
        self._channel = channel
        self._headers = client_headers(context) + ((FORWARDED_HEADER, "1"),)
        self._passed_on = forwarded(context)  # (answered here only: never mirrored again)
        self._deliver = deliver
        self._lost = lost
        self._requests: asyncio.Queue | None = None
        self._reader: asyncio.Future | None = None
        self._call = None
        self._closed = False
        #: The leader the mirror is on (:meth:`LeaderChannel.watch` ends it once another leads).
        self.leader: str | None = None

    def pass_on(self, command) -> None:
        """Pass the producer's ``command`` on: a producer's settings open the leader's
        stream (while this replica follows a leader it knows); later settings go on it."""
        if command.WhichOneof("command") != "settings" or self._closed:
            return
        if self._requests is None:
            stub = None if self._passed_on else self._channel.leader_stub()
            if stub is None or not command.settings.HasField("publishing"):
                return
            self.leader = self._channel.replica.leader
            self._requests = asyncio.Queue()
            self._call = stub.Telemetry(self._commands(), metadata=self._headers)
            self._reader = asyncio.ensure_future(self._read())
            self._channel.watch(self)
        self._requests.put_nowait(command)

    async def _commands(self):
        while (command := await self._requests.get()) is not None:
            yield command

    async def _read(self) -> None:
        try:
            async for command in self._call:
                if command.HasField("recover_orphaned_transaction_command"):
                    self._deliver(command)
        except asyncio.CancelledError:
            pass  # closed, or ended by the watch
        except grpc.aio.AioRpcError as exc:
            log.info("the leader's telemetry stream of a producer ended: %s %s",
                     exc.code().name, exc.details())
        finally:
            self._channel.unwatch(self)
        if not self._closed:
            await self._channel.settled(self.leader)
        if not self._closed:
            self._lost()

    def end(self) -> None:
        """End the leader's stream (another replica leads now): ``lost()`` follows."""
        if self._call is not None:
            self._call.cancel()

    def close(self) -> None:
        """End the leader's stream (the producer's ended)."""
        self._closed = True
        if self._reader is not None:
            self._call.cancel()
            self._reader.cancel()
            self._requests.put_nowait(None)


__all__ = ["FIFO_HEADER", "FORWARDED_HEADER", "FORWARDED_UNARY", "LeaderChannel", "LeaderSession",
           "client_headers", "forward_stream", "forward_unary", "forwarded", "forwarded_fifo",
           "relay_failure"]
