"""Producer: validates user messages and turns them into records (plain, delayed, batch)."""

from __future__ import annotations

import dataclasses
from collections import deque
from itertools import repeat
from operator import attrgetter
from typing import Protocol, Sequence

import numpy as np

from ..formats.batch_encoding import (normalized_columns, paused_gc, properties_column,
                                      validated_columns)
from ..formats.record_codec import RecordSpec
from ..core.ports import StorePort
from ..delayed.delay_levels import DelayLevelService, deliver_time
from ..base.errors import (InvalidBatchError, InvalidDelayError, InvalidMessageError,
                           MessageTooLargeError)
from ..formats.message import (
    validate_msg_id,
    PROPERTY_DELAY_KEY,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
    SendResult,
    sharding_queue,
    validate_group,
    validate_message,
    validate_topic,
)
from .single_send import send_now, send_timer
from .table_keys import keyed_table
from .table_producer import send_table
from .table_rows import as_table
from ..schedule.schedule_table import ScheduleTableResult, schedule_rows
from ..schedule.recurring_schedule import Schedule, ScheduleInfo, validate_schedule
from ..schedule.schedule_book import ScheduleBook
from ..timer.delay_keys import key_column, key_list, validate_delay_key
from ..timer.timer_service import TimerService

RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ProducerStore(StorePort, Protocol):
    """What a producer uses of its store: the core's port, the two delay services and the
    recurring schedules."""

    schedule: DelayLevelService
    timer: TimerService
    recurring: ScheduleBook


