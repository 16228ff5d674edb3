"""Messages as users build them and read them back, and RocketMQ's naming rules.

Property names follow RocketMQ's ``MessageConst``; system properties are kept in the stored
record (as RocketMQ does) but hidden from :class:`MessageView.properties`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, fields
from typing import Mapping, Protocol

from .record_codec import (
    PROPERTIES_SEPARATOR,
    PROPERTY_SEPARATOR,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    Record,
)
from ..base.errors import (InvalidMessageError, InvalidScheduleError, InvalidTopicError,
                     MessageTooLargeError)

# --- property keys (RocketMQ MessageConst) -------------------------------------------------
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
#: Our own: the ms at which a delayed message was due (kept on the delivered record).
PROPERTY_DELIVER_MS = "__RMQ_DELIVER_MS"
#: Our own: CommitLog offset of the system-topic record a delivered (or rolled) record came
#: from; lets the delay-level and timer services re-derive delivery progress after a crash.
PROPERTY_DELAY_ORIGIN = "__RMQ_DELAY_ORIGIN"
#: The delay key of a keyed timer message (``producer.send(..., key=K)``): it replaces the
#: pending message sent before with the same key, and its delivered copy keeps it.
PROPERTY_DELAY_KEY = "RMQ_DELAY_KEY"
#: On a keys-cancel record (never delivered): how many keys its body cancels.
PROPERTY_DELAY_KEYS_CANCELLED = "__RMQ_DELAY_KEYS_CANCELLED"
#: The sink half a record belongs to (its sink key; :mod:`store.sink.staged_format`).
PROPERTY_SINK = "__RMQ_SINK"
#: Transaction ids of sink halves start with this, then the sink key.
SINK_TX_PREFIX = "SINK"

#: Names users may not set (RocketMQ's reserved set, minus the keys its client allows).
RESERVED_PROPERTY_NAMES = frozenset(
    """KEYS TAGS WAIT DELAY RETRY_TOPIC REAL_TOPIC REAL_QID TRAN_MSG PGROUP MIN_OFFSET
    MAX_OFFSET BUYER_ID ORIGIN_MESSAGE_ID TRANSFER_FLAG CORRECTION_FLAG MQ2_FLAG
    RECONSUME_TIME MSG_REGION TRACE_ON UNIQ_KEY EXTEND_UNIQ_INFO MAX_RECONSUME_TIMES
    CONSUME_START_TIME TRAN_PREPARED_QUEUE_OFFSET DUP_INFO INSTANCE_ID CORRELATION_ID
    REPLY_TO_CLIENT TTL ARRIVE_TIME PUSH_REPLY_TIME CLUSTER MSG_TYPE POP_CK POP_CK_OFFSET
    1ST_POP_TIME TIMER_DELIVER_MS TIMER_DELAY_SEC TIMER_DELAY_MS TIMER_OUT_MS
    TIMER_ENQUEUE_MS TIMER_DEQUEUE_MS TIMER_ROLL_TIMES TIMER_DEL_UNIQKEY TIMER_DELAY_LEVEL
    DLQ_ORIGIN_TOPIC DLQ_ORIGIN_MESSAGE_ID __BORNHOST BORN_TIMESTAMP __CRC32#
    TRACE_CONTEXT""".split()
) | {PROPERTY_DELIVER_MS, PROPERTY_DELAY_ORIGIN}

#: Properties never shown to users in :attr:`MessageView.properties` (system bookkeeping).
SYSTEM_PROPERTY_NAMES = (RESERVED_PROPERTY_NAMES | {
    PROPERTY_TRANSACTION_ID, PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "INNER_NUM", "INNER_BASE",
}) - {"TRACE_CONTEXT"}

# --- topics (RocketMQ TopicValidator) -----------------------------------------------------
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SYSTEM_TOPICS = frozenset({
    "TBW102", SCHEDULE_TOPIC, "BenchmarkTest", TRANS_HALF_TOPIC, "RMQ_SYS_TRACE_TOPIC",
    TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT", "CHECKPOINT_TOPIC",
})
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
TOPIC_MAX_LENGTH = 127
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
GROUP_MAX_LENGTH = 120


def is_system_topic(topic: str) -> bool:
    """Whether ``topic`` is one of RocketMQ's system topics or starts with ``rmq_sys_``
    (such topics are hidden from readers and refused by producers)."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def is_valid_topic_name(name: str) -> bool:
    """Whether ``name`` could name a topic (system ones included): what a record read back
    must hold before anything is written to that topic."""
    return 0 < len(name) <= TOPIC_MAX_LENGTH and bool(_TOPIC_RE.match(name)) and name not in (
        ".", "..")


