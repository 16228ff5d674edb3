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

import zlib
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as pb

from ..base.errors import (
    InvalidDelayError,
    InvalidMessageError,
    InvalidTopicError,
    LeaderDeposedError,
    MessageTooLargeError,
    NotLeaderError,
    ReplicaAckTimeoutError,
    StoreError,
    TimerFlowControlError,
    TransactionStateError,
    UnknownTopicError,
)
from ..delayed.delivery import DELIVERY_HEADROOM
from ..formats.message import (
    GROUP_MAX_LENGTH,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    RESERVED_PROPERTY_NAMES,
    SYSTEM_PROPERTY_NAMES,
    Message,
    MessageView,
    is_valid_topic_name,
    validate_message,
    validate_msg_id,
    validate_topic,
)

#: The record property holding a FIFO message's group (RocketMQ's ``__SHARDINGKEY``).
PROPERTY_MESSAGE_GROUP = "__SHARDINGKEY"
#: The longest message group the proxy accepts (RocketMQ's limit).
MAX_MESSAGE_GROUP_LENGTH = 64
#: The longest tag and key (a message's properties as a whole are bounded too, by
#: ``max_properties_size_bytes``).
MAX_TAG_LENGTH = 128
MAX_KEY_LENGTH = 128
#: Room left in ``max_properties_size_bytes`` for what the store adds to a client's
#: properties: the id, a transaction's or a timer's bookkeeping, and delivery.
SYSTEM_PROPERTIES_ROOM = 512 + DELIVERY_HEADROOM
#: The longest client id (``x-mq-client-id``): RocketMQ's clients make about 60 characters.
MAX_CLIENT_ID_LENGTH = 256
#: Property names a client may not set: the store's reserved names, the group's property.
_CLIENT_RESERVED = RESERVED_PROPERTY_NAMES | SYSTEM_PROPERTY_NAMES | {PROPERTY_MESSAGE_GROUP}

Code = pb.Code
MessageType = pb.MessageType
# the enums' values as plain ints (a protobuf enum's attribute lookup costs a microsecond)
_NORMAL, _FIFO, _DELAY, _TRANSACTION = (MessageType.NORMAL, MessageType.FIFO,
                                        MessageType.DELAY, MessageType.TRANSACTION)
_GZIP, _IDENTITY, _UNSPECIFIED = (pb.Encoding.GZIP, pb.Encoding.IDENTITY,
                                  pb.Encoding.ENCODING_UNSPECIFIED)
_CRC32 = pb.DigestType.CRC32
#: ``Code.OK`` as a plain int (what a call's entries are compared with)
OK = Code.OK


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


#: zlib's window bits that read a gzip or a zlib stream, whichever the header says.
_GZIP_OR_ZLIB = 32 + 15


def inflate(data: bytes, max_bytes: int) -> bytes:
    """A GZIP (or zlib) body inflated, never holding more than ``max_bytes`` + 1 bytes of
    it: ``MESSAGE_BODY_TOO_LARGE`` as soon as it would grow past ``max_bytes`` (a small body
    may inflate to gigabytes), ``MESSAGE_CORRUPTED`` if it does not inflate.  Concatenated
    gzip members are read one after another, as gzip does."""
    out = bytearray()
    rest = data
    try:
        while True:
            inflater = zlib.decompressobj(_GZIP_OR_ZLIB)
            out += inflater.decompress(rest, max_bytes + 1 - len(out))
            if len(out) > max_bytes:
                raise Refused(Code.MESSAGE_BODY_TOO_LARGE,
                              f"the message body inflates to more than {max_bytes} bytes; "
                              f"allowed: at most {max_bytes} (max_message_size_bytes)")
            if not inflater.eof:
                raise zlib.error("truncated")
            rest = inflater.unused_data
            if not rest:
                return bytes(out)
    except zlib.error:
        raise Refused(Code.MESSAGE_CORRUPTED,
                      "body_encoding is GZIP but the body does not inflate") from None


def _body(msg: pb.Message, max_body_bytes: int) -> bytes:
    body = msg.body
    encoding = msg.system_properties.body_encoding
    if encoding == _GZIP:
        body = inflate(body, max_body_bytes)
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
    if (not tag.strip() or len(tag) > MAX_TAG_LENGTH or "|" in tag or not tag.isprintable()):
        raise Refused(Code.ILLEGAL_MESSAGE_TAG,
                      f"tag {tag[:80]!r}; allowed: 1 to {MAX_TAG_LENGTH} printable characters, "
                      "not blank, without '|'")
    return tag


def _keys(props) -> list[str]:
    keys = list(props.keys)
    for key in keys:
        if not key.strip() or len(key) > MAX_KEY_LENGTH or " " in key or not key.isprintable():
            raise Refused(Code.ILLEGAL_MESSAGE_KEY,
                          f"key {key[:80]!r}; allowed: 1 to {MAX_KEY_LENGTH} printable "
                          "characters without spaces")
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


