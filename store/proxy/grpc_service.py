"""The ``apache.rocketmq.v2`` ``MessagingService`` over one store: ``rmq serve --grpc``.

What RocketMQ 5's proxy does for its clients (Java, Go, C++, C#, Rust, Node.js, Python), done
over a :class:`~store.MessageStore`:

=============================  ================================================================
call                           what it does here
=============================  ================================================================
QueryRoute                     the topic's queues, all on this endpoint (a topic is created on
                               first use, as a broker with ``autoCreateTopicEnable``)
Heartbeat, Telemetry           client sessions: the settings the client sends are answered with
                               the server's (body limit, retry policy, long polling); a
                               producer's stream carries the transaction check-back
NotifyClientTermination        ends a client's session
SendMessage                    normal, FIFO (message group: the queue), delay (the timer
                               wheel), transactional half messages; the client's message id
EndTransaction                 commit or rollback of a half message
RecallMessage                  cancels a pending delay message by its recall handle
QueryAssignment                a push consumer's assignment: the whole topic
ReceiveMessage                 hands out visible messages to a consumer group, long polling
AckMessage                     acks hand-outs (:mod:`store.proxy.consumers`)
ChangeInvisibleDuration        moves a hand-out's invisibility
ForwardMessageToDeadLetterQueue  copies a message to ``%DLQ%<group>`` and acks it
=============================  ================================================================

Every answer carries a RocketMQ status; a bad request gets its code and a text saying what
was wrong (never a stack trace), is logged, and stores nothing.  The other calls (pull
consumers' offsets, lite topics) answer ``NOT_IMPLEMENTED``.  The producers' calls and the
transaction check-back are in :mod:`.producer_calls`, the consumer groups' calls in
:mod:`.consumer_calls`; this module holds the endpoint itself: its members, routes, client
sessions and the guard every call runs in.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from ..base.errors import (
    InvalidConfigError,
    StoreError,
)
from ..formats.message import (
    is_valid_topic_name,
)
from .access import OPEN, AccessControl, Account
from .consumer_calls import (
    LONG_POLLING_DEFAULT_MS,
    RECEIVE_BATCH_MAX,
    ConsumerCalls,
)
from .convert import (
    Code,
    MessageType,
    Refused,
    check_client_id,
    check_topic_name,
    set_duration_ms,
    status,
    store_error_code,
)
from .grpc_limits import HeldCalls, LogBudget, TelemetryStreams, peer_host
from .handles import Signer, store_secret
from .members import Member
from .producer_calls import ProducerCalls

log = logging.getLogger("store.proxy")

#: What the endpoint tells clients (RocketMQ's proxy defaults).
SEND_ATTEMPTS = 3
#: Topics an endpoint remembers as existing (forgotten all at once past that)
_TOPICS_SEEN = 4096
_ACCEPTED = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)


class Outbox:
    """The commands for one telemetry stream: put from any thread, awaited on the endpoint's
    event loop (no thread waits for a stream's next command)."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self._ready: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def put(self, item) -> None:
        self._items.append(item)
        loop = self._loop  # (None: get has not run; it finds the item when it does)
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the loop is closed: nothing waits any more
                pass

    async def get(self):
        """The next item, waiting on the running loop for one."""
        if self._loop is None:
            self._ready = asyncio.Event()  # (before _loop: a put that sees _loop sets it)
            self._loop = asyncio.get_running_loop()
        while not self._items:
            self._ready.clear()
            if self._items:
                break
            await self._ready.wait()
        return self._items.popleft()


@dataclass(eq=False)  # (a session is counted by identity: TelemetryStreams)
class Session:
    """One client's telemetry stream."""

    client_id: str
    peer: str
    account: Account = OPEN  # the account that opened the session: the client id's owner
    client_type: int = pb.ClientType.CLIENT_TYPE_UNSPECIFIED
    topics: frozenset[str] = frozenset()
    group: str | None = None
    fifo: bool = False
    outbox: Outbox = field(default_factory=Outbox)
    open: bool = True


def _check_owner(session: Session, account: Account) -> None:
    """``FORBIDDEN`` unless ``account`` opened ``session``: a client id belongs to the account
    whose stream opened it (no other account can end it or take its check-backs)."""
    if session.account.access_key != account.access_key:
        raise Refused(Code.FORBIDDEN, f"client id {session.client_id[:80]!r} belongs to another "
                                      "account")


class _Closed:
    """Ends a session's outgoing stream."""


@dataclass(frozen=True)
class Evicted:
    """Ends a session's stream with ``RESOURCE_EXHAUSTED``: it was closed to make room
    (:class:`~store.proxy.grpc_limits.TelemetryStreams`)."""

    text: str




class MessagingService(ProducerCalls, ConsumerCalls,
                       service_pb2_grpc.MessagingServiceServicer):
    """The calls (see the module docstring) over ``stores``: ``[(name, MessageStore)]``, one
    store or the members of a store group.

    A group is served as one endpoint, as :class:`~store.StoreGroup` spreads sends: a topic's
    route lists the queues of every member; FIFO messages go to the queue of the group's
    route their message group hashes to, other messages to the members in turn; a consumer
    group receives from every member, and receipt and recall handles name the member.
    """

    def __init__(self, stores, *, access: AccessControl | None = None,
                 address: tuple[str, int] = ("127.0.0.1", 0),
                 held: HeldCalls | None = None,
                 streams: TelemetryStreams | None = None) -> None:
        self.members = [Member(name, store) for name, store in stores]
        if not self.members:
            raise ValueError("an endpoint serves one store at least")
        self.store = self.members[0].store  # the config and clock of the whole endpoint
        self.access = access
        self.address = address
        self._next_member = 0
        self._members_lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._sessions_lock = threading.Lock()
        self._arrived = threading.Condition()
        self._waiting = 0  # receivers waiting on _arrived (changed under it)
        self._closing = threading.Event()
        self.signer = Signer(store_secret(self.store.root))
        self._topics_seen: set[str] = set()  # (_exists)
        self._consumers_checked: dict = {}  # (ConsumerCalls._consumer)
        self.held = held if held is not None else HeldCalls()
        self.streams = streams if streams is not None else TelemetryStreams()
        self.refusals = LogBudget(log)
        #: The replica-set member the store is (:mod:`store.replication.replica`), set by
        #: its server (:meth:`serve_replica`): writes only while it leads; ``None`` alone.
        self.replica = None
        #: What route answers name: every replica's endpoint (``None``: this one's).
        self.routes: pb.Endpoints | None = None

    def serve_replica(self, replica, endpoints: list[tuple[str, int]]) -> None:
        """Serve as a member of a replica set: writes (and the consumer groups' calls) only
        while ``replica`` leads, each checked under the store's append lock (so that no
        change of role comes between the check and the append); routes name ``endpoints``,
        every replica's ``(host, port)``, so that a client's channel reaches whichever
        replica is up (:mod:`store.proxy.follower_calls`).  The consumer groups hand out
        only what is below the replica's high watermark, as its Flight readers read, and
        take the copied progress when the replica comes to lead (``take_role``)."""
        versions = set()
        for host, _ in endpoints:
            try:
                versions.add(ipaddress.ip_address(host).version)
            except ValueError:
                versions.add(None)
        if len(versions) != 1 or None in versions:  # (a client takes one domain name only)
            raise InvalidConfigError(
                f"the replicas' gRPC endpoints {[f'{h}:{p}' for h, p in endpoints]}: a route "
                "names them all, which the clients take as IP addresses of one version; "
                "allowed: IPv4 (or IPv6) addresses in the replica-set file's \"grpc\"")
        scheme = pb.AddressScheme.IPv4 if versions == {4} else pb.AddressScheme.IPv6
        self.routes = pb.Endpoints(scheme=scheme, addresses=[
            pb.Address(host=host, port=port) for host, port in endpoints])
        for member in self.members:
            member.groups.read_below(replica.high_watermark)
            member.groups.take_role(replica.role)  # (a leader's offsets: in its log)
            replica.role_listeners.append(member.groups.take_role)  # (progress copied)
        self.replica = replica

    @contextmanager
    def leader_write(self, what: str):
        """Inside: this replica leads and keeps leading (the store's append lock, which a
        change of role takes too), and a write's wait for its copies comes when the block
        ends; outside a replica set, nothing.  ``NotLeaderError`` otherwise."""
        replica = self.replica
        if replica is None:
            yield
            return
        with self.store.write_lock():
            replica.check_write(what)
            yield

    def check_leading(self, what: str) -> None:
        """``NotLeaderError`` unless this replica leads (outside a replica set: nothing)."""
        if self.replica is not None:
            self.replica.check_write(what)

    # -- plumbing -----------------------------------------------------------------------
    def _account(self, context) -> Account:
        if self.access is None:
            return OPEN
        return self.access.account(dict(context.invocation_metadata()), self.store.now_ms())

    def _guard(self, context, method: str, respond, body):
        """Run ``body()``; a refusal or a store error becomes ``respond(status)``."""
        try:
            return body()
        except Exception as exc:  # noqa: BLE001 - the server keeps serving; the client is told
            return self._failed(context, method, respond, exc)

    def _failed(self, context, method: str, respond, exc: Exception):
        """``respond(status)`` for a refusal, a store error or any other failure of a call."""
        if isinstance(exc, Refused):
            self._refused(method, context, exc)
            return respond(status(exc.code, exc.text))
        if isinstance(exc, StoreError):
            code = store_error_code(exc)
            self.refusals.warning("%s from %s failed (%s): %.300s", method, context.peer(),
                                  Code.Name(code), exc)
            return respond(status(code, self._text(exc)))
        log.error("%s from %s failed", method, context.peer(), exc_info=exc)
        return respond(status(Code.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}"))

    def _refused(self, method: str, context, exc: Refused) -> None:
        self.refusals.warning("%s from %s refused (%s): %.300s", method, context.peer(),
                              Code.Name(exc.code), exc.text)

    @staticmethod
    def _client(context) -> str:
        """Who a call is from, for the bounds per client: its client id, or its peer."""
        return dict(context.invocation_metadata()).get("x-mq-client-id") or context.peer()

    def _text(self, exc: Exception) -> str:
        """An error's text for a client: the store's directory is not its business."""
        text = str(exc)
        for m in self.members:
            text = text.replace(m.store.root, "<store>")
        return text

    def wake_receivers(self) -> None:
        if self._waiting:  # (a receiver that starts waiting just after looks again within
            with self._arrived:  # POLL_INTERVAL_MS: no send is missed for longer)
                self._arrived.notify_all()

    def close(self) -> None:
        self._closing.set()
        with self._sessions_lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            s.outbox.put(_Closed)
        self.wake_receivers()
        for m in self.members:
            m.groups.close()

    def _exists(self, topic: str) -> bool:
        # a topic found once stays (a store never removes one): every ack and receive asks,
        # and the store's list of topics looks at its files each time
        if topic in self._topics_seen:
            return True
        if any(topic in m.store.topics() for m in self.members):
            if len(self._topics_seen) >= _TOPICS_SEEN:
                self._topics_seen.clear()
            self._topics_seen.add(topic)
            return True
        return False

    def _route(self, topic: str) -> list[tuple[int, int]]:
        """``(member, queue)`` of the topic's queues in every member, creating it where it
        is missing: the queues a message group is hashed over (as :class:`StoreGroup`)."""
        return [(i, q) for i, m in enumerate(self.members)
                for q in range(m.store.ensure_topic(topic))]

    def _next(self) -> tuple[int, Member]:
        """The next member in turn, with its position."""
        with self._members_lock:
            i = self._next_member % len(self.members)
            self._next_member = i + 1
        return i, self.members[i]

    @staticmethod
    def _may(account: Account, topic: str, right: str) -> bool:
        try:
            account.check_topic(topic, right)
        except Refused:
            return False
        return True

    def _endpoints(self, requested) -> pb.Endpoints:
        if self.routes is not None:
            return self.routes
        if requested is not None and requested.addresses:
            return requested
        host, port = self.address
        return pb.Endpoints(scheme=pb.AddressScheme.IPv4,
                            addresses=[pb.Address(host=host, port=port)])

    def _queue(self, topic: str, queue_id: int, endpoints) -> pb.MessageQueue:
        return pb.MessageQueue(
            topic=pb.Resource(name=topic), id=queue_id, permission=pb.Permission.READ_WRITE,
            broker=pb.Broker(name="rmq", id=0, endpoints=endpoints),
            accept_message_types=_ACCEPTED)

    # -- routes and sessions ------------------------------------------------------------
    def QueryRoute(self, request, context):
        def body():
            account = self._account(context)
            topic = check_topic_name(request.topic.name)
            if not (account.admin or account.topics.get(topic, account.default_topic)):
                raise Refused(Code.FORBIDDEN, f"access key {account.access_key!r} has no right "
                                              f"on topic {topic!r}")
            if not self._exists(topic):
                if not self._may(account, topic, "PUB"):
                    raise Refused(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist (a "
                                                        "producer's first send creates it)")
                with self.leader_write("creating a topic"):  # on first use by whoever may
                    for m in self.members:                      # send to it
                        m.store.ensure_topic(topic)
            count = len(self._route(topic))
            endpoints = self._endpoints(request.endpoints)
            return rpc.QueryRouteResponse(
                status=status(),
                message_queues=[self._queue(topic, q, endpoints) for q in range(count)])
        return self._guard(context, "QueryRoute",
                           lambda s: rpc.QueryRouteResponse(status=s), body)

    def Heartbeat(self, request, context):
        def body():
            account = self._account(context)
            session = self._sessions.get(dict(context.invocation_metadata()).get(
                "x-mq-client-id", ""))
            if session is not None and session.account.access_key == account.access_key:
                self.streams.touch(session)  # (its stream is not idle)
            return rpc.HeartbeatResponse(status=status())
        return self._guard(context, "Heartbeat", lambda s: rpc.HeartbeatResponse(status=s), body)

    def NotifyClientTermination(self, request, context):
        def body():
            account = self._account(context)
            client_id = dict(context.invocation_metadata()).get("x-mq-client-id", "")
            with self._sessions_lock:
                session = self._sessions.get(client_id)
                if session is not None:
                    _check_owner(session, account)
                    del self._sessions[client_id]
            if session is not None:
                session.open = False
                session.outbox.put(_Closed)
            return rpc.NotifyClientTerminationResponse(status=status())
        return self._guard(context, "NotifyClientTermination",
                           lambda s: rpc.NotifyClientTerminationResponse(status=s), body)

    def _settings_reply(self, session: Session, settings: pb.Settings) -> rpc.TelemetryCommand:
        out = pb.Settings()
        out.CopyFrom(settings)
        if settings.HasField("publishing") or session.client_type == pb.ClientType.PRODUCER:
            out.publishing.max_body_size = self.store.config.max_message_size_bytes
            out.publishing.validate_message_type = False
            policy = out.backoff_policy
            policy.max_attempts = SEND_ATTEMPTS
            set_duration_ms(policy.exponential_backoff.initial, 10)
            set_duration_ms(policy.exponential_backoff.max, 1000)
            policy.exponential_backoff.multiplier = 2.0
        else:
            sub = out.subscription
            sub.fifo = session.fifo
            if not sub.receive_batch_size:
                sub.receive_batch_size = RECEIVE_BATCH_MAX
            if not sub.long_polling_timeout.seconds:
                set_duration_ms(sub.long_polling_timeout, LONG_POLLING_DEFAULT_MS)
            policy = out.backoff_policy
            policy.max_attempts = self.members[0].groups.max_attempts
            set_duration_ms(policy.exponential_backoff.initial, 1000)
            set_duration_ms(policy.exponential_backoff.max, 60_000)
            policy.exponential_backoff.multiplier = 2.0
        out.metric.on = False
        return rpc.TelemetryCommand(status=status(), settings=out)

    def _on_command(self, session: Session, command: rpc.TelemetryCommand) -> None:
        self.streams.touch(session)
        which = command.WhichOneof("command")
        if which == "settings":
            s = command.settings
            session.client_type = s.client_type
            # a session holds only the topics its account has the right to: the check-back
            # of a topic goes to its publishers, never to whoever names it
            if s.HasField("publishing"):
                session.topics = self._permitted(session, (r.name for r in s.publishing.topics),
                                                 "PUB")
            if s.HasField("subscription"):
                group = s.subscription.group.name
                session.group = group if group and is_valid_topic_name(group) else None
                session.topics = self._permitted(
                    session, (e.topic.name for e in s.subscription.subscriptions), "SUB")
            session.outbox.put(self._settings_reply(session, s))
        elif which in ("thread_stack_trace", "verify_message_result"):
            log.info("client %s answered %s", session.client_id, which)
        else:
            log.warning("client %s sent an unexpected telemetry command %s", session.client_id,
                        which)

    def open_session(self, context, peer: str | None = None) -> Session:
        """The session of a telemetry stream starting (counted among the streams of its peer
        address, ``peer`` or the call's; the client id's earlier session ended; the least
        recently active streams closed when a bound is reached); ``Refused`` when the call
        is not allowed.  ``context`` is read here only: a stream's context is read on the
        event loop, never from another thread."""
        client_id = dict(context.invocation_metadata()).get("x-mq-client-id", "")
        account = self._account(context)
        check_client_id(client_id)
        session = Session(client_id, context.peer(), account)
        with self._sessions_lock:
            old = self._sessions.get(client_id)
            if old is not None:
                _check_owner(old, account)
            self._sessions[client_id] = session
        if old is not None:
            self.streams.remove(old)
            old.open = False
            old.outbox.put(_Closed)
        for other, why in self.streams.add(session, peer or peer_host(context.peer())):
            other.open = False
            other.outbox.put(Evicted(
                f"telemetry stream of client {other.client_id[:80]!r} closed to make room: "
                f"{why} and it was the least recently active; open it again"))
        return session

    def close_session(self, session: Session) -> None:
        """The end of ``session``'s telemetry stream (once, however it ended)."""
        self.streams.remove(session)
        session.open = False
        with self._sessions_lock:
            if self._sessions.get(session.client_id) is session:
                del self._sessions[session.client_id]

    async def next_command(self, session: Session):
        """The next command for ``session``'s stream, waiting on the event loop for one;
        ``None`` once the stream is to end, an :class:`Evicted` when it is closed to make
        room."""
        item = await session.outbox.get() if not self._closing.is_set() else _Closed
        return None if item is _Closed or self._closing.is_set() else item

    @staticmethod
    def end_stream(session: Session) -> None:
        """Make the wait of :meth:`next_command` end (the stream's call ended)."""
        session.outbox.put(_Closed)

    def _permitted(self, session: Session, topics, right: str) -> frozenset[str]:
        """The ``topics`` a session's account may ``right`` (the others are left out, and
        logged)."""
        named = set(topics)
        kept = frozenset(t for t in named
                         if is_valid_topic_name(t) and self._may(session.account, t, right))
        if kept != named:
            self.refusals.warning(
                "client %s (access key %r) named topics it may not %s; left out: %s",
                session.client_id[:80], session.account.access_key, right,
                sorted(t[:80] for t in named - kept)[:10])
        return kept

    def producers_of(self, topic: str) -> list[Session]:
        """The live producer sessions publishing ``topic`` whose account may publish it."""
        with self._sessions_lock:
            return [s for s in self._sessions.values()
                    if s.open and s.client_type == pb.ClientType.PRODUCER and topic in s.topics
                    and self._may(s.account, topic, "PUB")]

    # -- not offered --------------------------------------------------------------------
    def _not_implemented(self, name: str, response):
        return response(status=status(Code.NOT_IMPLEMENTED,
                                      f"{name} is not offered by rmq (pull consumers and lite "
                                      "topics are not supported)"))

    def PullMessage(self, request, context):
        yield self._not_implemented("PullMessage", rpc.PullMessageResponse)

    def UpdateOffset(self, request, context):
        return self._not_implemented("UpdateOffset", rpc.UpdateOffsetResponse)

    def GetOffset(self, request, context):
        return self._not_implemented("GetOffset", rpc.GetOffsetResponse)

    def QueryOffset(self, request, context):
        return self._not_implemented("QueryOffset", rpc.QueryOffsetResponse)

    def SyncLiteSubscription(self, request, context):
        return self._not_implemented("SyncLiteSubscription", rpc.SyncLiteSubscriptionResponse)
