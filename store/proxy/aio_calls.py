"""The endpoint's calls on ``grpc.aio``: one event loop answers, sends are stored in groups.

Where the CPU of a send went with a pool of threads (docs/benchmarks.md): gRPC's hand-off of
every call to a pool thread and the GIL's switches between 64+ threads cost more than the
send itself, and the signature check parsed its date with ``time.strptime`` on every call.
Here one event loop thread reads every call; what it does per call is the per-call work
only (the signature, remembered once checked; the message checks:
:meth:`~store.proxy.grpc_service.MessagingService.checked_sends`) and the store's append.

**Group commit** (:class:`GroupCommit`).  By default a send is stored in its own turn of the
loop: ``grpc.aio`` runs one call a turn, so there is nothing to group and no hand-off to
make.  With ``writer_thread=True`` checked sends queue for one writer thread; the sends that
arrive while it stores a group form the next one, each call answered once its messages are
stored (as durable as :meth:`~store.Producer.send`); a send that fails fails alone.  On two
cores that measured slower (the hand-off and GIL switches cost more than the store's own
share of a send, about 20 us, leaves to share); it is kept for a store whose appends wait
(``SYNC_FLUSH``).

Long-polling receives keep threads of their own while they wait, from the pool
:mod:`store.proxy.grpc_limits` bounds; a receive's answer is streamed by the loop.  A
telemetry stream holds no thread: it awaits its next command on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from .convert import Refused
from .follower_calls import (
    FIFO_HEADER,
    FORWARDED_HEADER,
    FORWARDED_UNARY,
    LeaderChannel,
    LeaderSession,
    forward_stream,
    forward_unary,
)
from .grpc_limits import RequestWaits, vouched_peer
from .grpc_service import Evicted, MessagingService, status

_OK = status()
log = logging.getLogger("store.proxy")


class GroupCommit:
    """Items of concurrent calls stored together by ``store_group(items)`` (which returns
    per item ``(result, failure)``); see the module docstring.  Used from the event loop
    only.

    ``writer_thread=False`` stores on the loop itself, in the call's turn: ``grpc.aio`` runs
    one call a turn, so a group there is one item, with no hand-off at all; the loop waits
    for the store (an append, or another process's append lock, at most
    ``append_lock_lease_ms``).  ``True`` hands groups to one writer thread: the loop goes on
    reading calls meanwhile and the items that arrive while the writer stores form the next
    group, for a hand-off and GIL switches per group: worth it where the store's call costs
    far more than that and takes many items at once (ending transactions), not for a send
    (about 20 us of the store's, measured slower on two cores).
    """

    def __init__(self, store_group, loop: asyncio.AbstractEventLoop, *,
                 writer_thread: bool = False, name: str = "rmq-grpc-append") -> None:
        self._store = store_group
        self._loop = loop
        self.writer = (ThreadPoolExecutor(1, thread_name_prefix=name)
                       if writer_thread else None)
        self._pending: list[tuple[object, asyncio.Future]] = []
        self._busy = False
        #: groups stored and items in them (what a test or a bench reads)
        self.groups = 0
        self.sends = 0

    async def store(self, item):
        """The result of ``item``, once stored."""
        if self.writer is None:  # the loop turn is this call's: stored now, no hand-off
            self.groups += 1
            self.sends += 1
            ((result, exc),) = self._store([item])
            if exc is not None:
                raise exc
            return result
        future = self._loop.create_future()
        self._pending.append((item, future))
        if not self._busy:
            self._busy = True
            self._flush()
        return await future

    def _take(self) -> list:
        group, self._pending = self._pending, []
        self.groups += 1
        self.sends += len(group)
        return group

    def _flush(self) -> None:
        group = self._take()
        done = self._loop.run_in_executor(self.writer, self._store, [c for c, _ in group])
        done.add_done_callback(lambda f: self._done(group, f))

    @staticmethod
    def _answer(group: list, results: list) -> None:
        for (_, future), (entries, exc) in zip(group, results):
            if future.done():  # (the call was cancelled)
                continue
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(entries)

    def _done(self, group: list, finished: asyncio.Future) -> None:
        failure = finished.exception()
        if failure is not None:
            for _, future in group:
                if not future.done():
                    future.set_exception(failure)
        else:
            self._answer(group, finished.result())
        if self._pending:
            self._flush()
        else:
            self._busy = False

    def close(self) -> None:
        if self.writer is not None:
            self.writer.shutdown(wait=True)


class _HeldContext:
    """What a call run in a pool thread asks of its call's (``grpc.aio``) context, read on
    the event loop when the call starts: a ``grpc.aio`` context is not to be read from
    another thread (the call's memory may be freed meanwhile when its client goes away)."""

    def __init__(self, context) -> None:
        self._metadata = context.invocation_metadata()
        self._peer = context.peer()
        self._active = True
        context.add_done_callback(self._ended)

    def _ended(self, _context) -> None:
        self._active = False

    def invocation_metadata(self):
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def is_active(self) -> bool:
        return self._active


class AsyncMessagingService(MessagingService):
    """:class:`~store.proxy.grpc_service.MessagingService` answering from one event loop: sends
    by group commit, acks and heartbeats on the loop, receives' waits in ``pool`` threads;
    the other calls run in the pool as they are written (``grpc.aio`` runs a plain
    method there)."""

    def __init__(self, stores, *, loop: asyncio.AbstractEventLoop, pool: ThreadPoolExecutor,
                 writer_thread: bool = False, waits: RequestWaits | None = None,
                 **options) -> None:
        super().__init__(stores, **options)
        self.loop = loop
        self.pool = pool
        self.commits = GroupCommit(self._store_sends, loop, writer_thread=writer_thread)
        self.ends = GroupCommit(self._end_transactions, loop, writer_thread=True,
                                name="rmq-grpc-end")
        self.waits = waits if waits is not None else RequestWaits()
        self.leader: LeaderChannel | None = None

    def serve_replica(self, replica, endpoints, *, max_message_bytes: int = 1 << 26,
                      tls=None) -> None:
        """As :meth:`MessagingService.serve_replica`, and while not leading, pass the
        leader's calls on to its endpoint (:mod:`store.proxy.follower_calls`)."""
        super().serve_replica(replica, endpoints)
        self.leader = LeaderChannel(replica, max_message_bytes, tls)

    def leader_stub(self, context):
        """The leader's stub when ``context``'s call goes on to it, else ``None``."""
        return None if self.leader is None else self.leader.stub(context)

    def _store_sends(self, group: list[list]) -> list:
        results = []
        try:  # (a replica's group is checked and waited for once: MessagingService.leader_write)
            with self.leader_write("SendMessage"):
                for checked in group:
                    try:
                        results.append((self.send_checked(checked), None))
                    except Exception as exc:  # noqa: BLE001 - the send's own failure, told to
                        results.append((None, exc))  # it alone
        except Exception as exc:  # noqa: BLE001 - not leading, or the copies not made in time:
            results = [(None, exc)] * len(group)  # no send of the group is acknowledged
        self.wake_receivers()
        return results

    def _end_transactions(self, group: list) -> list:
        try:
            return [(None, exc) for exc in self.end_checked(group)]
        except Exception as exc:  # noqa: BLE001 - told to every call of the group
            return [(None, exc)] * len(group)

    def close(self) -> None:
        super().close()
        self.commits.close()
        self.ends.close()
        if self.leader is not None:
            asyncio.run_coroutine_threadsafe(self.leader.close(), self.loop)

    async def SendMessage(self, request, context):
        try:
            entries = await self.commits.store(self.checked_sends(request, context))
        except Exception as exc:  # noqa: BLE001 - told to the client as a status
            return self._failed(context, "SendMessage",
                                lambda s: rpc.SendMessageResponse(status=s), exc)
        return rpc.SendMessageResponse(status=_OK, entries=entries)

    # short calls answered on the loop, in their own turn (no hand-off to a pool thread,
    # whose threads would contend for the store's lock with the loop and with each other)
    async def Heartbeat(self, request, context):
        return MessagingService.Heartbeat(self, request, context)

    async def QueryRoute(self, request, context):
        return MessagingService.QueryRoute(self, request, context)

    async def QueryAssignment(self, request, context):
        return MessagingService.QueryAssignment(self, request, context)

    async def AckMessage(self, request, context):
        return MessagingService.AckMessage(self, request, context)

    async def ChangeInvisibleDuration(self, request, context):
        return MessagingService.ChangeInvisibleDuration(self, request, context)

    async def EndTransaction(self, request, context):
        try:
            await self.ends.store(self.checked_end(request, context))
        except Exception as exc:  # noqa: BLE001 - told to the client as a status
            return self._failed(context, "EndTransaction",
                                lambda s: rpc.EndTransactionResponse(status=s), exc)
        return rpc.EndTransactionResponse(status=_OK)

    # answered where they arrive, by a pool thread (as grpc.aio runs a plain method), unless
    # passed on to the leader (below)
    async def RecallMessage(self, request, context):
        return await self.loop.run_in_executor(self.pool, MessagingService.RecallMessage,
                                               self, request, _HeldContext(context))

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        return await self.loop.run_in_executor(
            self.pool, MessagingService.ForwardMessageToDeadLetterQueue, self, request,
            _HeldContext(context))

    async def Telemetry(self, request_iterator, context):
        """A client's session: its commands read and the commands for it (settings replies,
        check-backs) awaited on the loop; no thread is held, however long the stream is
        idle (:class:`~store.proxy.grpc_limits.TelemetryStreams` bounds how many)."""
        try:
            session = self.open_session(context, self.peer_of(context))
        except Refused as exc:
            self._refused("Telemetry", context, exc)
            yield rpc.TelemetryCommand(status=status(exc.code, exc.text))
            return
        mirror = self._mirror(session, context)
        reader = asyncio.ensure_future(self._read_commands(session, request_iterator, mirror))
        # (the reader is cancelled once the call is done, not before: the call's status
        # is sent first)
        context.add_done_callback(lambda _: (self.end_stream(session), reader.cancel()))
        try:
            while True:
                command = await self.next_command(session)
                if command is None:
                    break
                if isinstance(command, Evicted):
                    self.refusals.warning("Telemetry from %s ended: %s", session.peer,
                                          command.text)
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, command.text)
                yield command
        finally:
            if mirror is not None:
                mirror.close()
            self.close_session(session)

    def peer_of(self, context) -> str | None:
        """The peer address a stream is counted under when not the call's own: the
        client's, that a worker process passing its stream on vouches for
        (:func:`~store.proxy.grpc_limits.vouched_peer`)."""
        return vouched_peer("Telemetry", dict(context.invocation_metadata()), self.signer)

    def _mirror(self, session, context) -> LeaderSession | None:
        """On a replica set's member, the mirror of a producer's ``session`` on the leader
        while this replica follows (:class:`~store.proxy.follower_calls.LeaderSession`):
        the leader's check-backs reach the producer here."""
        if self.leader is None:
            return None

        def lost() -> None:  # (a replica that leads now asks the producer itself)
            if not self.replica.leading():
                self.end_stream(session)  # the client opens its stream again, signed anew
        return LeaderSession(self.leader, context, session.outbox.put, lost)

    async def _read_commands(self, session, request_iterator, mirror=None) -> None:
        try:
            async for command in request_iterator:
                self._on_command(session, command)
                if mirror is not None:
                    mirror.pass_on(command)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the client went away mid-stream
            log.info("telemetry stream of %s ended: %s", session.client_id, exc)
        finally:
            self.end_stream(session)

    async def ReceiveMessage(self, request, context):
        stub = self.leader_stub(context)
        if stub is not None:  # (the consumer groups are the leader's: follower_calls)
            fifo = ((FIFO_HEADER, "1"),) if self._fifo(request.group.name) else ()
            async for response in forward_stream(stub, "ReceiveMessage", request, context,
                                                 ((FORWARDED_HEADER, "1"),) + fifo):
                yield response
            return
        held = _HeldContext(context)
        try:  # (answered on the loop when there is something to hand out: no hand-off)
            got = self._receive(request, held, wait=False)
            if got is None:  # a long poll: in a pool thread
                got = await self.loop.run_in_executor(self.pool, self._receive, request, held)
            deliveries, _ = got
        except Refused as exc:
            self._refused("ReceiveMessage", context, exc)
            yield rpc.ReceiveMessageResponse(status=status(exc.code, exc.text))
            return
        except Exception as exc:  # noqa: BLE001 - told to the client as a status
            yield self._failed(context, "ReceiveMessage",
                               lambda s: rpc.ReceiveMessageResponse(status=s), exc)
            return
        for response in self.receive_responses(deliveries):
            yield response


def _or_leader(name: str, local):
    """Call ``name`` answered by ``local`` here, or passed on to the leader while this
    replica follows (:mod:`store.proxy.follower_calls`)."""
    async def call(self, request, context):
        stub = self.leader_stub(context)
        if stub is not None:
            return await forward_unary(stub, name, request, context, ((FORWARDED_HEADER, "1"),))
        return await local(self, request, context)
    call.__name__ = name
    return call


for _name in FORWARDED_UNARY:
    setattr(AsyncMessagingService, _name, _or_leader(_name, getattr(AsyncMessagingService, _name)))


class _Malformed:
    """A request whose bytes do not parse (handed to the call, which refuses it)."""


_MALFORMED = _Malformed()
_UNPARSED = "the request does not parse as the method's message"


def _lenient(parse):
    def parse_or_mark(data: bytes):
        try:
            return parse(data)
        except DecodeError:
            return _MALFORMED
    return parse_or_mark


def _reading(service: AsyncMessagingService, name: str, behavior):
    """``behavior`` (a method taking one request, of any of grpc.aio's four shapes) as a
    request-streaming one that reads its request itself: waiting for it within
    ``service.waits`` (:class:`~store.proxy.grpc_limits.RequestWaits`), refusing a call
    whose request did not come (``DEADLINE_EXCEEDED``), a stream ended without one or a
    request that does not parse (``INVALID_ARGUMENT``), logged within the refusals' budget.
    A plain method or generator runs in ``service.pool`` as ``grpc.aio`` would run it."""
    waits = service.waits

    async def request_of(context):
        request = await waits.request(context)
        if request is None:
            code, text = grpc.StatusCode.DEADLINE_EXCEEDED, (
                f"the request did not arrive within {waits.wait_s:g} s, or "
                f"{waits.limit} calls were waiting for theirs and this one waited longest")
        elif request is grpc.aio.EOF:
            code, text = grpc.StatusCode.INVALID_ARGUMENT, "the call ended without a request"
        elif request is _MALFORMED:
            code, text = grpc.StatusCode.INVALID_ARGUMENT, _UNPARSED
        else:
            return request
        service.refusals.warning("%s from %s refused: %s", name, context.peer(), text)
        await context.abort(code, text)

    if inspect.iscoroutinefunction(behavior):
        async def call(request_iterator, context):
            return await behavior(await request_of(context), context)
    elif inspect.isasyncgenfunction(behavior):
        async def call(request_iterator, context):
            async for response in behavior(await request_of(context), context):
                yield response
    elif inspect.isgeneratorfunction(behavior):
        async def call(request_iterator, context):
            request, held = await request_of(context), _HeldContext(context)
            responses = await asyncio.get_running_loop().run_in_executor(
                service.pool, lambda: list(behavior(request, held)))
            for response in responses:
                yield response
    else:
        async def call(request_iterator, context):
            request = await request_of(context)
            return await asyncio.get_running_loop().run_in_executor(
                service.pool, behavior, request, _HeldContext(context))
    return call


class _Collect:
    """Stands for a server to take the generated handlers of the service."""

    def add_generic_rpc_handlers(self, handlers) -> None:
        (self.handler,) = handlers

    def add_registered_method_handlers(self, *args) -> None:
        pass


def add_to_server(service: AsyncMessagingService, server) -> None:
    """Serve ``service`` on ``server`` as the generated code would, but with every method
    that takes one request reading it itself (:func:`_reading`): a call waits a bounded
    time for its request, and one that does not parse is refused as ``INVALID_ARGUMENT``
    (not an unknown error and a stack trace per request)."""
    collect = _Collect()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(service, collect)
    handlers = {}
    for name, h in collect.handler._method_handlers.items():
        method = name.rpartition("/")[2]
        if h.request_streaming:
            handlers[method] = h
            continue
        field = "stream_unary" if h.unary_unary is not None else "stream_stream"
        handlers[method] = h._replace(
            request_streaming=True, request_deserializer=_lenient(h.request_deserializer),
            unary_unary=None, unary_stream=None,
            **{field: _reading(service, method, h.unary_unary or h.unary_stream)})
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "apache.rocketmq.v2.MessagingService", handlers),))


__all__ = ["AsyncMessagingService", "GroupCommit", "add_to_server"]
