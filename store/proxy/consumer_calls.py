"""The consumer calls of the gRPC face (``QueryAssignment``, ``ReceiveMessage``,
``AckMessage``, ``ChangeInvisibleDuration``, ``ForwardMessageToDeadLetterQueue``): a consumer
group's hand-outs over the members' :class:`~store.proxy.consumers.ConsumerGroups`, with
receipt handles that name the member and are signed for the account, group and topic
(:mod:`.handles`), and long polling within the endpoint's bounds
(:class:`~store.proxy.grpc_limits.HeldCalls`).

:class:`ConsumerCalls` is a part of :class:`~store.proxy.grpc_service.MessagingService`
(a mixin: it uses the service's members, access checks, guards and lead check).
"""

from __future__ import annotations

import logging
import time

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from ..base.errors import StoreError
from ..formats.message import MessageView
from .access import Account
from .consumers import Delivery, tag_filter
from .convert import (
    Code,
    Refused,
    check_group_name,
    check_topic_name,
    duration_ms,
    outgoing,
    status,
    store_error_code,
)
from .follower_calls import forwarded_fifo
from .grpc_limits import peer_host, vouched_peer
from .handles import HANDLE_MAX_LENGTH
from .members import Member

log = logging.getLogger("store.proxy")

#: What the endpoint tells consumers (RocketMQ's proxy defaults).
LONG_POLLING_DEFAULT_MS = 20_000
LONG_POLLING_MAX_MS = 30_000
INVISIBLE_MIN_MS = 1_000
INVISIBLE_MAX_MS = 12 * 3600_000
RECEIVE_BATCH_MAX = 32
_OK = status()
#: (account, group, topic) triples whose names, rights and topic were checked, remembered
#: (forgotten all at once past this many)
CONSUMERS_CHECKED = 4096
#: How often a long-polling receive looks again (ms); a send through this endpoint wakes it.
POLL_INTERVAL_MS = 100


