"""CommitLog record codec: RocketMQ's v1 message layout (IPv4 hosts), big-endian.

Layout of one record (offsets for IPv4 born and store hosts)::

    off  size  type   field
    0    4     i32    TOTALSIZE           whole record length = 91 + B + T + P
    4    4     i32    MAGICCODE           0xDAA320A7 (v1)
    8    4     i32    BODYCRC             crc32(body) & 0x7FFFFFFF (zlib's CRC32)
    12   4     i32    QUEUEID
    16   4     i32    FLAG                user flag
    20   8     i64    QUEUEOFFSET         logical index in (topic, queue)
    28   8     i64    PHYSICALOFFSET      this record's own CommitLog offset
    36   4     i32    SYSFLAG             transaction bits 0xC, ...
    40   8     i64    BORNTIMESTAMP       ms
    48   4+4   ip,i32 BORNHOST            IPv4 address, port
    56   8     i64    STORETIMESTAMP      ms, set under the append lock
    64   4+4   ip,i32 STOREHOSTADDRESS
    72   4     i32    RECONSUMETIMES
    76   8     i64    PREPAREDTRANSACTIONOFFSET
    84   4     i32    BODYLENGTH B
    88   B     bytes  BODY
    88+B 1     u8     TOPICLENGTH T
    ..   T     bytes  TOPIC
    ..   2     i16    PROPERTIESLENGTH P  at most 32767
    ..   P     bytes  PROPERTIES          name 0x01 value 0x02 ...

At the end of a segment, when a record of length L does not fit with 8 bytes to spare, an
8-byte blank (TOTALSIZE = bytes left, MAGIC = 0xCBD43194) is written and the record goes to
the next segment.  A record that fails any check (magic, size, CRC, recomputed length) is
invalid; recovery stops at the first one and truncates the tail there.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import AnyStr, Mapping

import numpy as np

from ..base.crc import crc32
from ..base.errors import CorruptRecordError
from .binary_layout import layout

MESSAGE_MAGIC_CODE_V1 = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB (topics longer than 127; never written here)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194

#: The fixed header of a record, in order (one field list: Struct and dtype are built from it).
HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("total_size", ">i4"),  # TOTALSIZE
    ("magic", ">i4"),  # MAGICCODE
    ("body_crc", ">i4"),  # BODYCRC
    ("queue_id", ">i4"),  # QUEUEID
    ("flag", ">i4"),  # FLAG
    ("queue_offset", ">i8"),  # QUEUEOFFSET
    ("physical_offset", ">i8"),  # PHYSICALOFFSET
    ("sys_flag", ">i4"),  # SYSFLAG
    ("born_timestamp", ">i8"),  # BORNTIMESTAMP
    ("born_host", "V4"),  # BORNHOST address
    ("born_port", ">i4"),  # BORNHOST port
    ("store_timestamp", ">i8"),  # STORETIMESTAMP
    ("store_host", "V4"),  # STOREHOSTADDRESS address
    ("store_port", ">i4"),  # STOREHOSTADDRESS port
    ("reconsume_times", ">i4"),  # RECONSUMETIMES
    ("prepared_transaction_offset", ">i8"),  # PREPAREDTRANSACTIONOFFSET
    ("body_length", ">i4"),  # BODYLENGTH
)
_HEADER = layout(HEADER_FIELDS)
RECORD_HEADER, HEADER_SIZE, HEADER_DTYPE = _HEADER.exports()  # 88 bytes
TOPIC_LENGTH = struct.Struct(">B")
PROPERTIES_LENGTH = struct.Struct(">h")
BLANK = struct.Struct(">ii")  # TOTALSIZE (bytes left in the segment), BLANK_MAGIC_CODE

#: Byte offset of each header field inside a record.
FIELD_OFFSET = _HEADER.offsets
_HEADER_VOID = np.dtype(f"V{HEADER_SIZE}")
#: Fixed bytes of a v1 record besides body, topic and properties.
FIXED_SIZE = HEADER_SIZE + TOPIC_LENGTH.size + PROPERTIES_LENGTH.size  # 91

# SYSFLAG bits (MessageSysFlag)
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
#: QUEUEOFFSET of a staged record: its queue offset comes from the commit marker that makes
#: it visible (:mod:`store.core.index_commit`).
STAGED_QUEUE_OFFSET = -1

LOCALHOST = bytes([127, 0, 0, 1])
STORE_PORT = 10911

PROPERTY_SEPARATOR = "\x01"  # between a name and its value
PROPERTIES_SEPARATOR = "\x02"  # after each pair


def body_crc(body: bytes) -> int:
    """RocketMQ's BODYCRC: IEEE CRC-32 masked to 31 bits."""
    return crc32(body) & 0x7FFFFFFF


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Serialize properties as ``name 0x01 value 0x02``; pairs with a ``None`` value are
    left out."""
    return "".join(
        f"{k}\x01{v}\x02" for k, v in properties.items() if v is not None
    ).encode("utf-8")


def split_properties(data: AnyStr) -> dict[AnyStr, AnyStr]:
    """Split a properties string (``str`` or ``bytes``) into pairs, RocketMQ's rules.

    Pairs end with 0x02; a pair's name runs to its first 0x01 and needs a name and a value
    (others are dropped); a later pair of the same name wins.  The one scalar parser of the
    store (the vectorised one, for Arrow, is :mod:`store.formats.arrow_properties`).
    """
    pair_end, name_end = ("\x02", "\x01") if isinstance(data, str) else (b"\x02", b"\x01")
    out = {}
    for part in data.split(pair_end):
        idx = part.find(name_end)
        if 0 < idx < len(part) - 1:
            out[part[:idx]] = part[idx + 1:]
    return out


def decode_properties(data: bytes | str) -> dict[str, str]:
    """The properties of a record as text (see :func:`split_properties`)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8", errors="replace")
    return split_properties(data)