def check_topic_name(topic: str) -> str:
    """``ILLEGAL_TOPIC`` for a name no user topic may have (the store's rules: characters,
    length, no system topics): every path that names a topic to create or read checks it."""
    try:
        return validate_topic(topic)
    except InvalidTopicError as exc:
        raise Refused(Code.ILLEGAL_TOPIC, str(exc)) from None


def check_group_name(group: str) -> str:
    """``ILLEGAL_CONSUMER_GROUP`` for a group name outside RocketMQ's rules (1 to
    ``GROUP_MAX_LENGTH`` characters of a topic name's set)."""
    if not group:
        raise Refused(Code.ILLEGAL_CONSUMER_GROUP, "the request names no consumer group")
    if len(group) > GROUP_MAX_LENGTH or not is_valid_topic_name(group):
        raise Refused(Code.ILLEGAL_CONSUMER_GROUP,
                      f"consumer group {group[:80]!r}; allowed: 1 to {GROUP_MAX_LENGTH} "
                      "characters of a-z A-Z 0-9 _ - % |")
    return group


def check_client_id(client_id: str) -> str:
    """``CLIENT_ID_REQUIRED`` / ``BAD_REQUEST`` unless ``client_id`` is 1 to
    :data:`MAX_CLIENT_ID_LENGTH` printable ASCII characters."""
    if not client_id:
        raise Refused(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is missing")
    if (len(client_id) > MAX_CLIENT_ID_LENGTH or not client_id.isascii()
            or not client_id.isprintable()):
        raise Refused(Code.BAD_REQUEST, f"x-mq-client-id {client_id[:80]!r}; allowed: 1 to "
                                        f"{MAX_CLIENT_ID_LENGTH} printable ASCII characters")
    return client_id


def incoming(msg: pb.Message, *, max_body_bytes: int, now_ms: int, max_delay_ms: int,
             max_properties_bytes: int) -> Incoming:
    """Check a client's message as RocketMQ's proxy does, and every rule the store applies
    when it is sent (so that a batch is refused whole before anything of it is stored);
    raise :class:`Refused` (or the store's error) if bad."""
    topic = msg.topic.name
    if not topic:
        raise Refused(Code.ILLEGAL_TOPIC, "the message names no topic")
    check_topic_name(topic)
    props = msg.system_properties
    msg_id = props.message_id
    if not msg_id:
        raise Refused(Code.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    validate_msg_id(msg_id)
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
    validate_message(message, max_body_bytes)
    size = (sum(len(k) + len(v) + 2 for k, v in user.items()) + sum(len(k) + 1 for k in keys)
            + len(tag or ""))
    if size > max_properties_bytes - SYSTEM_PROPERTIES_ROOM:
        raise Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                      f"the message's properties, keys and tag are {size} characters; allowed: "
                      f"at most {max_properties_bytes - SYSTEM_PROPERTIES_ROOM} "
                      f"(max_properties_size_bytes less {SYSTEM_PROPERTIES_ROOM} for the "
                      "store's own)")
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
    props = view.properties
    group = props.get(PROPERTY_MESSAGE_GROUP)
    if props:
        out.user_properties.update(props)
        if group is not None:
            del out.user_properties[PROPERTY_MESSAGE_GROUP]
    body = bytes(view.body)
    out.body = body
    sp = out.system_properties
    if view.tags:
        sp.tag = view.tags
    if view.keys:
        sp.keys.extend(view.keys)
    sp.message_id = view.msg_id
    sp.body_digest.type = _CRC32
    sp.body_digest.checksum = body_digest(body)
    sp.body_encoding = _IDENTITY
    if view.transaction_id:
        sp.message_type = _TRANSACTION
    elif group is not None:
        sp.message_type = _FIFO
        sp.message_group = group
    elif view.deliver_timestamp_ms is not None:
        sp.message_type = _DELAY
    else:
        sp.message_type = _NORMAL
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


def status(code: int = Code.OK, text: str = "OK") -> pb.Status:
    """A RocketMQ status (``OK`` by default)."""
    return pb.Status(code=code, message=text)


#: The protocol's status code of each kind of store error, the first that matches.
_ERROR_CODES = (
    (UnknownTopicError, Code.TOPIC_NOT_FOUND),
    (InvalidTopicError, Code.ILLEGAL_TOPIC),
    (MessageTooLargeError, Code.MESSAGE_BODY_TOO_LARGE),
    (InvalidDelayError, Code.ILLEGAL_DELIVERY_TIME),
    (TimerFlowControlError, Code.TOO_MANY_REQUESTS),
    (TransactionStateError, Code.INVALID_TRANSACTION_ID),
    (InvalidMessageError, Code.BAD_REQUEST),
    # appended, not acknowledged (see the docs)
    ((ReplicaAckTimeoutError, LeaderDeposedError), Code.SLAVE_PERSISTENCE_TIMEOUT),
    (NotLeaderError, Code.HA_NOT_AVAILABLE),  # (nothing stored: the clients retry, elsewhere)
)


def store_error_code(exc: StoreError) -> int:
    """The protocol's status code for a store error."""
    return next((code for kinds, code in _ERROR_CODES if isinstance(exc, kinds)),
                Code.INTERNAL_SERVER_ERROR)