#: A message id given by its sender: what RocketMQ clients make (hex) and more, never a
#: character that would end a property (0x01, 0x02) or need quoting in a path or a log line.
_MSG_ID_RE = re.compile(r"[A-Za-z0-9_.\-]{1,128}\Z")


def validate_msg_id(msg_id: object) -> str:
    """Check a message id given by its sender (``Producer.send(msg_id=...)``) and return it.

    Allowed: 1 to 128 ASCII letters, digits, ``-``, ``_`` or ``.`` (RocketMQ 5 clients make
    34 hex digits, RocketMQ 4 clients 32).
    """
    if not isinstance(msg_id, str) or not _MSG_ID_RE.match(msg_id):
        shown = msg_id[:40] + "..." if isinstance(msg_id, str) and len(msg_id) > 40 else msg_id
        raise InvalidMessageError(
            f"msg_id={shown!r}; allowed: 1 to 128 ASCII letters, digits, '-', '_' or '.'")
    return msg_id


def validate_topic(topic: object, *, allow_system: bool = False) -> str:
    """Check a topic name against RocketMQ's rules and return it.

    Allowed: 1 to 127 characters of ``a-z A-Z 0-9 _ - % |``; system topics only when
    ``allow_system``.  The character set keeps every topic inside the store directory.
    """
    if not isinstance(topic, str) or not topic.strip():
        raise InvalidTopicError(f"topic {_shown(topic)} must be a non-blank string")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidTopicError(
            f"topic {topic[:40]!r}... is {len(topic)} characters; "
            f"allowed: at most {TOPIC_MAX_LENGTH}"
        )
    if not _TOPIC_RE.match(topic):
        raise InvalidTopicError(
            f"topic {_shown(topic)} has characters outside the allowed set a-z A-Z 0-9 _ - % |"
        )
    if topic in (".", ".."):
        raise InvalidTopicError(f"topic {topic!r} is not allowed")
    if not allow_system and is_system_topic(topic):
        raise InvalidTopicError(
            f"topic {topic!r} is a system topic; users may not send to system topics "
            f"({', '.join(sorted(SYSTEM_TOPICS))} or the prefix {SYSTEM_TOPIC_PREFIX!r})"
        )
    return topic


def validate_group(group: object) -> str:
    """Check a producer group name (same characters as topics, at most 120)."""
    if not isinstance(group, str) or not group.strip():
        raise InvalidTopicError(f"producer group {_shown(group)} must be a non-blank string")
    if len(group) > GROUP_MAX_LENGTH or not _TOPIC_RE.match(group):
        raise InvalidTopicError(
            f"producer group {_shown(group)}: allowed 1 to {GROUP_MAX_LENGTH} characters of "
            "a-z A-Z 0-9 _ - % |"
        )
    return group


# Every name a caller gives the store (a topic, a group, a sink id, a message id, a delay
# key, a schedule key) is checked by one of the validators here, on every path that creates
# or names something: the local calls, the Flight and gRPC faces, the topic table itself.

