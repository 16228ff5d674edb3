"""The replication stream, both ends: a leader's answer to ``replicate`` and a follower's
request for it.

A follower asks with a ``DoGet`` ticket (JSON)::

    {"op": "replicate", "from": <its CommitLog end>, "tail_crc": <CRC32 of its last bytes>,
     "file_size": <its segment size>, "max_bytes": <bound on the answer>,
     "wait_ms": <how long to wait when nothing is new>,
     "replica": <the follower's URL, optional>,
     "high_watermark": <the leader's high watermark as the follower last heard, optional>,
     "epoch": <the leader's epoch as the follower took its terms, optional>}

``from`` is also the follower's report of what it holds (appended, and synced when its flush
mode is ``SYNC_FLUSH``): a leader with ``min_insync_replicas`` above 1 counts it for the
writers waiting (:mod:`store.replication.acks`) under the follower's ``replica`` URL.

and gets batches of :data:`CHUNK_SCHEMA`, one row each (each row also carries the leader's
``high_watermark``, :mod:`store.replication.watermark`, and ``leader_min``, the oldest
CommitLog offset it keeps, which a follower's retention follows; both as the row was sent):
a chunk of whole records copied from the leader's mapped segments
(:func:`~store.core.replica_log.read_chunk`), at most :data:`CHUNK_BYTES` each (a larger
single record travels alone), in order, until ``max_bytes`` were sent or the follower is
caught up. When nothing is new the leader waits up to ``wait_ms`` for an append (a long
poll, checking its confirmed end every :data:`POLL_S`), unless its high watermark is past
the one the follower last heard (then it answers at once, so that the follower's readers see
what its report just made safe); the last batch always tells the leader's confirmed end, an
empty chunk when nothing more was there. The follower then asks again from its new end.

An answer ends at a confirmed end of the leader's (the one it had when the answer began,
or a later one), never inside an append, unless ``max_bytes`` came first: the follower
appends each answer as one atomic group, so its readers see the leader's atomic groups
(a sink commit, a transaction end) whole, but for an answer cut by its bound (a follower
more than ``max_bytes`` behind).

A follower copies a term's bytes only once it holds the term: a request made under another
epoch than the leader's is refused (``NotLeaderError``: the follower takes the terms again,
at once), and an answer never goes past the start of a term begun after its request was
taken (the voters may name the same leader again in a later epoch while its followers'
connections go on).

Every field is checked before the log is read (:class:`~store.remote.wire.InvalidRequest`
names it); a follower whose log is not a prefix of the leader's is refused
(:class:`~store.base.errors.ReplicaDivergedError`).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa

from ..core.replica_log import LogChunk, read_chunk
from .wire import InvalidRequest, field

#: One row per chunk.
CHUNK_SCHEMA = pa.schema([("offset", pa.int64()), ("end", pa.int64()),
                          ("leader_end", pa.int64()), ("data", pa.binary()),
                          ("high_watermark", pa.int64()), ("leader_min", pa.int64())])
#: Bytes of one chunk (one Arrow batch), at most.
CHUNK_BYTES = 4 << 20
#: The most bytes one request may ask for, and the longest wait it may ask for.
MAX_REQUEST_BYTES = 256 << 20
MAX_WAIT_MS = 10_000
#: How often a waiting leader looks at its confirmed end (s).
POLL_S = 0.002


class AppendSignal:
    """Wakes the leader's waiting ``replicate`` answers when a writer needs its append copied
    (a sequence number and a condition)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.seq = 0

    def notify(self) -> None:
        with self._cond:
            self.seq += 1
            self._cond.notify_all()

    def pause(self, seen: int, timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, or until :meth:`notify` was called after ``seen`` (the
        :attr:`seq` read before the caller looked at the log)."""
        with self._cond:
            self._cond.wait_for(lambda: self.seq != seen, timeout_s)


def chunk_batch(chunk: LogChunk, marks: tuple[int, int] | None = None) -> pa.RecordBatch:
    """One chunk as a batch of :data:`CHUNK_SCHEMA`; ``marks``: the leader's high watermark
    and oldest offset kept (default: its confirmed end, as the chunk says, and 0)."""
    high, low = marks if marks is not None else (chunk.leader_end, 0)
    # built from buffers: the chunk's bytes are not copied again (up to CHUNK_BYTES each),
    # and a one-row batch costs a third of what ``pa.array`` of Python lists costs
    ints = pa.py_buffer(np.array([chunk.offset, chunk.end, chunk.leader_end, high, low],
                                 dtype=np.int64))
    offset, end, leader_end, high_col, low_col = (
        pa.Array.from_buffers(pa.int64(), 1, [None, ints], offset=i) for i in range(5))
    data = pa.Array.from_buffers(pa.binary(), 1, [
        None, pa.py_buffer(np.array([0, len(chunk.data)], dtype=np.int32)),
        pa.py_buffer(chunk.data)])
    return pa.RecordBatch.from_arrays([offset, end, leader_end, data, high_col, low_col],
                                      schema=CHUNK_SCHEMA)


def parse_request(body: dict) -> dict:
    """The fields of a ``replicate`` ticket, checked (:class:`InvalidRequest` otherwise)."""
    what = "replicate"
    request = {"from": field(body, "from", int, what),
               "tail_crc": field(body, "tail_crc", int, what),
               "file_size": field(body, "file_size", int, what),
               "max_bytes": field(body, "max_bytes", int, what, default=64 << 20),
               "wait_ms": field(body, "wait_ms", int, what, default=0),
               "replica": field(body, "replica", str, what, optional=True),
               "high_watermark": field(body, "high_watermark", int, what, optional=True),
               "epoch": field(body, "epoch", int, what, optional=True)}
    if request["from"] < 0:
        raise InvalidRequest(f"{what}: from={request['from']}; allowed: 0 or more")
    if not 0 <= request["tail_crc"] <= 0xFFFFFFFF:
        raise InvalidRequest(f"{what}: tail_crc={request['tail_crc']}; allowed: 0 to 2**32-1")
    if request["file_size"] < 1:
        raise InvalidRequest(f"{what}: file_size={request['file_size']}; allowed: 1 or more")
    if not 1 <= request["max_bytes"] <= MAX_REQUEST_BYTES:
        raise InvalidRequest(f"{what}: max_bytes={request['max_bytes']}; allowed: 1 to "
                             f"{MAX_REQUEST_BYTES}")
    if not 0 <= request["wait_ms"] <= MAX_WAIT_MS:
        raise InvalidRequest(f"{what}: wait_ms={request['wait_ms']}; allowed: 0 to "
                             f"{MAX_WAIT_MS}")
    return request


def clipped(chunk: LogChunk, at: int | None) -> LogChunk:
    """``chunk`` without its bytes from CommitLog offset ``at`` on (``None``: all of it);
    ``at`` is a record's start (a term's)."""
    if at is None or chunk.end <= at:
        return chunk
    keep = max(0, at - chunk.offset)
    return LogChunk(chunk.offset, chunk.data[:keep], chunk.offset + keep, chunk.leader_end)


def first_chunk(reader, request: dict, stopping=lambda: False,
                signal: AppendSignal | None = None, checked=lambda: None,
                marks=None, bound=lambda: None) -> LogChunk:
    """The first chunk of an answer: checked against the follower's tail, waiting up to
    ``wait_ms`` for an append when nothing is new (``stopping()``: give up early;
    ``signal``: woken at once by a writer waiting for its copies, :mod:`.acks`;
    ``checked()``: called once the follower's log is known to be a prefix of this one, so
    that only such a follower's end is counted as holding this log, and before the wait;
    ``marks()``: the leader's high watermark and oldest offset: no wait when the watermark
    is past the one the follower last heard; ``bound()``: where a term begun since the
    request was taken starts, ``None`` while none did: no byte from there on is sent)."""
    seen = signal.seq if signal is not None else 0
    chunk = clipped(read_chunk(reader, request["from"], min(CHUNK_BYTES, request["max_bytes"]),
                               follower_crc=request["tail_crc"],
                               file_size=request["file_size"]), bound())
    checked()
    heard = request.get("high_watermark")
    if marks is not None and heard is not None and marks()[0] > heard:
        return chunk  # (news for the follower's readers: answered at once)
    deadline = time.monotonic() + request["wait_ms"] / 1000
    while not chunk.data and time.monotonic() < deadline and not stopping():
        if signal is None:
            time.sleep(POLL_S)
        else:
            signal.pause(seen, POLL_S)
            seen = signal.seq
        if reader.confirmed_offset() != chunk.offset:
            chunk = clipped(read_chunk(reader, request["from"],
                                       min(CHUNK_BYTES, request["max_bytes"])), bound())
    return chunk


def answer(reader, request: dict, first: LogChunk, marks=None, bound=lambda: None):
    """The batches of an answer from ``first`` on (see the module docstring); ``marks()``:
    the leader's high watermark and oldest offset kept, sent with each batch; ``bound``: as
    :func:`first_chunk`'s."""
    chunk, sent = first, 0
    while True:
        yield chunk_batch(chunk, None if marks is None else marks())
        sent += len(chunk.data)
        if not chunk.data or sent >= request["max_bytes"] or chunk.end >= min(
                chunk.leader_end, first.leader_end):
            return  # (at a confirmed end, unless the bound came first: see the module doc)
        chunk = clipped(read_chunk(reader, chunk.end,
                                   min(CHUNK_BYTES, request["max_bytes"] - sent)), bound())
