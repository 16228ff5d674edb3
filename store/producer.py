"""Producer: validates user messages and turns them into records (plain, delayed, batch)."""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from itertools import chain, repeat
from operator import attrgetter
from typing import Protocol, Sequence

from .codec import RecordSpec
from .core.ports import StorePort
from .delayed.schedule import ScheduleService
from .errors import InvalidBatchError, InvalidDelayError, InvalidMessageError, MessageTooLargeError
from .message import (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, Message, SendResult,
                      check_tags, check_user_properties, keys_value, validate_group,
                      validate_message, validate_topic)

from .timer.service import TimerService

RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ProducerStore(StorePort, Protocol):
    """What a producer uses of its store: the core's port and the two delay services."""

    schedule: ScheduleService
    timer: TimerService


class Producer:
    """Sends messages of one producer group to a :class:`~store.MessageStore`."""

    def __init__(self, store: ProducerStore, group: str) -> None:
        self.store = store
        self.group = validate_group(group)

    # -- building records -------------------------------------------------------------------
    def _spec(self, message: Message, msg_id: str, now: int) -> RecordSpec:
        validate_message(message, self.store.config.max_message_size_bytes)
        props = dict(message.properties)
        if message.tags:
            props[PROPERTY_TAGS] = message.tags
        keys = message.key_list()
        if keys:
            props[PROPERTY_KEYS] = " ".join(keys)
        props[PROPERTY_UNIQ_KEY] = msg_id
        return RecordSpec(topic=message.topic, body=bytes(message.body), properties=props,
                          flag=message.flag, born_timestamp_ms=now)

    def _check_delay(self, delay_level, delay_ms, deliver_at_ms,
                     now: int) -> tuple[int | None, int | None]:
        """Validate the delay arguments; return ``(level, deliver_ms)`` (at most one set)."""
        given = [n for n, v in (("delay_level", delay_level), ("delay_ms", delay_ms),
                                ("deliver_at_ms", deliver_at_ms)) if v is not None]
        if len(given) > 1:
            raise InvalidDelayError(
                f"{' and '.join(given)} were both given; allowed: at most one of delay_level, "
                "delay_ms, deliver_at_ms")
        max_delay = self.store.config.timer_max_delay_ms
        if delay_level is not None:
            if not _is_int(delay_level) or delay_level < 0:
                raise InvalidDelayError(
                    f"delay_level={delay_level!r}; allowed: an int >= 0 (0 means no delay; "
                    f"levels above {len(self.store.config.delay_levels_ms)} are clamped)")
            return (delay_level or None), None
        if delay_ms is not None:
            if not _is_int(delay_ms) or delay_ms < 0:
                raise InvalidDelayError(
                    f"delay_ms={delay_ms!r}; allowed: an int from 0 to {max_delay}")
            if delay_ms > max_delay:
                raise InvalidDelayError(
                    f"delay_ms={delay_ms} exceeds timer_max_delay_ms={max_delay}")
            return None, (now + delay_ms if delay_ms > 0 else None)
        if deliver_at_ms is not None:
            if not _is_int(deliver_at_ms) or deliver_at_ms < 0:
                raise InvalidDelayError(f"deliver_at_ms={deliver_at_ms!r}; allowed: epoch ms >= 0")
            if deliver_at_ms - now > max_delay:
                raise InvalidDelayError(
                    f"deliver_at_ms={deliver_at_ms} is {deliver_at_ms - now} ms ahead; allowed: at "
                    f"most timer_max_delay_ms={max_delay}")
            # a time in the past is delivered at once, as RocketMQ does
            return None, (deliver_at_ms if deliver_at_ms > now else None)
        return None, None

    # -- sending ----------------------------------------------------------------------------
    def send(self, message: Message, *, delay_level: int | None = None, delay_ms: int | None = None,
             deliver_at_ms: int | None = None) -> SendResult:
        """Store one message, now or delayed.

        Parameters
        ----------
        message : Message
            What to send.
        delay_level : int, optional
            A 4.x delay level (1 = the first entry of ``message_delay_level``); levels above
            the table are clamped to the last one; 0 means no delay.
        delay_ms : int, optional
            Deliver after this many ms (timer wheel), up to ``timer_max_delay_ms``.
        deliver_at_ms : int, optional
            Deliver at this epoch ms (timer wheel); a time in the past delivers at once.

        Returns
        -------
        SendResult
            Where the record was stored (for delayed messages: in the system topic, with
            ``deliver_at_ms`` set).
        """
        now = self.store.now_ms()
        level, deliver_ms = self._check_delay(delay_level, delay_ms, deliver_at_ms, now)
        msg_id = self.store.id_generator.next_id(now)
        spec = self._spec(message, msg_id, now)
        due = None
        if level is not None:
            spec, due = self.store.schedule.rewrite(spec, level)
        elif deliver_ms is not None:
            spec, due = self.store.timer.rewrite(spec, deliver_ms)
        r = self.store.append([spec])[0]
        return SendResult(msg_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset,
                          deliver_at_ms=due)

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store messages of one topic as consecutive records of one queue.

        RocketMQ's batch rules: all messages share one topic, which is no retry topic; no
        delay; the encoded batch is at most ``max_message_size_bytes`` (4 MiB).  The records
        share one store time and, when they fit, one segment.
        """
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidBatchError("send_batch needs a non-empty list of store.Message")
        if not all(map(isinstance, messages, repeat(Message))):
            bad = next(m for m in messages if not isinstance(m, Message))
            raise InvalidMessageError(f"expected a store.Message, got {type(bad).__name__}")
        topics = set(map(_TOPIC, messages))
        if len(topics) != 1:
            raise InvalidBatchError(
                f"a batch must have one topic; got {sorted(map(str, topics))}")
        topic = next(iter(topics))
        if isinstance(topic, str) and topic.startswith((RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX)):
            raise InvalidBatchError(f"a batch may not go to the retry or DLQ topic {topic!r}")
        validate_topic(topic)
        limit = self.store.config.max_message_size_bytes
        bodies, tags, keys, users, flags = _batch_columns(messages, limit)
        now = self.store.now_ms()
        ids = self.store.id_generator.next_ids(len(messages), now)
        props = _batch_properties(users, tags, keys, ids)
        # RocketMQ's wire size of a batch: 20 fixed bytes + body + 2 + properties, per message
        total = 22 * len(bodies) + sum(map(len, bodies)) + sum(map(len, props))
        if total > limit:
            raise MessageTooLargeError(
                f"batch of {len(bodies)} messages is {total} bytes encoded; allowed: at most "
                f"max_message_size_bytes={limit}; split it into smaller batches")
        r = self.store.append_batch(topic, bodies, props, tags=tags, flags=flags,
                                    born_timestamp_ms=now)
        n = len(bodies)
        return _send_results(ids, topic, r.queue_id,
                             range(r.first_queue_offset, r.first_queue_offset + n),
                             r.commitlog_offsets.tolist())

    def cancel(self, topic: str, msg_id: str) -> bool:
        """Cancel a pending timer message (RocketMQ's delete marker).

        Returns ``True`` when a pending message with that id on that topic was found and
        will never surface; ``False`` when nothing matched (a wrong id, or the id on another
        topic, cancels nothing; the marker itself never surfaces).
        """
        return self.store.timer.cancel(topic, msg_id)


_TOPIC = attrgetter("topic")
_FIELDS = attrgetter("body", "tags", "keys", "properties", "flag")
# keys the fast path takes as they are: single inner spaces only, no other whitespace
_WHITESPACE_BUT_SPACE = re.compile(r"[^\S ]")
_SEND_RESULT_FIELDS = dataclasses.fields(SendResult)
assert [f.name for f in _SEND_RESULT_FIELDS[:5]] == [
    "msg_id", "topic", "queue_id", "queue_offset", "commitlog_offset"]


def _batch_columns(messages: Sequence[Message], max_body: int):
    """Validate a batch column by column; return bodies, tags, KEYS values, user properties
    (encoded, without the trailing system properties) and flags.

    Each check runs over a whole column (distinct tags, one scan of all keys, the set of
    property names) rather than per message.  Whenever a column is not plainly valid the
    messages are validated one by one instead, which raises the first message's error,
    exactly as single sends would.
    """
    bodies, tags, keys, properties, flags = zip(*map(_FIELDS, messages))
    try:
        fast = _columns_plainly_valid(bodies, tags, keys, properties, flags, max_body)
    except (TypeError, InvalidMessageError):
        fast = False
    if not fast:
        for m in messages:
            validate_message(m, max_body)
        bodies = [bytes(b) for b in bodies]
        keys_values = [keys_value(k) for k in keys]
        users = [_user_properties(p) if p else "" for p in properties]
    else:
        keys_values = [k or None for k in keys]
        users = _users_properties(properties)
    return list(bodies), list(tags), keys_values, users, list(flags)


def _users_properties(properties: Sequence[dict]) -> list[str]:
    """:func:`_user_properties` of many dicts; whole-column when all have as many items."""
    n = len(properties)
    counts = set(map(len, properties))
    if len(counts) != 1:
        return [_user_properties(p) if p else "" for p in properties]
    count = counts.pop()
    if count == 0:
        return [""] * n
    pairs = map("\x01".join, chain.from_iterable(map(dict.items, properties)))
    if count > 1:
        pairs = map("\x02".join, zip(*[pairs] * count))
    return list(map(str.__add__, pairs, repeat("\x02", n)))


def _columns_plainly_valid(bodies, tags, keys, properties, flags, max_body: int) -> bool:
    """True when every message of the columns is valid; False when unsure (or invalid)."""
    if set(map(type, bodies)) != {bytes}:
        return False
    lengths = list(map(len, bodies))
    if min(lengths) < 1 or max(lengths) > max_body:
        return False
    for f in set(flags):
        if type(f) is not int or not -(2**31) <= f < 2**31:
            return False
    for t in set(tags):
        check_tags(t)
    if not set(map(type, keys)) <= {str, type(None)}:
        return False
    text_keys = [k for k in keys if k]
    if text_keys:
        joined = "\x02".join(text_keys)
        if (joined.count("\x02") != len(text_keys) - 1 or "\x01" in joined or "  " in joined
                or " \x02" in joined or "\x02 " in joined or joined[0] == " "
                or joined[-1] == " " or _WHITESPACE_BUT_SPACE.search(joined)):
            return False
    if set(map(type, properties)) != {dict}:
        return False
    if any(properties):
        for name in set().union(*properties):
            if type(name) is not str:
                return False
            check_user_properties({name: "x"})  # the name alone: values come next
        values = list(chain.from_iterable(map(dict.values, properties)))
        if set(map(type, values)) != {str}:
            return False
        joined = "\x02".join(values)
        if ("\x01" in joined or joined.count("\x02") != len(values) - 1
                or not all(map(str.strip, values))):
            return False
    return True


def _user_properties(properties: dict) -> str:
    """``name 0x01 value 0x02 ...`` of a message's (validated) user properties."""
    return "\x02".join(map("\x01".join, properties.items())) + "\x02"


def _batch_properties(users: list[str], tags: list, keys: list, ids: list[str]) -> list[bytes]:
    """Each message's whole properties string: user properties, TAGS, KEYS, UNIQ_KEY.

    The same order (and bytes) as :func:`store.codec.encode_properties` of the dict a
    single send builds.
    """
    tag_part = {t: f"{PROPERTY_TAGS}\x01{t}\x02" if t else "" for t in set(tags)}
    tag_parts = list(map(tag_part.__getitem__, tags))
    key_parts = [f"{PROPERTY_KEYS}\x01{k}\x02" if k else "" for k in keys]
    n = len(ids)
    text = map("".join, zip(users, tag_parts, key_parts, repeat(f"{PROPERTY_UNIQ_KEY}\x01", n),
                            ids, repeat("\x02", n)))
    return list(map(str.encode, text))


def _send_results(ids, topic: str, queue_id: int, queue_offsets, commitlog_offsets
                  ) -> list[SendResult]:
    """``SendResult`` objects for a batch, filled slot by slot over the whole batch.

    Equal to calling ``SendResult(...)`` per message, at half the cost: a frozen dataclass's
    ``__init__`` goes through ``object.__setattr__`` once per field.
    """
    n = len(ids)
    results = list(map(object.__new__, repeat(SendResult, n)))
    columns = [ids, repeat(topic, n), repeat(queue_id, n), queue_offsets, commitlog_offsets]
    columns += [repeat(f.default, n) for f in _SEND_RESULT_FIELDS[5:]]
    for field, column in zip(_SEND_RESULT_FIELDS, columns):
        deque(map(SendResult.__dict__[field.name].__set__, results, column), maxlen=0)
    return results