#: Longest sink id, in characters (Spark's default id is a checkpoint location).
SINK_ID_MAX_LENGTH = 1024
#: Longest delay key, in UTF-8 bytes.
MAX_DELAY_KEY_BYTES = 1024
#: Longest schedule key, in characters.
SCHEDULE_KEY_MAX_LENGTH = 255
#: C0 control characters and DEL: never in a name (NUL ends C strings; others break logs).
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _shown(value: object) -> str:
    """``value`` as an error message shows it: at most 40 characters of a long string."""
    if isinstance(value, str) and len(value) > 40:
        return f"{value[:40]!r}... ({len(value)} characters)"
    return repr(value)


def validate_sink_id(sink_id: object) -> str:
    """``sink_id`` when it can name a sink (1 to 1,024 characters, no control characters;
    it names no file: the store keeps its hash); else :class:`InvalidMessageError`."""
    if (not isinstance(sink_id, str) or not sink_id.strip()
            or len(sink_id) > SINK_ID_MAX_LENGTH or _CONTROL_RE.search(sink_id)):
        raise InvalidMessageError(
            f"sink id {_shown(sink_id)}; allowed: a non-blank string of at most "
            f"{SINK_ID_MAX_LENGTH} characters without control characters")
    return sink_id


def validate_delay_key(key: object) -> str:
    """``key`` when it can name a pending message; else :class:`InvalidMessageError`."""
    if not isinstance(key, str) or not key:
        raise InvalidMessageError(f"key={_shown(key)}; allowed: a non-empty str")
    if "\x00" in key or "\x01" in key or "\x02" in key:
        raise InvalidMessageError(f"key={_shown(key)} holds \\x00, \\x01 or \\x02 (NUL, the "
                                  "properties' separators); allowed: any other characters")
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_DELAY_KEY_BYTES:
        raise InvalidMessageError(f"key of {size} bytes; allowed: at most "
                                  f"{MAX_DELAY_KEY_BYTES} bytes of UTF-8")
    return key