class ConsumerCalls:
    """The consumer groups' calls of :class:`~store.proxy.grpc_service.MessagingService`."""

    def _consumer(self, context, group: str, topic: str) -> Account:
        # (a consumer group's hand-outs and leases are the leader's: see follower_calls)
        self.check_leading("a consumer group's call")
        account = self._account(context)
        key = (account.access_key, group, topic)
        if self._consumers_checked.get(key) is account:  # (every ack asks the same again)
            return account
        check_group_name(group)
        account.check_group(group)
        check_topic_name(topic)
        account.check_topic(topic, "SUB")
        if not self._exists(topic):
            raise Refused(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist in this store "
                                                "(a send or a route query creates it)")
        if len(self._consumers_checked) >= CONSUMERS_CHECKED:
            self._consumers_checked.clear()
        self._consumers_checked[key] = account  # (an account's rights never change)
        return account

    def QueryAssignment(self, request, context):
        def body():
            self._consumer(context, request.group.name, request.topic.name)
            mq = self._queue(request.topic.name, -1, self._endpoints(request.endpoints))
            return rpc.QueryAssignmentResponse(status=status(),
                                               assignments=[pb.Assignment(message_queue=mq)])
        return self._guard(context, "QueryAssignment",
                           lambda s: rpc.QueryAssignmentResponse(status=s), body)

    def _fifo(self, group: str) -> bool:
        with self._sessions_lock:
            return any(s.fifo for s in self._sessions.values() if s.group == group)

    def ReceiveMessage(self, request, context):
        try:
            deliveries, _ = self._receive(request, context)
        except Refused as exc:
            self._refused("ReceiveMessage", context, exc)
            yield rpc.ReceiveMessageResponse(status=status(exc.code, exc.text))
            return
        except StoreError as exc:
            yield rpc.ReceiveMessageResponse(status=status(store_error_code(exc),
                                                           self._text(exc)))
            return
        yield from self.receive_responses(deliveries)

    def receive_responses(self, deliveries: list[Delivery]):
        """The responses a receive streams for ``deliveries``."""
        if not deliveries:
            yield rpc.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND,
                                                           "no new message"))
            return
        yield rpc.ReceiveMessageResponse(status=status())
        host, port = self.address
        for d in deliveries:
            yield rpc.ReceiveMessageResponse(message=outgoing(
                d.view, receipt_handle=d.handle, invisible_ms=d.invisible_ms, attempt=d.attempt,
                store_host=f"{host}:{port}"))
        ts = rpc.ReceiveMessageResponse()
        ts.delivery_timestamp.GetCurrentTime()
        yield ts

    def _receive(self, request, context, wait: bool = True):
        """A receive's deliveries and invisible duration, long polling for them within the
        bounds; with ``wait`` false, ``None`` instead of a long poll (the caller waits
        elsewhere: :class:`~store.proxy.aio_calls.AsyncMessagingService` answers a receive
        that finds messages on its event loop, with no hand-off to a pool thread)."""
        group, topic = request.group.name, request.message_queue.topic.name
        account = self._consumer(context, group, topic)
        batch = request.batch_size or RECEIVE_BATCH_MAX
        if batch < 1 or batch > RECEIVE_BATCH_MAX:
            raise Refused(Code.BAD_REQUEST, f"batch_size {batch}; allowed: 1 to "
                                            f"{RECEIVE_BATCH_MAX}")
        invisible = (duration_ms(request.invisible_duration)
                     if request.HasField("invisible_duration") else 30_000)
        if not INVISIBLE_MIN_MS <= invisible <= INVISIBLE_MAX_MS:
            raise Refused(Code.ILLEGAL_INVISIBLE_TIME,
                          f"invisible_duration {invisible} ms; allowed: {INVISIBLE_MIN_MS} to "
                          f"{INVISIBLE_MAX_MS} ms")
        polling = (duration_ms(request.long_polling_timeout)
                   if request.HasField("long_polling_timeout") else LONG_POLLING_DEFAULT_MS)
        if polling < 0 or polling > LONG_POLLING_MAX_MS:
            raise Refused(Code.ILLEGAL_POLLING_TIME,
                          f"long_polling_timeout {polling} ms; allowed: 0 to "
                          f"{LONG_POLLING_MAX_MS} ms")
        expr = request.filter_expression
        if expr.type == pb.FilterType.SQL:
            raise Refused(Code.ILLEGAL_FILTER_EXPRESSION,
                          "SQL92 filters are not supported here; allowed: TAG filters")
        tags = tag_filter(expr.expression)
        fifo = self._fifo(group) or forwarded_fifo(context)  # (a follower's sessions')
        deliveries = self._receive_members(account, group, topic, batch, invisible, tags, fifo)
        if deliveries or polling == 0:
            return deliveries, invisible
        if not wait:
            return None
        held = self.held.acquire(self._client(context), account.access_key,
                                 self._held_peer(context))
        if held is None:  # beyond the bounds: answered now, no long poll
            return deliveries, invisible
        if held.pushed_one_out:
            self.wake_receivers()  # (the call pushed out answers now)
        try:
            deadline = time.monotonic() + polling / 1000
            while True:
                left = deadline - time.monotonic()
                if (left <= 0 or not context.is_active() or self._closing.is_set()
                        or held.pushed_out):
                    return deliveries, invisible
                with self._arrived:
                    self._waiting += 1
                    try:
                        self._arrived.wait(min(left, POLL_INTERVAL_MS / 1000))
                    finally:
                        self._waiting -= 1
                deliveries = self._receive_members(account, group, topic, batch, invisible,
                                                   tags, fifo)
                if deliveries:
                    return deliveries, invisible
        finally:
            self.held.release(held)

    def _held_peer(self, context) -> str | None:
        """The peer address a held call counts under: the client's (vouched for by a worker
        process passing the call on, else the call's own); ``None`` (not counted per
        address) for a call a replica of the set passed on, which carries the calls of
        all its clients (they count per client id and account)."""
        peer = vouched_peer("ReceiveMessage", dict(context.invocation_metadata()), self.signer)
        if peer is not None:
            return peer
        peer = peer_host(context.peer())
        routes = self.routes
        if routes is not None and any(a.host == peer for a in routes.addresses):
            return None
        return peer

    def _handle(self, account: Account, group: str, topic: str, i: int, inner: str) -> str:
        """A receipt handle naming member ``i``, signed for the account, group and topic."""
        text = f"{i}:{inner}"
        return f"{text}:{self.signer.tag(text, account.access_key, group, topic)}"

    def _receive_members(self, account: Account, group: str, topic: str, batch: int,
                         invisible: int, tags, fifo: bool) -> list[Delivery]:
        """Up to ``batch`` hand-outs from the members, starting at the next one in turn;
        their handles name the member."""
        n = len(self.members)
        start = self._next()[0]
        out: list[Delivery] = []
        for k in range(n):
            i = (start + k) % n
            member = self.members[i]
            got = member.groups.receive(
                group, topic, batch=batch - len(out), invisible_ms=invisible, tags=tags,
                fifo=fifo, dead_letter=lambda v, m=member: self._dead_letter(m, group, v))
            out += [Delivery(d.view, self._handle(account, group, topic, i, d.handle),
                             d.attempt, d.invisible_ms) for d in got]
            if len(out) >= batch:
                break
        return out

    def _held(self, account: Account, group: str, topic: str,
              text: str) -> tuple[int, Member, str]:
        """The member a receipt handle names (its position and itself) and the member's own
        handle; ``INVALID_RECEIPT_HANDLE`` unless this server gave it to ``account`` for
        ``group`` and ``topic``."""
        signed, _, tag = text.rpartition(":")
        i, sep, inner = signed.partition(":")
        if (len(text) > HANDLE_MAX_LENGTH or not sep or not i.isdigit()
                or int(i) >= len(self.members)
                or not self.signer.valid(tag, signed, account.access_key, group, topic)):
            raise Refused(Code.INVALID_RECEIPT_HANDLE,
                          f"receipt handle {text[:80]!r} is not one this server gave this "
                          "account for this group and topic")
        return int(i), self.members[int(i)], inner

    def _dead_letter(self, member: Member, group: str, view: MessageView) -> None:
        """Store ``view`` in the group's dead-letter topic (RocketMQ's ``%DLQ%<group>``), in
        the member that held it."""
        from ..formats.message import Message

        with self.leader_write("dead-lettering"):
            member.producer.send(Message(topic=f"%DLQ%{group}", body=bytes(view.body),
                                         tags=view.tags, keys=list(view.keys) or None,
                                         properties=dict(view.properties)),
                                 msg_id=view.msg_id)
        log.info("message %s of %s moved to %%DLQ%%%s after %d hand-outs", view.msg_id,
                 view.topic, group, member.groups.max_attempts)

    def AckMessage(self, request, context):
        def body():
            group, topic = request.group.name, request.topic.name
            account = self._consumer(context, group, topic)
            entries = []
            failed = []
            for e in request.entries:
                try:
                    _, member, inner = self._held(account, group, topic, e.receipt_handle)
                    member.groups.ack(group, topic, inner)
                    st = _OK  # (copied into the entry)
                except Refused as exc:
                    st = status(exc.code, exc.text)
                    failed.append(st)
                entries.append(rpc.AckMessageResultEntry(message_id=e.message_id,
                                                         receipt_handle=e.receipt_handle,
                                                         status=st))
            top = _OK if not failed else (
                failed[0] if len(failed) == len(entries)
                else status(Code.MULTIPLE_RESULTS, "some entries failed"))
            return rpc.AckMessageResponse(status=top, entries=entries)
        return self._guard(context, "AckMessage", lambda s: rpc.AckMessageResponse(status=s),
                           body)

    def ChangeInvisibleDuration(self, request, context):
        def body():
            group, topic = request.group.name, request.topic.name
            account = self._consumer(context, group, topic)
            invisible = duration_ms(request.invisible_duration)
            if not 0 <= invisible <= INVISIBLE_MAX_MS:
                raise Refused(Code.ILLEGAL_INVISIBLE_TIME,
                              f"invisible_duration {invisible} ms; allowed: 0 to "
                              f"{INVISIBLE_MAX_MS} ms")
            i, member, inner = self._held(account, group, topic, request.receipt_handle)
            handle = member.groups.change_invisible(group, topic, inner, invisible)
            return rpc.ChangeInvisibleDurationResponse(
                status=status(), receipt_handle=self._handle(account, group, topic, i, handle))
        return self._guard(context, "ChangeInvisibleDuration",
                           lambda s: rpc.ChangeInvisibleDurationResponse(status=s), body)

    def ForwardMessageToDeadLetterQueue(self, request, context):
        def body():
            group, topic = request.group.name, request.topic.name
            account = self._consumer(context, group, topic)
            _, member, inner = self._held(account, group, topic, request.receipt_handle)
            view = member.groups.view_of(group, topic, inner)
            if view is not None:
                self._dead_letter(member, group, view)
            member.groups.ack(group, topic, inner)
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=status())
        return self._guard(context, "ForwardMessageToDeadLetterQueue",
                           lambda s: rpc.ForwardMessageToDeadLetterQueueResponse(status=s), body)
