"""Messages between the ``apache.rocketmq.v2`` protocol and the store.

A client's :class:`Message` (protobuf) becomes an :class:`Incoming`: the store message, its
id as the client made it, its kind, and how to send it (the FIFO group as the sharding key,
the delivery time for the timer wheel, the transaction's immunity).  Every rule the proxy
applies is checked here, each refusal a :class:`Refused` carrying the protocol's status code;
the store's own checks (topic names, sizes, reserved names) run again when it is sent.

A stored message (:class:`~store.MessageView`) becomes the protobuf message a consumer
receives: user properties, tag, keys, id, CRC32 body digest (the clients check it), the
kind, born / store / delivery times, queue and offset, and the receipt handle of this
delivery.

The FIFO message group is kept in the record as ``__SHARDINGKEY``, the property RocketMQ
keeps it in; the orphaned-transaction recovery duration as ``CHECK_IMMUNITY_TIME_IN_SECONDS``.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as pb

from ..message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    RESERVED_PROPERTY_NAMES,
    SYSTEM_PROPERTY_NAMES,
    Message,
    MessageView,
)

#: The record property holding a FIFO message's group (RocketMQ's ``__SHARDINGKEY``).
PROPERTY_MESSAGE_GROUP = "__SHARDINGKEY"
#: The longest message group, tag and key the proxy accepts (RocketMQ's limits).
MAX_MESSAGE_GROUP_LENGTH = 64
#: Property names a client may not set: the store's reserved names, the group's property.
_CLIENT_RESERVED = RESERVED_PROPERTY_NAMES | SYSTEM_PROPERTY_NAMES | {PROPERTY_MESSAGE_GROUP}

Code = pb.Code
MessageType = pb.MessageType
# the enums' values as plain ints (a protobuf enum's attribute lookup costs a microsecond)
_NORMAL, _FIFO, _DELAY, _TRANSACTION = (MessageType.NORMAL, MessageType.FIFO,
                                        MessageType.DELAY, MessageType.TRANSACTION)
_GZIP, _IDENTITY, _UNSPECIFIED = (pb.Encoding.GZIP, pb.Encoding.IDENTITY,
                                  pb.Encoding.ENCODING_UNSPECIFIED)


class Refused(Exception):
    """A request the protocol answers with a status ``code`` (not ``OK``) and ``text``."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


@dataclass(frozen=True, slots=True)
class Incoming:
    """A client's message, checked, as the store sends it."""

    message: Message
    msg_id: str
    kind: int                       # a ``MessageType`` value
    message_group: str | None       # FIFO: the sharding key
    deliver_at_ms: int | None       # DELAY: the timer wheel's due time


#: Seconds beyond this (the year 5138) are epoch ms put in the seconds field: what
#: ``rocketmq-python-client`` 5.1 sends as a delay message's ``delivery_timestamp``.
SECONDS_LIMIT = 100_000_000_000


def timestamp_ms(ts) -> int:
    """A protobuf ``Timestamp`` as epoch ms (an ms count in ``seconds`` read as ms)."""
    if ts.seconds > SECONDS_LIMIT:
        return ts.seconds
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def duration_ms(d) -> int:
    """A protobuf ``Duration`` as ms."""
    return d.seconds * 1000 + d.nanos // 1_000_000


def set_timestamp_ms(ts, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(int(ms), 1000)
    ts.nanos *= 1_000_000


def set_duration_ms(d, ms: int) -> None:
    d.seconds, d.nanos = divmod(int(ms), 1000)
    d.nanos *= 1_000_000


def _body(msg: pb.Message, max_body_bytes: int) -> bytes:
    body = msg.body
    encoding = msg.system_properties.body_encoding
    if encoding == _GZIP:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error):
            try:
                body = zlib.decompress(body)
            except zlib.error:
                raise Refused(Code.MESSAGE_CORRUPTED,
                              "body_encoding is GZIP but the body does not decompress") from None
    elif encoding != _IDENTITY and encoding != _UNSPECIFIED:
        raise Refused(Code.BAD_REQUEST, f"body_encoding {encoding}; allowed: IDENTITY or GZIP")
    if not body:
        raise Refused(Code.MESSAGE_BODY_EMPTY, "the message body is empty; allowed: 1 byte or more")
    if len(body) > max_body_bytes:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE,
                      f"the message body is {len(body)} bytes; allowed: at most "
                      f"{max_body_bytes} (max_message_size_bytes)")
    return body


def _tag(props) -> str | None:
    if not props.HasField("tag"):
        return None
    tag = props.tag
    if not tag.strip() or "|" in tag or "\x01" in tag or "\x02" in tag:
        raise Refused(Code.ILLEGAL_MESSAGE_TAG,
                      f"tag {tag!r}; allowed: a non-blank tag without '|' or control characters")
    return tag


def _keys(props) -> list[str]:
    keys = list(props.keys)
    for key in keys:
        if not key.strip() or " " in key or "\x01" in key or "\x02" in key:
            raise Refused(Code.ILLEGAL_MESSAGE_KEY,
                          f"key {key!r}; allowed: non-blank keys without spaces or control "
                          "characters")
    return keys