def validate_schedule_key(key: object) -> str:
    """``key`` when it can name a schedule; else :class:`InvalidScheduleError`."""
    if (not isinstance(key, str) or not key or len(key) > SCHEDULE_KEY_MAX_LENGTH
            or _CONTROL_RE.search(key)):
        raise InvalidScheduleError(f"key={_shown(key)}; allowed: a non-empty str of at most "
                                   f"{SCHEDULE_KEY_MAX_LENGTH} characters, no control "
                                   "characters, naming the schedule")
    return key


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, wrapped to signed 32 bits)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def sharding_queue(key: str, queue_count: int) -> int:
    """The queue of a sharding key: RocketMQ's ``SelectMessageQueueByHash``, the Java hash of
    the key modulo the queue count, made non-negative."""
    return abs(java_string_hash(key)) % queue_count


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tagsCode of a tag: its Java hash, 0 when there is none."""
    return java_string_hash(tags) if tags else 0


class LocalTransactionState(enum.Enum):
    """Outcome of a local transaction (RocketMQ's spelling, ``UNKNOW`` included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


@dataclass
class Message:
    """A message to send.

    Parameters
    ----------
    topic : str
        The destination topic.
    body : bytes
        The payload, at most ``max_message_size_bytes`` (4 MiB).
    tags : str, optional
        One tag, used for server-side filtering (no ``||``, no 0x01/0x02).
    keys : str or list of str, optional
        Business keys (stored space-separated in ``KEYS``).
    properties : dict, optional
        User properties; RocketMQ's reserved names are refused.
    flag : int
        RocketMQ's user flag integer.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | list[str] | tuple[str, ...] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0

    def key_list(self) -> list[str]:
        if self.keys is None:
            return []
        if isinstance(self.keys, str):
            return [k for k in self.keys.split(" ") if k]
        return [k for k in self.keys if k]


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a sent message was stored.

    ``topic`` and ``queue_id`` are always the user's: where the message surfaces.  A delayed
    message waits in a system topic until it is due: its ``queue_offset`` is -1 (known once
    delivered), ``deliver_at_ms`` is set, and ``stored_topic`` / ``stored_queue_id`` /
    ``stored_queue_offset`` say where the waiting record is (``None`` for other messages).
    ``commitlog_offset`` is always the stored record's.  ``store_name`` is the member of a
    store group that holds it (:class:`~store.group.store_group.StoreGroup`; ``None`` for one store).
    """

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    deliver_at_ms: int | None = None
    transaction_id: str | None = None
    stored_topic: str | None = None
    stored_queue_id: int | None = None
    stored_queue_offset: int | None = None
    store_name: str | None = None

    def __getattr__(self, name: str):
        # Called only for a slot never set: results built in bulk set the five fields every
        # result has and leave the optional ones (all ``None`` by default) unset.
        if name in _OPTIONAL_RESULT_FIELDS:
            return None
        raise AttributeError(f"'SendResult' object has no attribute {name!r}")


#: The fields of a ``SendResult`` whose default is ``None`` (what an unset slot reads as).
_OPTIONAL_RESULT_FIELDS = frozenset(f.name for f in fields(SendResult) if f.default is None)


@dataclass(frozen=True, slots=True)
class MessageView:
    """A stored message as readers see it (fields match the Spark ``messages`` columns)."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    tags: str | None
    keys: tuple[str, ...]
    body: bytes
    properties: Mapping[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    deliver_timestamp_ms: int | None
    transaction_id: str | None
    reconsume_times: int
    sys_flag: int = 0
    system_properties: Mapping[str, str] = field(default_factory=dict)


class TransactionListener(Protocol):
    """What a transaction producer calls back (RocketMQ's ``TransactionListener``)."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        ...

    def check_local_transaction(self, message_view: MessageView) -> LocalTransactionState:
        ...


#: Names that passed their checks once (a name never stops being valid): user topics, tags,
#: property names.  Bounded, so that a stream of distinct names cannot grow them forever.
_USER_TOPICS_SEEN: set[str] = set()
_TAGS_SEEN: set[str] = set()
_PROPERTY_NAMES_SEEN: set[str] = set()
_SEEN_LIMIT = 4096


def _remember(seen: set[str], name: str) -> None:
    if len(seen) < _SEEN_LIMIT:
        seen.add(name)


def validate_message(message: Message, max_body_bytes: int) -> str | None:
    """Check a user message; raise an :class:`InvalidMessageError` naming the limit.

    Returns the message's ``KEYS`` property value (:func:`keys_value`), which the check
    computes anyway.  Names already accepted once (topics, tags, property names) and
    plainly printable keys and values skip the detailed checks, which give the same answer.
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(f"expected a store.Message, got {type(message).__name__}")
    topic = message.topic
    if type(topic) is not str or topic not in _USER_TOPICS_SEEN:
        _remember(_USER_TOPICS_SEEN, validate_topic(topic))
    body = message.body
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidMessageError(
            f"body of a message to {topic!r} must be bytes, got {type(body).__name__}")
    if len(body) == 0:
        raise InvalidMessageError(
            f"body of a message to {topic!r} is empty; allowed: 1 byte or more")
    if len(body) > max_body_bytes:
        raise MessageTooLargeError(
            f"body of {len(body)} bytes exceeds max_message_size_bytes={max_body_bytes}")
    tags = message.tags
    if tags is not None and (type(tags) is not str or tags not in _TAGS_SEEN):
        check_tags(tags)
        _remember(_TAGS_SEEN, tags)
    keys = message.keys
    if keys is not None:
        # one key of printable characters without spaces is its own KEYS value
        if not (type(keys) is str and keys and " " not in keys and keys.isprintable()):
            keys = keys_value(keys)
    flag = message.flag
    if not isinstance(flag, int) or not -(2**31) <= flag < 2**31:
        raise InvalidMessageError(f"flag {flag!r} must be a signed 32-bit int")
    properties = message.properties
    if type(properties) is not dict:
        check_user_properties(properties)
    elif properties:
        for name, value in properties.items():
            if not (type(name) is str and name in _PROPERTY_NAMES_SEEN and type(value) is str
                    and value and value.isprintable() and not value.isspace()):
                check_user_properties(properties)  # raises, or accepts them all
                for accepted in properties:
                    _remember(_PROPERTY_NAMES_SEEN, accepted)
                break
    return keys


def check_tags(tags: object) -> None:
    """Check a message's tag (``None`` for none): non-blank, no separators, no ``|``."""
    if tags is not None:
        _check_text("tags", tags)
        if "|" in tags:
            raise InvalidMessageError(f"tags {tags!r} may not contain '|'")


def keys_value(keys: object) -> str | None:
    """Check a message's keys and return the ``KEYS`` property value (``None`` for none)."""
    if keys is None:
        return None
    if isinstance(keys, str):
        parts = [k for k in keys.split(" ") if k]
    elif isinstance(keys, (list, tuple)):
        parts = [k for k in keys if k]
    else:
        raise InvalidMessageError(
            f"keys {keys!r} must be a str (space-separated) or a list of str")
    for key in parts:
        _check_text("key", key)
        if " " in key:
            raise InvalidMessageError(
                f"key {key!r} may not contain a space (keys are space-separated)")
    return " ".join(parts) or None


def check_user_properties(properties: object) -> None:
    """Check user properties: str names and values, no reserved names, no separators."""
    if not isinstance(properties, Mapping):
        raise InvalidMessageError("properties must be a dict of str to str")
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError(f"property {name!r}={value!r}: names and values must be str")
        if name in RESERVED_PROPERTY_NAMES or name.startswith("__RMQ"):
            raise InvalidMessageError(
                f"property name {name!r} is reserved by RocketMQ; choose another name"
            )
        _check_text("property name", name)
        # RocketMQ refuses blank values too (and its parser drops an empty one on read)
        _check_text(f"property {name!r} value", value)


def _check_text(what: str, value: object, allow_blank: bool = False) -> None:
    if not isinstance(value, str):
        raise InvalidMessageError(f"{what} {value!r} must be a str")
    if not allow_blank and not value.strip():
        raise InvalidMessageError(f"{what} {value!r} must not be blank")
    if PROPERTY_SEPARATOR in value or PROPERTIES_SEPARATOR in value:
        raise InvalidMessageError(
            f"{what} {value!r} contains 0x01 or 0x02, the properties separators; "
            "they are not allowed"
        )


def record_view(rec: Record, queue_offset: int | None = None) -> MessageView:
    """The user-facing view of a decoded CommitLog record (system properties hidden)."""
    props = rec.properties
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES}
    keys = tuple(k for k in props.get(PROPERTY_KEYS, "").split(" ") if k)
    deliver = props.get(PROPERTY_DELIVER_MS)
    tx_id = props.get(PROPERTY_TRANSACTION_ID) if (
        rec.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE else None
    return MessageView(
        topic=rec.topic, queue_id=rec.queue_id,
        queue_offset=rec.queue_offset if queue_offset is None else queue_offset,
        commitlog_offset=rec.physical_offset, msg_id=props.get(PROPERTY_UNIQ_KEY, ""),
        tags=props.get(PROPERTY_TAGS), keys=keys, body=rec.body, properties=user,
        born_timestamp_ms=rec.born_timestamp_ms, store_timestamp_ms=rec.store_timestamp_ms,
        deliver_timestamp_ms=int(deliver) if deliver else None, transaction_id=tx_id,
        reconsume_times=rec.reconsume_times, sys_flag=rec.sys_flag,
        system_properties={k: v for k, v in props.items() if k in SYSTEM_PROPERTY_NAMES},
    )
