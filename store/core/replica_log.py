"""The CommitLog copied byte for byte between replicas: what a leader sends, what a follower
appends.

A follower holds the same CommitLog as its leader: the same bytes at the same offsets, so the
same message ids (an offset id names the CommitLog offset), and builds its ConsumeQueues and
message-key index from those records as RocketMQ's slaves do.

* :func:`read_chunk` (leader, any :class:`~store.core.reading.ReadableStore`): the whole
  records of one segment from an offset, up to the confirmed end and a byte bound, copied out
  of the mapped segment in one slice (the records found by one compiled walk; an
  end-of-segment BLANK travels as its 8 bytes, and the chunk then ends at the next
  segment).
* :func:`tail_crc` (both sides): the CRC32 of the last bytes before an offset, inside its
  segment; a follower sends its own with each request and the leader compares it with its
  bytes, so a follower whose log is not a prefix of the leader's is refused
  (:class:`~store.base.errors.ReplicaDivergedError`) instead of appending after a different
  history.
* :func:`append_chunk` (follower, a :class:`~store.core.store_core.StoreCore`): the chunk
  is checked before anything is written, with the checks recovery runs on the log (magic,
  sizes, body CRC: :func:`~store.kernels.recovery_scan.index_records`), plus each record's
  physical offset against where it lands; then, under the append lock, appended through the
  appender's one way down (:meth:`~store.core.appender.Appender.commit`: mark, write,
  sync, dispatch, publish), its queue entries computed as recovery computes them
  (:func:`~store.core.recovery.index_entries`) and required to continue each queue of the
  follower exactly.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from ..base.errors import ReplicaDivergedError, ReplicationError
from ..formats.record_codec import BLANK, BLANK_MAGIC_CODE, FIELD_OFFSET, FIXED_SIZE
from ..kernels.recovery_scan import index_records
from ..kernels.segment_walk import STOP_BLANK, walk_records
from .index_commit import INDEX_COMMIT_TOPIC, marker_rows
from .recovery import index_entries

#: Bytes before an offset whose CRC a follower sends (:func:`tail_crc`).
TAIL_CHECK_BYTES = 4096
#: A chunk of at most this many bytes is appended under a lease on the store's ``flock``
#: (:mod:`~store.core.lock_lease`), as a single send is.
LEASE_CHUNK_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Whole records of one segment: ``data`` starts at CommitLog offset ``offset``; the
    log goes on at ``end`` (the next segment's start after a BLANK); ``leader_end`` is the
    sender's confirmed end when it read them."""

    offset: int
    data: bytes
    end: int
    leader_end: int


@dataclass(frozen=True, slots=True)
class ChunkAppend:
    """What :func:`append_chunk` appended: the log's new end, the records and the store
    time of the last one (``None``: only a BLANK)."""

    end: int
    records: int
    last_store_timestamp_ms: int | None


def tail_crc(store, offset: int, size: int = TAIL_CHECK_BYTES) -> int:
    """CRC32 of the bytes of ``store``'s CommitLog in ``[max(segment start, offset - size),
    offset)``, the segment before for an offset at a segment's start (0 at offset 0)."""
    file_size = store.commit_log.file_size
    lo = max(offset - offset % file_size if offset % file_size else offset - file_size,
             offset - size)
    if offset <= 0 or lo >= offset:
        return 0
    f = store.commit_log.files.find(lo)
    if f is None:
        raise ReplicationError(f"no CommitLog segment of {store.root} holds offset {lo}")
    return zlib.crc32(f.buffer()[lo - f.start:offset - f.start])