def _properties(msg: pb.Message) -> dict[str, str]:
    props = dict(msg.user_properties)
    for name, value in props.items():
        if (not name or name in _CLIENT_RESERVED or name.startswith("__RMQ")
                or any(c in name for c in "\x01\x02")):
            raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          f"user property {name!r} is empty or reserved by RocketMQ; allowed: "
                          "other names")
        if "\x01" in value or "\x02" in value:
            raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          f"user property {name!r} has a control character (0x01/0x02) in "
                          "its value")
    return props


def incoming(msg: pb.Message, *, max_body_bytes: int, now_ms: int,
             max_delay_ms: int) -> Incoming:
    """Check a client's message as RocketMQ's proxy does; raise :class:`Refused` if bad."""
    topic = msg.topic.name
    if not topic:
        raise Refused(Code.ILLEGAL_TOPIC, "the message names no topic")
    props = msg.system_properties
    msg_id = props.message_id
    if not msg_id:
        raise Refused(Code.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    body = _body(msg, max_body_bytes)
    tag = _tag(props)
    keys = _keys(props)
    user = _properties(msg)
    kind = props.message_type or _NORMAL
    group = props.message_group if props.HasField("message_group") else None
    deliver_at = (timestamp_ms(props.delivery_timestamp)
                  if props.HasField("delivery_timestamp") else None)
    if kind == _FIFO:
        if not group:
            raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "a FIFO message needs a message_group")
    elif group is not None:
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                      f"message_group is set on a {MessageType.Name(kind)} message; allowed: "
                      "only on FIFO messages")
    if group is not None and (len(group) > MAX_MESSAGE_GROUP_LENGTH or not group.strip()
                              or "\x01" in group or "\x02" in group):
        raise Refused(Code.ILLEGAL_MESSAGE_GROUP,
                      f"message_group {group[:80]!r}; allowed: 1 to "
                      f"{MAX_MESSAGE_GROUP_LENGTH} characters, not blank")
    if kind == _DELAY:
        if deliver_at is None:
            raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "a DELAY message needs a delivery_timestamp")
        if deliver_at - now_ms > max_delay_ms:
            raise Refused(Code.ILLEGAL_DELIVERY_TIME,
                          f"delivery_timestamp is {deliver_at - now_ms} ms ahead; allowed: at "
                          f"most {max_delay_ms} ms (timer_max_delay_ms)")
    elif deliver_at is not None:
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                      f"delivery_timestamp is set on a {MessageType.Name(kind)} message; "
                      "allowed: only on DELAY messages")
    if kind == _TRANSACTION and props.HasField(
            "orphaned_transaction_recovery_duration"):
        seconds = props.orphaned_transaction_recovery_duration.seconds
        if seconds > 0:
            user[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
    if kind != _NORMAL and kind != _FIFO and kind != _DELAY and kind != _TRANSACTION:
        raise Refused(Code.UNSUPPORTED,
                      f"message type {MessageType.Name(kind)}; allowed: NORMAL, FIFO, DELAY, "
                      "TRANSACTION")
    if group is not None:
        user[PROPERTY_MESSAGE_GROUP] = group
    message = Message(topic=topic, body=body, tags=tag, keys=keys or None, properties=user)
    return Incoming(message, msg_id, kind, group, deliver_at)


def body_digest(body: bytes) -> str:
    """The CRC32 digest the clients check: 8 upper-case hex digits."""
    return format(zlib.crc32(body) & 0xFFFFFFFF, "08X")


def outgoing(view: MessageView, *, receipt_handle: str | None = None,
             invisible_ms: int | None = None, attempt: int | None = None,
             store_host: str = "") -> pb.Message:
    """The protobuf message a consumer (or a transaction checker) receives for ``view``."""
    out = pb.Message()
    out.topic.name = view.topic
    props = dict(view.properties)
    group = props.pop(PROPERTY_MESSAGE_GROUP, None)
    for name, value in props.items():
        out.user_properties[name] = value
    body = bytes(view.body)
    out.body = body
    sp = out.system_properties
    if view.tags:
        sp.tag = view.tags
    sp.keys.extend(view.keys)
    sp.message_id = view.msg_id
    sp.body_digest.type = pb.DigestType.CRC32
    sp.body_digest.checksum = body_digest(body)
    sp.body_encoding = pb.Encoding.IDENTITY
    if view.transaction_id:
        sp.message_type = MessageType.TRANSACTION
    elif group is not None:
        sp.message_type = MessageType.FIFO
        sp.message_group = group
    elif view.deliver_timestamp_ms is not None:
        sp.message_type = MessageType.DELAY
    else:
        sp.message_type = MessageType.NORMAL
    set_timestamp_ms(sp.born_timestamp, view.born_timestamp_ms)
    sp.born_host = view.system_properties.get("__BORNHOST", "")
    set_timestamp_ms(sp.store_timestamp, view.store_timestamp_ms)
    sp.store_host = store_host
    if view.deliver_timestamp_ms is not None:
        set_timestamp_ms(sp.delivery_timestamp, view.deliver_timestamp_ms)
    sp.queue_id = view.queue_id
    sp.queue_offset = view.queue_offset
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        set_duration_ms(sp.invisible_duration, invisible_ms)
    if attempt is not None:
        sp.delivery_attempt = attempt
    return out
