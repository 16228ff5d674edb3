"""The producers' calls of the gRPC face (``SendMessage``, ``EndTransaction``,
``RecallMessage``) and the transaction check-back: normal, FIFO, delay and transactional
half messages stored through the members' producers (a FIFO message on the queue its message
group hashes to, the others on the members in turn), a delay message's signed recall handle
(:mod:`.handles`), the ends of transactions looked up and appended together per member, and
the questions about open transactions put on their producers' telemetry streams.

:class:`ProducerCalls` is a part of :class:`~store.proxy.grpc_service.MessagingService`
(a mixin: it uses the service's members, sessions, access checks, guards and lead check).
"""

from __future__ import annotations

import base64
import binascii
import random

import numpy as np
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from ..base.errors import StoreError
from ..formats.message import (
    TIMER_TOPIC,
    LocalTransactionState,
    sharding_queue,
)
from ..transaction.check_views import CheckViews
from .access import Account
from .convert import (
    Code,
    Incoming,
    MessageType,
    Refused,
    incoming,
    outgoing,
    status,
)
from .handles import HANDLE_MAX_LENGTH, Signer
from .members import PRODUCER_GROUP

_STATE = {pb.TransactionResolution.COMMIT: LocalTransactionState.COMMIT_MESSAGE,
          pb.TransactionResolution.ROLLBACK: LocalTransactionState.ROLLBACK_MESSAGE}
_OK = status()
_TRANSACTION, _DELAY = MessageType.TRANSACTION, MessageType.DELAY


def recall_handle(signer: Signer, topic: str, msg_id: str, stored_queue_offset: int,
                  member: int = 0) -> str:
    """The handle a client recalls a delay message with: its topic, id, where it waits (the
    timer queue offset) and in which member of a group, signed (:mod:`.handles`)."""
    text = f"rmq2 {topic} {msg_id} {stored_queue_offset} {member}"
    return f"{base64.urlsafe_b64encode(text.encode()).decode()}.{signer.tag(text)}"


def parse_recall_handle(signer: Signer, text: str,
                        members: int = 1) -> tuple[str, str, int, int]:
    """``(topic, msg_id, stored queue offset, member)`` of a recall handle this server
    signed; ``BAD_REQUEST`` for any other."""
    try:
        if len(text) > HANDLE_MAX_LENGTH:
            raise ValueError
        encoded, _, tag = text.partition(".")
        plain = base64.urlsafe_b64decode(encoded.encode()).decode()
        if not signer.valid(tag, plain):
            raise ValueError
        prefix, topic, msg_id, index, member = plain.split(" ")
        if prefix != "rmq2" or not 0 <= int(member) < members:
            raise ValueError
        return topic, msg_id, int(index), int(member)
    except (ValueError, UnicodeError, binascii.Error):
        raise Refused(Code.BAD_REQUEST, "the recall handle is not one this server gave") from None