def record_size(body_len: int, topic_len: int, properties_len: int) -> int:
    """The stored size of a record with these field lengths."""
    return FIXED_SIZE + body_len + topic_len + properties_len


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """Everything a caller decides about a record; the store fills offsets and store time.

    ``queue_id`` of ``None`` lets the store pick a queue (round robin over the topic's queues).
    """

    topic: str
    body: bytes
    properties: Mapping[str, str]
    queue_id: int | None = None
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    born_host: bytes = LOCALHOST
    born_port: int = 0


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded CommitLog record."""

    total_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    born_port: int
    store_timestamp_ms: int
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def transaction_type(self) -> int:
        """The transaction bits of a record's ``sysFlag``."""
        return self.sys_flag & TRANSACTION_TYPE_MASK

    def to_spec(self, **changes) -> RecordSpec:
        """A spec to re-append this record elsewhere (copying what RocketMQ copies)."""
        values = dict(
            topic=self.topic, body=self.body, properties=dict(self.properties),
            queue_id=self.queue_id, flag=self.flag, sys_flag=self.sys_flag,
            born_timestamp_ms=self.born_timestamp_ms, reconsume_times=self.reconsume_times,
            prepared_transaction_offset=self.prepared_transaction_offset,
            born_host=self.born_host, born_port=self.born_port,
        )
        values.update(changes)
        return RecordSpec(**values)


def encode_record(
    spec: RecordSpec,
    *,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp_ms: int,
    topic_bytes: bytes | None = None,
    properties_bytes: bytes | None = None,
) -> bytes:
    """Encode one record; the caller has validated sizes."""
    topic_b = topic_bytes if topic_bytes is not None else spec.topic.encode("ascii")
    props_b = (properties_bytes if properties_bytes is not None
               else encode_properties(spec.properties))
    body = bytes(spec.body)
    total = record_size(len(body), len(topic_b), len(props_b))
    header = RECORD_HEADER.pack(
        total, MESSAGE_MAGIC_CODE_V1, body_crc(body), queue_id, spec.flag, queue_offset,
        physical_offset, spec.sys_flag, spec.born_timestamp_ms, spec.born_host, spec.born_port,
        store_timestamp_ms, LOCALHOST, STORE_PORT, spec.reconsume_times,
        spec.prepared_transaction_offset, len(body),
    )
    return b"".join((
        header, body, TOPIC_LENGTH.pack(len(topic_b)), topic_b,
        PROPERTIES_LENGTH.pack(len(props_b)), props_b,
    ))


_HEADER_FORMAT = RECORD_HEADER.format.lstrip(">")
#: ``(body, topic, properties) length -> struct.Struct`` of a whole record (bounded)
_WHOLE_RECORD_LAYOUTS: dict[tuple[int, int, int], struct.Struct] = {}
_WHOLE_RECORD_LAYOUTS_KEPT = 4096


def whole_record_layout(body_length: int, topic_length: int,
                        properties_length: int) -> struct.Struct:
    """The ``struct.Struct`` of a whole v1 record with these lengths: the 88-byte header of
    :data:`RECORD_HEADER`, the body, TOPICLENGTH, the topic, PROPERTIESLENGTH, the
    properties; one ``pack`` writes a record (the single send's path).  Cached per lengths,
    up to 4,096 of them."""
    key = (body_length, topic_length, properties_length)
    found = _WHOLE_RECORD_LAYOUTS.get(key)
    if found is None:
        found = struct.Struct(f">{_HEADER_FORMAT}{body_length}sB{topic_length}sh"
                              f"{properties_length}s")
        if len(_WHOLE_RECORD_LAYOUTS) < _WHOLE_RECORD_LAYOUTS_KEPT:
            _WHOLE_RECORD_LAYOUTS[key] = found
    return found


class _LengthBytes(dict):
    """``n -> n`` as a big-endian i16 (a PROPERTIESLENGTH field), computed once per length."""

    def __missing__(self, n: int) -> bytes:
        value = self[n] = PROPERTIES_LENGTH.pack(n)
        return value