class Producer:
    """Sends messages of one producer group to a :class:`~store.MessageStore`."""

    def __init__(self, store: ProducerStore, group: str) -> None:
        self.store = store
        self.group = validate_group(group)
        #: the store's name in a store group (set by :class:`~store.group.store_group.StoreGroup`);
        #: copied into every :class:`SendResult`
        self.store_name: str | None = None

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
    def _queue(self, topic: object, queue_id: object, sharding_key: object) -> int | None:
        """The queue an ordered send asks for (``None``: round robin), validated."""
        if queue_id is None and sharding_key is None:
            return None
        if queue_id is not None and sharding_key is not None:
            raise InvalidMessageError("queue_id and sharding_key were both given; allowed: at "
                                      "most one (a queue, or a key hashed to a queue)")
        count = self.store.ensure_topic(validate_topic(topic))
        if sharding_key is not None:
            if not isinstance(sharding_key, str) or not sharding_key:
                raise InvalidMessageError(f"sharding_key={sharding_key!r}; allowed: a non-empty "
                                          "str (messages with one key keep their order)")
            return sharding_queue(sharding_key, count)
        if not _is_int(queue_id) or not 0 <= queue_id < count:
            raise InvalidMessageError(f"queue_id={queue_id!r} for topic {topic!r}; allowed: an "
                                      f"int from 0 to {count - 1} (the topic's queues)")
        return queue_id

    def send(self, message: Message, *, delay_level: int | None = None, delay_ms: int | None = None,
             deliver_at_ms: int | None = None, queue_id: int | None = None,
             sharding_key: str | None = None, msg_id: str | None = None,
             key: str | None = None) -> SendResult:
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
        queue_id : int, optional
            The queue it goes to (RocketMQ's ``MessageQueueSelector``), from 0 to the topic's
            queue count - 1; a delayed message surfaces there too.  Default: round robin.
        sharding_key : str, optional
            Messages with the same key go to the same queue, so they keep their order (the
            key's Java hash modulo the queue count, RocketMQ's ``SelectMessageQueueByHash``).
            At most one of ``queue_id`` and ``sharding_key``.
        msg_id : str, optional
            The message id (``UNIQ_KEY``) when the sender made it already, as RocketMQ 5
            clients do: 1 to 128 ASCII letters, digits, ``-``, ``_`` or ``.``.  Default: a
            fresh id of this store.
        key : str, optional
            A delay key (with ``delay_ms`` or ``deliver_at_ms``): this message replaces the
            pending timer message sent before with the same key, atomically: once the call
            returns, the old one never surfaces (one already delivered stays delivered).
            The message carries the property ``RMQ_DELAY_KEY``; a keyed message due now
            waits in the timer for at most one precision, so that it still replaces.
            Up to 1,024 bytes of UTF-8, without ``\x01`` / ``\x02``.  See
            :meth:`cancel` (``key=``) and :meth:`replace_table`.

        Returns
        -------
        SendResult
            Where the message surfaces (topic and queue) and where its record was stored;
            for a delayed message ``queue_offset`` is -1 until delivered, ``deliver_at_ms``
            is set and ``stored_topic`` names the system topic it waits in.
        """
        if msg_id is not None:
            validate_msg_id(msg_id)
        if key is not None:
            return self._send_keyed(message, key, delay_level, delay_ms, deliver_at_ms,
                                    queue_id, sharding_key, msg_id)
        plain = type(message) is Message  # (a subclass takes the general path)
        if plain and delay_level is None and delay_ms is None and deliver_at_ms is None:
            return send_now(self, message, queue_id, sharding_key, msg_id)
        now = self.store.now_ms()
        level, deliver_ms = self._check_delay(delay_level, delay_ms, deliver_at_ms, now)
        if plain and deliver_ms is not None:
            return send_timer(self, message, deliver_ms, now, queue_id, sharding_key, msg_id)
        if plain and level is None and deliver_ms is None:  # a delay of 0: not delayed
            return send_now(self, message, queue_id, sharding_key, msg_id)
        if msg_id is None:
            msg_id = self.store.id_generator.next_id(now)
        spec = self._spec(message, msg_id, now)
        queue = self._queue(message.topic, queue_id, sharding_key)
        if queue is not None:
            spec = dataclasses.replace(spec, queue_id=queue)
        due = None
        if level is not None:
            spec, due = self.store.delay_levels.rewrite(spec, level)
        elif deliver_ms is not None:
            spec, due = self.store.timer.rewrite(spec, deliver_ms)
        r = self.store.append([spec])[0]
        if level is not None:  # the exact due time: from the store time of the record
            due = deliver_time(self.store.config.delay_levels_ms, level, r.store_timestamp_ms)
        if spec.topic == message.topic:
            return SendResult(msg_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset,
                              deliver_at_ms=due, store_name=self.store_name)
        real_qid = int(spec.properties.get(PROPERTY_REAL_QUEUE_ID, r.queue_id))
        return SendResult(msg_id, message.topic, real_qid, -1, r.commitlog_offset,
                          deliver_at_ms=due, stored_topic=r.topic, stored_queue_id=r.queue_id,
                          stored_queue_offset=r.queue_offset, store_name=self.store_name)

    def _send_keyed(self, message: Message, key: str, delay_level, delay_ms, deliver_at_ms,
                    queue_id, sharding_key, msg_id) -> SendResult:
        """A timer message carrying its delay key (see :meth:`send`)."""
        validate_delay_key(key)
        if delay_level is not None or (delay_ms is None and deliver_at_ms is None):
            raise InvalidDelayError(
                "key= needs delay_ms or deliver_at_ms (a timer message); allowed: one of "
                "them, not delay_level (delay levels cannot be replaced)")
        now = self.store.now_ms()
        _, deliver_ms = self._check_delay(None, delay_ms, deliver_at_ms, now)
        if deliver_ms is None:  # due now: still through the timer, so that it replaces
            deliver_ms = now + 1
        if PROPERTY_DELAY_KEY in message.properties:
            props = {k: v for k, v in message.properties.items() if k != PROPERTY_DELAY_KEY}
            message = dataclasses.replace(message, properties=props)
        self.store.timer.keys.ensure()
        if type(message) is Message:
            return send_timer(self, message, deliver_ms, now, queue_id, sharding_key, msg_id,
                              delay_key=key)
        props = dict(message.properties)
        props[PROPERTY_DELAY_KEY] = key
        return self.send(dataclasses.replace(message, properties=props),
                         deliver_at_ms=deliver_ms, queue_id=queue_id,
                         sharding_key=sharding_key, msg_id=msg_id)

    def send_batch(self, messages: Sequence[Message], *, queue_id: int | None = None,
                   sharding_key: str | None = None) -> list[SendResult]:
        """Store messages of one topic as consecutive records of one queue.

        RocketMQ's batch rules: all messages share one topic, which is no retry topic; no
        delay; the encoded batch is at most ``max_message_size_bytes`` (4 MiB).  The records
        share one store time and, when they fit, one segment.  ``queue_id`` or
        ``sharding_key`` choose the queue as for :meth:`send` (default: round robin).
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
        queue = self._queue(topic, queue_id, sharding_key)
        with paused_gc():
            return self._send_batch(messages, topic, queue)

    def _send_batch(self, messages: Sequence[Message], topic: str,
                    queue: int | None) -> list[SendResult]:
        limit = self.store.config.max_message_size_bytes
        bodies, tags, keys, properties, flags = zip(*map(_FIELDS, messages))
        try:
            bodies, tags, keys, users = validated_columns(bodies, tags, keys, properties, limit,
                                                          flags)
        except (TypeError, InvalidMessageError):
            for m in messages:  # the first message's own error, as single sends would raise
                validate_message(m, limit)
            bodies, tags, keys, users = normalized_columns(bodies, tags, keys, properties)
        now = self.store.now_ms()
        ids = self.store.id_generator.next_ids(len(messages), now)
        props = properties_column(users, tags, keys, ids)
        # RocketMQ's wire size of a batch: 20 fixed bytes + body + 2 + properties, per message
        total = 22 * len(bodies) + sum(map(len, bodies)) + int(props.offsets[-1])
        if total > limit:
            raise MessageTooLargeError(
                f"batch of {len(bodies)} messages is {total} bytes encoded; allowed: at most "
                f"max_message_size_bytes={limit}; split it into smaller batches")
        r = self.store.append_batch(topic, bodies, props, tags=tags, flags=list(flags),
                                    born_timestamp_ms=now, queue_id=queue)
        n = len(bodies)
        return _send_results(ids, topic, r.queue_id,
                             range(r.first_queue_offset, r.first_queue_offset + n),
                             r.commitlog_offsets.tolist(), self.store_name)

    def send_table(self, data, *, topic: str | None = None):
        """Store a whole table of messages: the columnar write path.

        ``data`` is a ``pyarrow.Table``, ``pyarrow.RecordBatch`` or ``pandas.DataFrame`` with
        the columns ``topic`` (or ``topic=`` for every row), ``body`` (or ``value``), and
        optionally ``tags``, ``keys``, ``properties`` and one of ``delay_ms``, ``deliver_at``,
        ``delay_level`` per row.  Every row is validated before anything is stored.  Returns a
        ``pyarrow.Table`` (``msg_id``, ``topic``, ``queue_id``, ``queue_offset``,
        ``commitlog_offset``, ``deliver_at_ms``), one row per input row; see
        :mod:`store.produce.table_producer`.
        """
        return send_table(self.store, data, topic=topic)

    def schedule(self, message: Message, *, key: str, cron: str | None = None,
                 every_ms: int | None = None, tz: str = "UTC", start_at_ms: int | None = None,
                 end_at_ms: int | None = None, max_fires: int | None = None,
                 catch_up: str = "latest_once",
                 catch_up_window_ms: int | None = None) -> ScheduleInfo:
        """Fire a copy of ``message`` into its topic at every due time, from now on.

        Parameters
        ----------
        message : Message
            What each fire sends (topic, body, tags, keys, properties).  Every copy also
            carries the properties ``RMQ_SCHEDULE_KEY`` (``key``) and ``RMQ_SCHEDULE_FIRE_MS``
            (its fire time, which is also its ``deliver_timestamp``).
        key : str
            Names the schedule; a schedule with this key is replaced, unless it is the same
            definition (message, expression or interval, zone, bounds): then nothing changes
            and it keeps its next fire and count, so adding a schedule again is harmless.
        cron : str, optional
            Five cron fields or a macro (``"0 9 * * *"``, ``"@hourly"``), in time zone ``tz``;
            see :class:`~store.delay_levels.cron.CronExpression` for daylight saving.
        every_ms : int, optional
            A fixed interval: fires at ``start_at_ms + k * every_ms`` (from now +
            ``every_ms`` without ``start_at_ms``).  Exactly one of ``cron`` and ``every_ms``.
        tz : str
            An IANA time zone for ``cron`` (default UTC).
        start_at_ms, end_at_ms : int, optional
            No fire before ``start_at_ms`` or after ``end_at_ms`` (epoch ms).
        max_fires : int, optional
            The schedule ends after this many fires (copies sent).
        catch_up : str
            What a step that finds several due times of the schedule (fires missed while
            nothing delivered) sends: ``"latest_once"`` (the default) one copy at the latest
            of them, carrying the property ``RMQ_SCHEDULE_FIRES`` = how many it stands for;
            ``"all"`` a copy for each; ``"skip"`` none.  Later fires keep the phase.  See
            :mod:`store.schedule.recurring_schedule`.
        catch_up_window_ms : int, optional
            Due times older than this (ms before the step) are dropped, under any policy;
            ``None`` (the default): none is too old.

        Returns
        -------
        ScheduleInfo
            The schedule as stored, with its first fire time (``next_fire_ms``).

        Fires happen when ``deliver_due()`` runs (``rmq serve``, a streaming query), never
        early, each exactly once across crashes.  Raises
        :class:`~store.base.errors.InvalidScheduleError` for a bad key, expression, interval,
        time zone, bound or policy (:class:`~store.base.errors.ScheduleIntervalError` for an
        ``every_ms`` below ``StoreConfig.schedule_min_interval_ms``), and what :meth:`send`
        raises for a bad message.
        """
        return self.store.recurring.add(self._schedule_of(
            message, key=key, cron=cron, every_ms=every_ms, tz=tz, start_at_ms=start_at_ms,
            end_at_ms=end_at_ms, max_fires=max_fires, catch_up=catch_up,
            catch_up_window_ms=catch_up_window_ms))

    def _schedule_of(self, message: Message, *, key: str, cron, every_ms, tz, start_at_ms,
                     end_at_ms, max_fires, catch_up, catch_up_window_ms) -> Schedule:
        """A checked :class:`Schedule` (what :meth:`schedule` stores)."""
        validate_schedule(key, cron, every_ms, tz, start_at_ms, end_at_ms, max_fires,
                          catch_up, catch_up_window_ms,
                          min_interval_ms=self.store.config.schedule_min_interval_ms)
        spec = self._spec(message, "-", self.store.now_ms())
        validate_topic(message.topic)
        properties = {k: v for k, v in spec.properties.items() if k != PROPERTY_UNIQ_KEY}
        return Schedule(key, message.topic, spec.body, properties, cron=cron, every_ms=every_ms,
                        tz=tz, start_at_ms=start_at_ms, end_at_ms=end_at_ms,
                        max_fires=max_fires, catch_up=catch_up,
                        catch_up_window_ms=catch_up_window_ms)

    def schedule_table(self, data, *, topic: str | None = None) -> ScheduleTableResult:
        """Add, replace or remove many schedules at once: one row per schedule (columns
        ``key``, ``topic`` or ``topic=``, ``body``, ``tags``, ``keys``, ``properties``,
        ``cron`` or ``every_ms``, ``tz``, ``start_at_ms``, ``end_at_ms``, ``max_fires``,
        ``catch_up``, ``catch_up_window_ms``; a row with neither ``cron`` nor ``every_ms``
        removes its key's schedule).

        Every row is checked before anything changes; the book is written once.  A row
        identical to the schedule under its key changes nothing (its progress is kept), so
        applying a table again is harmless.  See :mod:`store.delay_levels.schedule_table`.
        """
        adds, removes = schedule_rows(as_table(data), topic)
        schedules = [self._schedule_of(a.pop("message"), **a) for a in adds]
        _, changed, removed = self.store.recurring.apply(schedules, removes)
        return ScheduleTableResult(changed, len(schedules) - changed, removed)

    def cancel(self, topic: str | None = None, msg_id: str | None = None, *,
               stored_queue_offset: int | None = None, key: str | None = None) -> bool:
        """Cancel a pending timer message: by ``topic`` and ``msg_id`` (RocketMQ's delete
        marker), or by its delay key (``key=``, alone).

        Returns ``True`` when a pending message was found and will never surface; ``False``
        when nothing matched (a wrong id, the id on another topic, a message already
        cancelled or delivered, a key naming no pending message; the marker itself never
        surfaces).  ``stored_queue_offset``: the send's
        :attr:`SendResult.stored_queue_offset`, which finds the message directly; needed for
        a message sent with its own ``msg_id``.  Many keys at once: :meth:`cancel_keys`.
        """
        if key is not None:
            if topic is not None or msg_id is not None or stored_queue_offset is not None:
                raise InvalidMessageError(
                    "cancel: key= was given with topic / msg_id / stored_queue_offset; "
                    "allowed: key= alone, or topic and msg_id")
            return bool(self.cancel_keys([key])[0])
        return self.store.timer.cancel(topic, msg_id, stored_queue_offset=stored_queue_offset)

    def cancel_keys(self, keys) -> np.ndarray:
        """Cancel the pending messages of many delay keys at once (a list of str, or an
        Arrow / pandas string column); returns, per key, whether it named a pending message.

        One record per 65,536 cancelled keys: the vectorised form of
        ``cancel(key=...)``.
        """
        keys = key_list(keys)
        if not self.store.timer.keys.active():
            key_column(keys)  # still validated
            return np.zeros(len(keys), dtype=bool)
        return self.store.timer.keys.cancel(keys)

    def pending_keys(self, keys) -> np.ndarray:
        """Per delay key, whether it names a message not yet delivered."""
        keys = key_list(keys)
        if not self.store.timer.keys.active():
            key_column(keys)
            return np.zeros(len(keys), dtype=bool)
        return self.store.timer.keys.pending(keys)

    def replace_table(self, data, *, topic: str | None = None):
        """Replace by key, for a whole table: :meth:`send_table` with a ``key`` column.

        ``data`` has the columns of :meth:`send_table` plus ``key`` (a string per row, no
        nulls) and ``delay_ms`` or ``deliver_at`` for every row (no ``delay_level``).  Each
        row replaces the pending timer message of its key (rows of one key: the last one
        wins); a row due now waits in the timer for at most one precision.  Returns what
        :meth:`send_table` returns.
        """
        table = keyed_table(as_table(data), self.store.now_ms())
        keys = self.store.timer.keys
        keys.ensure()
        results = send_table(self.store, table, topic=topic)
        with self.store.write_lock():  # applied now, not by the next delivery
            keys.sync()
            keys.release_memory()
        return results


_TOPIC = attrgetter("topic")
_FIELDS = attrgetter("body", "tags", "keys", "properties", "flag")
_RESULT_SLOTS = ("msg_id", "topic", "queue_id", "queue_offset", "commitlog_offset", "store_name")
assert set(_RESULT_SLOTS) <= {f.name for f in dataclasses.fields(SendResult)}


def _send_results(ids, topic: str, queue_id: int, queue_offsets, commitlog_offsets,
                  store_name: str | None = None) -> list[SendResult]:
    """``SendResult`` objects for a batch, filled slot by slot over the whole batch.

    Equal to calling ``SendResult(...)`` per message, at a third of the cost: a frozen
    dataclass's ``__init__`` goes through ``object.__setattr__`` once per field, where this
    sets the five fields every result has through their slots and leaves the optional ones
    unset (``SendResult`` reads an unset optional field as ``None``).
    """
    n = len(ids)
    results = list(map(object.__new__, repeat(SendResult, n)))
    columns = [ids, repeat(topic, n), repeat(queue_id, n), queue_offsets, commitlog_offsets]
    if store_name is not None:
        columns.append(repeat(store_name, n))
    for name, column in zip(_RESULT_SLOTS, columns):
        deque(map(SendResult.__dict__[name].__set__, results, column), maxlen=0)
    return results