def read_chunk(store, offset: int, max_bytes: int, *, follower_crc: int | None = None,
               file_size: int | None = None) -> LogChunk:
    """Whole records from ``offset`` (see the module docstring); an empty chunk when the log
    holds nothing past it yet.

    ``follower_crc``: the asker's :func:`tail_crc` at ``offset``, compared with this log's;
    ``file_size``: the asker's segment size, which must be this log's.

    Raises
    ------
    ReplicaDivergedError
        ``offset`` lies past this log's confirmed end or is no record's start, or the bytes
        before it differ.
    ReplicationError
        Different segment sizes, or ``offset`` lies below the oldest segment kept.
    """
    log = store.commit_log
    if file_size is not None and file_size != log.file_size:
        raise ReplicationError(
            f"the follower's CommitLog segments are {file_size} bytes, the leader's "
            f"{log.file_size}; allowed: replicas with the same commitlog_file_size_bytes")
    confirmed = store.confirmed_offset()
    if offset > confirmed:
        raise ReplicaDivergedError(
            f"the follower's CommitLog ends at {offset}, past the leader's end {confirmed}: "
            "its log is not a prefix of the leader's; allowed: a follower whose log the "
            "leader's extends (cut its tail or start it empty)")
    if offset > 0 and offset < log.min_offset():
        raise ReplicationError(
            f"the follower asks for CommitLog offset {offset}, below the leader's oldest kept "
            f"segment ({log.min_offset()}); allowed: offsets the leader still holds (start "
            "the follower from an empty directory)")
    if follower_crc is not None and follower_crc != tail_crc(store, offset):
        raise ReplicaDivergedError(
            f"the follower's CommitLog differs from the leader's in the bytes before offset "
            f"{offset}: its log is not a prefix of the leader's; allowed: a follower whose "
            "log the leader's extends")
    if offset == confirmed:
        return LogChunk(offset, b"", offset, confirmed)
    f = log.files.find(offset)
    if f is None:
        raise ReplicationError(f"no CommitLog segment of {store.root} holds offset {offset}")
    raw = np.frombuffer(f.buffer(), dtype=np.uint8)
    pos = offset - f.start
    seg_limit = min(f.size, confirmed - f.start)
    limit = min(seg_limit, pos + max(int(max_bytes), FIXED_SIZE))
    found, _, end, stop = walk_records(raw, pos, limit, check_crc=False,
                                       max_records=(limit - pos) // FIXED_SIZE + 1)
    if not len(found) and stop != STOP_BLANK:  # one record larger than the bound: send it
        found, _, end, stop = walk_records(raw, pos, seg_limit, check_crc=False, max_records=1)
    if stop == STOP_BLANK:  # (the records, then the blank that ends the segment)
        return LogChunk(offset, raw[pos:end + BLANK.size].tobytes(), f.end, confirmed)
    if not len(found):
        raise ReplicaDivergedError(
            f"the follower's CommitLog ends at {offset}, which is no record's start in the "
            "leader's: its log is not a prefix of the leader's")
    return LogChunk(offset, raw[pos:end].tobytes(), f.start + end, confirmed)


@dataclass(frozen=True, slots=True)
class _Checked:
    raw: np.ndarray
    index: object
    absolute: np.ndarray
    end: int


def check_chunk(file_size: int, offset: int, data) -> _Checked:
    """``data`` (to be appended at ``offset``) checked as recovery checks the log: whole
    valid records (body CRC included), each naming ``offset`` plus its position as its
    physical offset, optionally closed by the BLANK that ends the segment; inside one
    segment.  :class:`ReplicationError` says what is wrong; nothing is written."""
    seg_pos = offset % file_size
    if offset < 0 or seg_pos + len(data) > file_size or not data:
        raise ReplicationError(f"a chunk of {len(data)} bytes at CommitLog offset {offset}; "
                               f"allowed: 1 or more bytes inside one {file_size}-byte segment")
    raw = np.frombuffer(data, dtype=np.uint8)
    records_end, end = len(raw), offset + len(raw)
    if len(raw) >= BLANK.size:
        size, magic = BLANK.unpack_from(data, len(raw) - BLANK.size)
        if magic == BLANK_MAGIC_CODE and size == file_size - (seg_pos + len(raw) - BLANK.size):
            records_end, end = len(raw) - BLANK.size, offset - seg_pos + file_size
    index, walked, _ = index_records(raw, 0, records_end,
                                     max_records=records_end // FIXED_SIZE + 1)
    if walked != records_end:
        raise ReplicationError(
            f"the chunk at CommitLog offset {offset} fails the record checks at offset "
            f"{offset + walked} (magic, size or body CRC); nothing of it was appended")
    positions = index.positions
    # every 8 bytes of the chunk as a big-endian int64 starting at each byte (a view, no
    # copy): one gather reads each record's physical offset
    words = np.ndarray((max(0, len(raw) - 7),), dtype=">i8", buffer=raw, strides=(1,))
    physical = words[positions + FIELD_OFFSET["physical_offset"]]
    bad = np.flatnonzero(physical != offset + positions)
    if len(bad):
        raise ReplicationError(
            f"the record at CommitLog offset {offset + int(positions[bad[0]])} names physical "
            f"offset {int(physical[bad[0]])}; allowed: the offset it is appended at")
    return _Checked(raw, index, offset + positions, end)


def append_chunk(core, offset: int, data) -> ChunkAppend:
    """Append a leader's chunk at ``offset``, the end of ``core``'s log (see the module
    docstring); ``data``: bytes, or any contiguous bytes-like object (an Arrow buffer: not
    copied first); :class:`ReplicaDivergedError` when ``offset`` is not that end or the
    records do not continue this store's queues, :class:`ReplicationError` when they fail a
    check."""
    checked = check_chunk(core.commit_log.file_size, offset, data)
    index = checked.index
    # (a small chunk, a synchronous single send's, keeps the flock for the next as a single
    # send does: no flock and no directory identity check per chunk)
    with core.write_lock(lease=len(checked.raw) <= LEASE_CHUNK_BYTES):
        appender = core.appender
        if appender.write_offset != offset:
            raise ReplicaDivergedError(
                f"a chunk for CommitLog offset {offset}, but this replica's log ends at "
                f"{appender.write_offset}; allowed: chunks that continue the log")
        rows, dropped = index_entries(core, checked.raw, index, checked.absolute)
        if dropped:
            raise ReplicationError(
                f"{dropped} record(s) of the chunk at CommitLog offset {offset} name an "
                "impossible queue or queue offset; nothing of it was appended")
        markers = rows.get((INDEX_COMMIT_TOPIC, 0))

        def queue_entries():  # (after the chunk is written: a marker's staged records are
            if markers is not None:  # read through it, as recovery reads them)
                for key, table in marker_rows(core, markers[:, 1]).items():
                    if key in rows:
                        table = np.concatenate((rows[key], table))
                        table = table[np.argsort(table[:, 0], kind="stable")]
                    rows[key] = table
            entries = {}
            for key, table in rows.items():
                core.ensure_topic(key[0])
                first = appender.next_queue_offset(key)
                if int(table[0, 0]) != first:
                    raise ReplicaDivergedError(
                        f"the chunk at CommitLog offset {offset} continues queue {key[1]} of "
                        f"{key[0]!r} at offset {int(table[0, 0])}, but this replica's queue "
                        f"ends at {first}: its queues are not the leader's")
                entries[key] = (first, table[:, 1], table[:, 2], table[:, 3])
            return entries

        if markers is None:
            entries = queue_entries()  # (checked before anything is written)
        last_ts = int(index.store_timestamps[-1]) if len(index) else None
        appender.commit([(offset, data)], queue_entries if markers is not None else entries,
                        checked.end, last_ts if last_ts is not None else core.now_ms(),
                        copy=True)
        for key, table in rows.items():
            appender.queue_next[key] = int(table[-1, 0]) + 1
    return ChunkAppend(checked.end, len(index), last_ts)