PROPERTIES_LENGTH_BYTES = _LengthBytes()


def gather_headers(buffer, buffer_size: int, positions: np.ndarray) -> np.ndarray:
    """The record headers at ``positions`` of a segment mapping, as :data:`HEADER_DTYPE` rows.

    Element ``i`` of a strided view is the 88 bytes from byte ``i``, so one fancy index
    gathers every header in a C loop (the caller keeps ``positions + HEADER_SIZE`` inside
    ``buffer_size``).
    """
    view = np.ndarray(shape=(buffer_size - HEADER_SIZE + 1,), dtype=_HEADER_VOID, buffer=buffer,
                      strides=(1,))
    return view[positions].view(HEADER_DTYPE)


def encode_blank(remaining: int) -> bytes:
    """The blank record that fills the ``remaining`` bytes at a segment's end."""
    return BLANK.pack(remaining, BLANK_MAGIC_CODE)


class RecordCheck:
    """Outcomes of :func:`check_record` besides a valid size."""

    INVALID = -1
    BLANK = -2


def check_record(buf, pos: int, limit: int, *, check_crc: bool = True) -> int:
    """Validate the record at ``buf[pos:]`` without decoding it.

    Returns its size when valid, :attr:`RecordCheck.BLANK` for an end-of-file blank and
    :attr:`RecordCheck.INVALID` for anything else (torn, zeroed, corrupt).
    """
    remaining = limit - pos
    if remaining <= 4:
        return RecordCheck.INVALID
    total, magic = BLANK.unpack_from(buf, pos) if remaining >= 8 else (0, 0)
    if magic == BLANK_MAGIC_CODE:
        return RecordCheck.BLANK if 8 <= total <= remaining else RecordCheck.INVALID
    if magic != MESSAGE_MAGIC_CODE_V1 or total < FIXED_SIZE or total > remaining:
        return RecordCheck.INVALID
    crc = struct.unpack_from(">i", buf, pos + FIELD_OFFSET["body_crc"])[0]
    body_len = struct.unpack_from(">i", buf, pos + FIELD_OFFSET["body_length"])[0]
    if body_len < 0 or HEADER_SIZE + body_len + 1 > total:
        return RecordCheck.INVALID
    tpos = pos + HEADER_SIZE + body_len
    topic_len = buf[tpos]
    ppos = tpos + 1 + topic_len
    if topic_len == 0 or ppos + 2 > pos + total:
        return RecordCheck.INVALID
    props_len = PROPERTIES_LENGTH.unpack_from(buf, ppos)[0]
    if props_len < 0 or record_size(body_len, topic_len, props_len) != total:
        return RecordCheck.INVALID
    # A write cut short (SIGKILL stops a large write between pages) leaves a zeroed suffix
    # that the body CRC does not cover.  A whole record never ends in a zero byte: properties
    # end with 0x02, and without properties the record ends with the (non-zero) topic.
    if buf[pos + total - 1 if props_len else ppos - 1] == 0:
        return RecordCheck.INVALID
    if check_crc and body_crc(bytes(buf[pos + HEADER_SIZE:pos + HEADER_SIZE + body_len])) != crc:
        return RecordCheck.INVALID
    return total


def decode_record(buf, pos: int, *, file: str = "commitlog", base_offset: int = 0) -> Record:
    """Decode the record at ``buf[pos:]``; raise :class:`CorruptRecordError` if it is not valid."""
    try:
        h = RECORD_HEADER.unpack_from(buf, pos)
        (total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts,
         born_host, born_port, store_ts, _store_host, _store_port, reconsume, prepared,
         body_len) = h
        if magic != MESSAGE_MAGIC_CODE_V1:
            raise CorruptRecordError(file, base_offset + pos, f"bad magic {magic & 0xFFFFFFFF:#x}")
        start = pos + HEADER_SIZE
        body = bytes(buf[start:start + body_len])
        tpos = start + body_len
        topic_len = buf[tpos]
        topic = bytes(buf[tpos + 1:tpos + 1 + topic_len]).decode("ascii")
        ppos = tpos + 1 + topic_len
        props_len = PROPERTIES_LENGTH.unpack_from(buf, ppos)[0]
        props = bytes(buf[ppos + 2:ppos + 2 + props_len])
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptRecordError(file, base_offset + pos, f"cannot decode: {exc}") from exc
    if record_size(body_len, topic_len, props_len) != total or len(body) != body_len:
        raise CorruptRecordError(file, base_offset + pos,
                                 f"length {total} does not match its fields")
    return Record(
        total_size=total, body_crc=crc, queue_id=queue_id, flag=flag, queue_offset=queue_offset,
        physical_offset=physical_offset, sys_flag=sys_flag, born_timestamp_ms=born_ts,
        born_host=bytes(born_host), born_port=born_port, store_timestamp_ms=store_ts,
        reconsume_times=reconsume, prepared_transaction_offset=prepared, body=body,
        topic=topic, properties=decode_properties(props),
    )
