"""One plain record, appended without the batch machinery: the path of a single ``send``.

A single send pays for everything per message, so this path keeps the work under the lock
to what must be there (store time, queue offset, placement) and does the rest outside:

* size checks, the body CRC (:func:`store.formats.crc.crc32`: C) and the tagsCode, before the lock;
* the whole record is one ``struct.pack`` of a layout cached per (body, topic, properties)
  length (RocketMQ's v1 record: the 88-byte header of :data:`~store.formats.codec.RECORD_HEADER`,
  the body, TOPICLENGTH, the topic, PROPERTIESLENGTH, the properties);
* it goes down the same :meth:`~store.core.appender.Appender.commit` as every append (mark,
  write, sync when SYNC_FLUSH, dispatch, publish), with its one ConsumeQueue entry.  The
  record and the entry are copied through the segments' writable mappings
  (:meth:`~store.files.mapped_file.MappedFile.write_mapped`), so an uncontended send makes two
  ``flock`` calls and, most of the time, no other system call.

The bytes are those :meth:`~store.core.appender.Appender.append` writes for the same record
(``tests/store/test_single_append.py`` compares them).
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Protocol

from ..formats.codec import (
    BLANK,
    FIXED_SIZE,
    LOCALHOST,
    MESSAGE_MAGIC_CODE_V1,
    RECORD_HEADER,
    STORE_PORT,
    encode_blank,
)
from ..formats.crc import crc32
from ..errors import InvalidMessageError, MessageTooLargeError
from .appender import Appender
from .dispatch import Dispatcher


class OneRecordTarget(Protocol):
    """What :func:`append_one` uses of its store (a :class:`StoreCore`)."""

    appender: Appender
    dispatcher: Dispatcher

    def now_ms(self) -> int: ...

    def ensure_topic(self, topic: str) -> int: ...

    def _lock(self, catch_up: bool = True, lease: bool = False) -> bool: ...

    def _unlock(self, outermost: bool) -> None: ...


class SingleAppend(NamedTuple):
    """Where :func:`append_one` put its record."""

    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp_ms: int


_HEADER_FORMAT = RECORD_HEADER.format.lstrip(">")
#: ``(body, topic, properties) length -> struct.Struct`` of a whole record
_RECORD_LAYOUTS: dict[tuple[int, int, int], struct.Struct] = {}
_LAYOUT_CACHE_LIMIT = 4096
_new_result = tuple.__new__


def record_layout(body_length: int, topic_length: int, properties_length: int) -> struct.Struct:
    """The ``struct.Struct`` of a whole v1 record with these lengths (cached)."""
    key = (body_length, topic_length, properties_length)
    layout = _RECORD_LAYOUTS.get(key)
    if layout is None:
        layout = struct.Struct(f">{_HEADER_FORMAT}{body_length}sB{topic_length}sh"
                               f"{properties_length}s")
        if len(_RECORD_LAYOUTS) < _LAYOUT_CACHE_LIMIT:
            _RECORD_LAYOUTS[key] = layout
    return layout


def append_one(core: OneRecordTarget, topic: str, body: bytes, properties: bytes,
               tags: str | None = None, flag: int = 0, born_timestamp_ms: int = 0,
               queue_id: int | None = None) -> SingleAppend:
    """Append one plain record (see :meth:`StoreCore.append_one`); the caller has checked
    that the store is writable."""
    appender = core.appender
    topic_bytes = topic.encode("ascii")
    body_length, topic_length, props_length = len(body), len(topic_bytes), len(properties)
    if props_length > appender.max_properties:
        raise MessageTooLargeError(
            f"properties of a message to {topic!r} are {props_length} bytes; allowed: at "
            f"most {appender.max_properties}")
    size = FIXED_SIZE + body_length + topic_length + props_length
    if size > appender.max_record:
        raise MessageTooLargeError(
            f"a record of {size} bytes does not fit (max {appender.max_record})")
    layout = _RECORD_LAYOUTS.get((body_length, topic_length, props_length))
    if layout is None:
        layout = record_layout(body_length, topic_length, props_length)
    body_crc = crc32(body) & 0x7FFFFFFF
    tags_code = core.dispatcher.tag_hash(tags)
    count = appender.queue_counts.get(topic)
    if count is None:  # a topic this path has not met yet
        if core.dispatcher.has_rule(topic):
            raise InvalidMessageError(
                f"append_one cannot index {topic!r} (its tagsCode comes from its "
                "properties); use append()")
        count = core.ensure_topic(topic)  # creates it under the lock when missing
        appender.queue_counts[topic] = count
    if queue_id is not None and not 0 <= queue_id < count:
        raise InvalidMessageError(
            f"queue_id {queue_id} for topic {topic!r}; allowed: 0 to {count - 1}")
    outermost = core._lock(True, True)  # with a lease: the next send skips the flock
    try:
        qid = appender.next_queue(topic, count) if queue_id is None else queue_id
        now = core.now_ms()
        offset = appender.write_offset
        key = (topic, qid)
        queue_offset = appender.queue_next.get(key)
        if queue_offset is None:
            queue_offset = appender.next_queue_offset(key)
        file_size = appender.file_size
        remaining = file_size - offset % file_size
        if size + BLANK.size > remaining:  # the rest of the segment is a blank
            chunks = [(offset, encode_blank(remaining)), None]
            offset += remaining
        else:
            chunks = [None]
        chunks[-1] = (offset, layout.pack(
            size, MESSAGE_MAGIC_CODE_V1, body_crc, qid, flag, queue_offset, offset, 0,
            born_timestamp_ms, LOCALHOST, 0, now, LOCALHOST, STORE_PORT, 0, 0, body_length,
            body, topic_length, topic_bytes, props_length, properties))
        appender.commit(chunks, (key, queue_offset, offset, size, tags_code), offset + size,
                        now)
        appender.queue_next[key] = queue_offset + 1
    finally:
        core._unlock(outermost)
    return _new_result(SingleAppend, (qid, queue_offset, offset, now))