class ProducerCalls:
    """The producers' calls and the transaction check-back of
    :class:`~store.proxy.grpc_service.MessagingService`."""

    def _send_one(self, m: Incoming) -> rpc.SendResultEntry:
        if m.kind == _TRANSACTION:
            r = self._next()[1].transactions.send_in_transaction(m.message, msg_id=m.msg_id)
            return rpc.SendResultEntry(status=_OK, message_id=r.msg_id,
                                       transaction_id=r.transaction_id, offset=r.queue_offset)
        if m.kind == _DELAY:
            i, member = self._next()
            r = member.producer.send(m.message, deliver_at_ms=m.deliver_at_ms, msg_id=m.msg_id)
            handle = (recall_handle(self.signer, r.topic, r.msg_id, r.stored_queue_offset, i)
                      if r.stored_topic == TIMER_TOPIC else "")
            return rpc.SendResultEntry(status=_OK, message_id=r.msg_id,
                                       offset=r.queue_offset, recall_handle=handle)
        if m.message_group is not None:
            route = self._route(m.message.topic)
            i, q = route[sharding_queue(m.message_group, len(route))]
            r = self.members[i].producer.send(m.message, queue_id=q, msg_id=m.msg_id)
        else:
            r = self._next()[1].producer.send(m.message, msg_id=m.msg_id)
        return rpc.SendResultEntry(status=_OK, message_id=r.msg_id, offset=r.queue_offset)

    def checked_sends(self, request, context) -> list[Incoming]:
        """A send request's messages, checked (the account's right, every rule of the
        protocol and the store): a bad one refuses the whole request before anything of it
        is stored."""
        account = self._account(context)
        if not request.messages:
            raise Refused(Code.BAD_REQUEST, "the request carries no message")
        topics = {m.topic.name for m in request.messages}
        if len(topics) > 1:
            raise Refused(Code.BAD_REQUEST, f"a batch must have one topic; got "
                                            f"{sorted(topics)}")
        topic = next(iter(topics))
        account.check_topic(topic, "PUB")
        now = self.store.now_ms()
        cfg = self.store.config
        return [incoming(message, max_body_bytes=cfg.max_message_size_bytes, now_ms=now,
                         max_delay_ms=cfg.timer_max_delay_ms,
                         max_properties_bytes=cfg.max_properties_size_bytes)
                for message in request.messages]

    def send_checked(self, checked: list[Incoming]) -> list[rpc.SendResultEntry]:
        """Store checked messages (:meth:`checked_sends`); their result entries."""
        with self.leader_write("SendMessage"):
            return [self._send_one(m) for m in checked]

    def SendMessage(self, request, context):
        def body():
            entries = self.send_checked(self.checked_sends(request, context))
            self.wake_receivers()
            return rpc.SendMessageResponse(status=_OK, entries=entries)
        return self._guard(context, "SendMessage",
                           lambda s: rpc.SendMessageResponse(status=s), body)

    def checked_end(self, request, context) -> tuple[Account, str, LocalTransactionState, bool]:
        """An ``EndTransaction`` request's account, transaction id, state and whether it
        answers a check, checked (not yet whether the transaction is this endpoint's)."""
        account = self._account(context)
        state = _STATE.get(request.resolution)
        if state is None:
            raise Refused(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        tid = request.transaction_id or request.message_id
        if not tid:
            raise Refused(Code.INVALID_TRANSACTION_ID, "no transaction_id")
        if len(tid) > HANDLE_MAX_LENGTH:
            raise Refused(Code.INVALID_TRANSACTION_ID,
                          f"transaction id of {len(tid)} characters is not one of this store's")
        return account, tid, state, request.source == pb.TransactionSource.SOURCE_SERVER_CHECK

    def end_checked(self, ends: list) -> list[Exception | None]:
        """End the transactions of checked requests (:meth:`checked_end`) together: one
        lookup of their origins and one append per member and kind; per request ``None``
        or its failure (one request's failure is its own)."""
        self.check_leading("EndTransaction")  # (before the origins: a follower may lack them)
        results: list[Exception | None] = [None] * len(ends)
        todo: dict[tuple[int, bool], list[int]] = {}
        origins = [m.store.transaction_origins([tid for _, tid, _, _ in ends])
                   for m in self.members]
        for k, (account, tid, _, from_check) in enumerate(ends):
            found = [(i, o[0]) for i, member_origins in enumerate(origins)
                     if (o := member_origins[k]) is not None and o[1] == PRODUCER_GROUP]
            if not found:
                results[k] = Refused(Code.INVALID_TRANSACTION_ID,
                                     f"transaction {tid[:80]!r} is not one sent through this "
                                     "endpoint")
                continue
            i, topic = found[0]
            try:  # the right is checked on the topic the half message was sent to, not the
                account.check_topic(topic, "PUB")  # one the request names
            except Refused as exc:
                results[k] = exc
                continue
            todo.setdefault((i, from_check), []).append(k)
        committed = False
        with self.leader_write("EndTransaction"):
            self._end_members(ends, todo, results)
            committed = any(ends[k][2] is LocalTransactionState.COMMIT_MESSAGE
                            for ks in todo.values() for k in ks)
        if committed:
            self.wake_receivers()
        return results

    def _end_members(self, ends: list, todo: dict, results: list) -> None:
        for (i, from_check), ks in todo.items():
            store = self.members[i].store
            try:
                store.end_transactions([(ends[k][1], ends[k][2]) for k in ks],
                                       from_check=from_check)
            except StoreError:
                for k in ks:  # one by one: each request gets its own failure
                    try:
                        store.end_transactions([(ends[k][1], ends[k][2])],
                                               from_check=from_check)
                    except StoreError as exc:
                        results[k] = exc

    def EndTransaction(self, request, context):
        def body():
            (failure,) = self.end_checked([self.checked_end(request, context)])
            if failure is not None:
                raise failure
            return rpc.EndTransactionResponse(status=status())
        return self._guard(context, "EndTransaction",
                           lambda s: rpc.EndTransactionResponse(status=s), body)

    def RecallMessage(self, request, context):
        def body():
            self.check_leading("RecallMessage")
            account = self._account(context)
            topic, msg_id, index, i = parse_recall_handle(self.signer, request.recall_handle,
                                                          len(self.members))
            if topic != request.topic.name:
                raise Refused(Code.BAD_REQUEST, f"the recall handle is for topic {topic!r}, not "
                                                f"{request.topic.name!r}")
            account.check_topic(topic, "PUB")
            with self.leader_write("RecallMessage"):
                cancelled = self.members[i].producer.cancel(topic, msg_id,
                                                            stored_queue_offset=index)
            if not cancelled:
                raise Refused(Code.NOT_FOUND, f"no pending delay message {msg_id} on topic "
                                              f"{topic!r} (delivered, recalled, or unknown)")
            return rpc.RecallMessageResponse(status=status(), message_id=msg_id)
        return self._guard(context, "RecallMessage",
                           lambda s: rpc.RecallMessageResponse(status=s), body)

    def ask(self, views) -> int:
        """Ask producers about the open transactions ``views`` of this endpoint's producer
        group (``RecoverOrphanedTransactionCommand`` on a producer's telemetry stream, one
        producer of the topic chosen at random); returns how many were asked.  Their answers
        come back as ``EndTransaction`` calls."""
        asked = 0
        if isinstance(views, CheckViews):  # pick the endpoint's halves of topics with a
            views = views.select(self._askable(views))  # producer, as columns: no record read
        for view in views:
            if getattr(view, "producer_group", None) != PRODUCER_GROUP:
                continue
            producers = self.producers_of(view.topic)
            if not producers:
                continue
            command = rpc.TelemetryCommand(
                recover_orphaned_transaction_command=rpc.RecoverOrphanedTransactionCommand(
                    message=outgoing(view), transaction_id=view.transaction_id))
            random.choice(producers).outbox.put(command)
            asked += 1
        return asked

    def _askable(self, views: CheckViews) -> np.ndarray:
        """Which of a round's views are this endpoint's halves of a topic some connected
        producer publishes (the others are never read: a round may hold millions)."""
        with self._sessions_lock:
            live = {t for s in self._sessions.values()
                    if s.open and s.client_type == pb.ClientType.PRODUCER for t in s.topics}
        ours = np.array([g == PRODUCER_GROUP for g in views.groups] + [False], bool)
        published = np.array([t in live for t in views.topics] + [False], bool)
        return ours[views.group_ids] & published[views.topic_ids]

    def check_round(self) -> int:
        """One check round in every member whose questions go to this endpoint's producers
        (the other groups' halves are left to their own resolvers); returns how many were
        asked."""
        return sum(self.ask(m.store.prepare_transaction_checks().checks) for m in self.members)
