"""``Producer.send`` of one message without a :class:`~store.formats.record_codec.RecordSpec`.

Two shapes of send are most of what applications do one message at a time: a plain message,
and a message due at a time (``delay_ms`` / ``deliver_at_ms``: the timer wheel, an order's
time-out).  Both are single records of a topic whose queue entry carries the tag hash, so
they go through :meth:`StoreCore.append_one <store.core.store_core.StoreCore.append_one>`
with their properties string built directly, in the order the general path
(:meth:`Producer.send <store.produce.producer.Producer.send>` with a spec) writes it:

* plain: the user's pairs, ``TAGS``, ``KEYS``, ``UNIQ_KEY``;
* timer: the same, then ``REAL_TOPIC``, ``REAL_QID``, ``TIMER_OUT_MS``,
  ``TIMER_DELIVER_MS``; the record goes to queue 0 of ``rmq_sys_wheel_timer``.

Delay levels (their queue entries carry the due time, a rule of the delay-level service) and
subclasses of :class:`~store.formats.message.Message` keep the general path.
``tests/store/core/test_single_append.py`` compares the bytes of both ways.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from ..formats.batch_encoding import user_properties_text
from ..delayed.delivery import check_headroom
from ..formats.record_codec import PROPERTIES_SEPARATOR as END, PROPERTY_SEPARATOR as SEP
from ..formats.message import (
    PROPERTY_DELAY_KEY,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_UNIQ_KEY,
    TIMER_TOPIC,
    Message,
    SendResult,
    validate_message,
)



class Producer(Protocol):
    """What these paths use of a :class:`~store.produce.producer.Producer`."""

    store: Any  # its ProducerStore: the core's port, the timer service
    store_name: str | None

    def _queue(self, topic: object, queue_id: object, sharding_key: object) -> int | None: ...

_SEND_RESULT_FIELDS = [f.name for f in dataclasses.fields(SendResult)]
assert _SEND_RESULT_FIELDS == [
    "msg_id", "topic", "queue_id", "queue_offset", "commitlog_offset", "deliver_at_ms",
    "transaction_id", "stored_topic", "stored_queue_id", "stored_queue_offset", "store_name"]
(_set_msg_id, _set_topic, _set_queue_id, _set_queue_offset, _set_commitlog_offset,
 _set_deliver_at_ms, _set_transaction_id, _set_stored_topic, _set_stored_queue_id,
 _set_stored_queue_offset, _set_store_name) = [SendResult.__dict__[name].__set__
                                                for name in _SEND_RESULT_FIELDS]
_new_result = object.__new__


def send_result(msg_id: str, topic: str, queue_id: int, queue_offset: int,
                commitlog_offset: int, store_name: str | None, deliver_at_ms: int | None = None,
                stored_topic: str | None = None, stored_queue_id: int | None = None,
                stored_queue_offset: int | None = None) -> SendResult:
    """``SendResult(...)`` of a send (no transaction id) at a fraction of the cost: a frozen
    dataclass's ``__init__`` goes through ``object.__setattr__`` once per field; here the
    slots are set through their descriptors, and optional ones only when not ``None``."""
    r = _new_result(SendResult)
    _set_msg_id(r, msg_id)
    _set_topic(r, topic)
    _set_queue_id(r, queue_id)
    _set_queue_offset(r, queue_offset)
    _set_commitlog_offset(r, commitlog_offset)
    if deliver_at_ms is not None:  # unset optional fields read as None
        _set_deliver_at_ms(r, deliver_at_ms)
        _set_stored_topic(r, stored_topic)
        _set_stored_queue_id(r, stored_queue_id)
        _set_stored_queue_offset(r, stored_queue_offset)
    if store_name is not None:
        _set_store_name(r, store_name)
    return r


def _user_pairs(message: Message, keys: str | None, msg_id: str) -> str:
    """The properties string of a message as sent: its pairs, TAGS, KEYS, UNIQ_KEY."""
    tags, user = message.tags, message.properties
    if not (user or tags or keys):
        return f"{PROPERTY_UNIQ_KEY}{SEP}{msg_id}{END}"
    text = user_properties_text(user) if user else ""
    if tags:
        text += f"{PROPERTY_TAGS}{SEP}{tags}{END}"
    if keys:
        text += f"{PROPERTY_KEYS}{SEP}{keys}{END}"
    return f"{text}{PROPERTY_UNIQ_KEY}{SEP}{msg_id}{END}"


def _checked(producer: Producer, message: Message, queue_id: int | None,
             sharding_key: str | None) -> tuple[str | None, int | None]:
    """Validate; return the message's KEYS value and the queue asked for (``None``: any)."""
    keys = validate_message(message, producer.store.config.max_message_size_bytes)
    if queue_id is None and sharding_key is None:
        return keys, None
    return keys, producer._queue(message.topic, queue_id, sharding_key)


def send_now(producer: Producer, message: Message, queue_id: int | None,
             sharding_key: str | None, msg_id: str | None = None) -> SendResult:
    """A message that is not delayed (``msg_id``: its sender's id, checked already)."""
    store = producer.store
    keys, queue = _checked(producer, message, queue_id, sharding_key)
    now = store.now_ms()
    if msg_id is None:
        msg_id = store.id_generator.next_id(now)
    properties = _user_pairs(message, keys, msg_id).encode()
    body = message.body
    if type(body) is not bytes:
        body = bytes(body)
    r = store.append_one(message.topic, body, properties, message.tags, message.flag, now,
                         queue)
    return send_result(msg_id, message.topic, r[0], r[1], r[2], producer.store_name)


def send_timer(producer: Producer, message: Message, deliver_ms: int, now: int,
               queue_id: int | None, sharding_key: str | None,
               msg_id: str | None = None, delay_key: str | None = None) -> SendResult:
    """A message due at ``deliver_ms`` (in the future): a record of the timer topic;
    ``delay_key`` (validated) replaces the pending message of that key."""
    store = producer.store
    keys, queue = _checked(producer, message, queue_id, sharding_key)
    topic = message.topic
    if msg_id is None:
        msg_id = store.id_generator.next_id(now)
    out = store.timer.fire_time(deliver_ms)  # flow control may refuse it
    if queue is None:  # the real queue is chosen now, as a plain send would
        queue = store.next_queue(topic, store.ensure_topic(topic))
    properties = (f"{_user_pairs(message, keys, msg_id)}{PROPERTY_REAL_TOPIC}{SEP}{topic}{END}"
                  f"{PROPERTY_REAL_QUEUE_ID}{SEP}{queue}{END}{PROPERTY_TIMER_OUT_MS}{SEP}{out}{END}"
                  f"{PROPERTY_TIMER_DELIVER_MS}{SEP}{deliver_ms}{END}"
                  + ("" if delay_key is None else f"{PROPERTY_DELAY_KEY}{SEP}{delay_key}{END}")
                  ).encode()
    check_headroom(store, properties)
    body = message.body
    if type(body) is not bytes:
        body = bytes(body)
    r = store.append_one(TIMER_TOPIC, body, properties, message.tags, message.flag, now, 0)
    return send_result(msg_id, topic, queue, -1, r[2], producer.store_name,
                       deliver_at_ms=deliver_ms, stored_topic=TIMER_TOPIC, stored_queue_id=r[0],
                       stored_queue_offset=r[1])
