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

**One stream kept open** (:data:`EXCHANGE_OP`, a ``DoExchange``; :class:`LogExchange` on the
follower): the descriptor's command holds the ticket's fields but ``from``, ``tail_crc`` and
``high_watermark``; the follower writes one row of :data:`REPORT_SCHEMA` per request (its
report), and the leader answers each as it answers a ticket, then writes an empty batch
(:data:`END_OF_ANSWER`).  A new Flight stream per report costs a round trip's setup and a
server thread's start; measured on loopback (2026-11-29, two loaded cores): a ``DoGet`` of one
small batch p50 0.72 ms, p99 12 to 23 ms, a report and its answer on an open exchange p50
0.36 to 0.47 ms, p99 0.7 to 8.7 ms.  A leader of an earlier version refuses the op: the
follower then asks with tickets, as before (and a follower of an earlier version asks a
leader of this one with tickets).  An exchange is opened again after
:data:`EXCHANGE_S` (so that its call's deadline, which catches a leader gone silent, is
bounded) and after any error.  A leader stopping waits for the calls in progress: an
exchange ends at the follower's next report (answered at once, then closed), but the report
of a follower cut off by a partition (not dead: its connection is not reset) never comes,
and the stop then waits for the exchange's deadline (:data:`EXCHANGE_S` plus the follower's
call timeout) as it would for any client's half-sent request.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pyarrow as pa
from pyarrow import flight

from ..core.replica_log import LogChunk, read_chunk
from .wire import InvalidRequest, dumps, field

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
#: The ``DoExchange`` op of a follower's stream kept open (see the module docstring).
EXCHANGE_OP = "replicate_exchange"
#: One row per request on it: the ticket's fields that change from one request to the next.
REPORT_SCHEMA = pa.schema([("from", pa.int64()), ("tail_crc", pa.int64()),
                           ("high_watermark", pa.int64())])
#: Ends each answer on the exchange (made of typed empty arrays: ``from_pylist`` would
#: import pandas, a second or more of every process's start).
END_OF_ANSWER = pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in CHUNK_SCHEMA],
                                           schema=CHUNK_SCHEMA)
#: Seconds an exchange is used before it is opened again.
EXCHANGE_S = 10.0


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


def exchange_requests(reader, body: dict):
    """The ``replicate`` requests of an exchange (the leader's side): ``body``, the
    descriptor's command, with each report row's fields, checked by :func:`parse_request`
    (one row per batch, else :class:`InvalidRequest`); ends with the follower's stream."""
    fixed = {k: v for k, v in body.items() if k not in ("op", "from", "tail_crc",
                                                          "high_watermark")}
    parse_request(dict(fixed, **{"from": 0, "tail_crc": 0}))  # (checked before any report)
    for chunk in reader:
        batch = chunk.data
        if batch is None:
            continue
        if batch.num_rows != 1 or batch.schema.names != REPORT_SCHEMA.names:
            raise InvalidRequest(f"{EXCHANGE_OP}: a report of {batch.num_rows} row(s) with "
                                 f"columns {batch.schema.names}; allowed: one row of "
                                 f"{REPORT_SCHEMA.names}")
        row = batch.to_pylist()[0]
        yield parse_request(dict(fixed, **row))


class LogExchange:
    """A follower's requests on one ``DoExchange`` kept open with its leader ``remote`` (a
    :class:`~store.remote.flight_client.RemoteStore`), or with tickets
    (:meth:`~store.remote.flight_client.RemoteStore.log_chunks`) when the leader does not
    know the op (an earlier version); see the module docstring."""

    def __init__(self, remote) -> None:
        self.remote = remote
        #: ``None``: not known yet; ``False``: the leader asks for tickets.
        self.supported: bool | None = None if hasattr(remote, "_connection") else False
        self._call = None  # (writer, reader, key, opened at)
        self._unread_end = False  # the last answer's end not read yet

    def close(self) -> None:
        call, self._call, self._unread_end = self._call, None, False
        if call is not None:
            with contextlib.suppress(Exception):  # (a stream already broken: nothing to close)
                call[0].close()

    def log_chunks(self, start: int, *, tail_crc: int, file_size: int, max_bytes: int,
                   wait_ms: int, replica: str | None = None,
                   high_watermark: int | None = None, epoch: int | None = None):
        """As :meth:`RemoteStore.log_chunks
        <store.remote.flight_client.RemoteStore.log_chunks>`: the batches of one answer."""
        if self.supported is False:
            yield from self.remote.log_chunks(
                start, tail_crc=tail_crc, file_size=file_size, max_bytes=max_bytes,
                wait_ms=wait_ms, replica=replica, high_watermark=high_watermark, epoch=epoch)
            return
        key = {"op": EXCHANGE_OP, "file_size": int(file_size), "max_bytes": int(max_bytes),
               "wait_ms": int(wait_ms)}
        if replica is not None:
            key["replica"] = replica
        if epoch is not None:
            key["epoch"] = int(epoch)
        fresh = not self._open_for(key)  # (no answer read on it yet: a refusal is said here)
        try:
            self._open(key, wait_ms)
            writer, reader = self._call[0], self._call[1]
            writer.write_batch(pa.RecordBatch.from_arrays(
                [pa.array([int(start)], pa.int64()), pa.array([int(tail_crc)], pa.int64()),
                 pa.array([high_watermark], pa.int64())], schema=REPORT_SCHEMA))
            if self._unread_end:  # (the answer before: its end, sent long ago)
                self._read_to_end(reader)
            self._unread_end = True
            while True:
                batch = reader.read_chunk().data
                if not batch.num_rows:
                    self._unread_end = False
                    return
                yield batch
                fresh = False
        except GeneratorExit:  # (the follower took what it needed: the end is read later)
            raise
        except flight.FlightError as exc:
            error = self._server_error(exc) if fresh else exc
            self.close()
            if fresh and "unknown exchange op" in str(error):
                self.supported = False  # (a leader of an earlier version: tickets)
                yield from self.log_chunks(
                    start, tail_crc=tail_crc, file_size=file_size, max_bytes=max_bytes,
                    wait_ms=wait_ms, replica=replica, high_watermark=high_watermark,
                    epoch=epoch)
                return
            self.remote._failed(error)
        except StopIteration:  # (the leader ended the stream: its shutdown)
            self.close()
        except BaseException:
            self.close()
            raise

    def _server_error(self, exc):
        """The error the leader ended a fresh exchange with (a write may fail first, with
        a message that does not say why)."""
        try:
            self._call[1].read_chunk()
        except flight.FlightError as error:
            return error
        except Exception:  # noqa: BLE001 - nothing more to learn: the first error stands
            return exc
        return exc

    def _open_for(self, key: dict) -> bool:
        """Whether an exchange for ``key`` is open and young enough to be used."""
        call = self._call
        return call is not None and call[2] == key and time.monotonic() - call[3] < EXCHANGE_S

    def _open(self, key: dict, wait_ms: int) -> None:
        """Open the exchange unless one for ``key`` is open and young."""
        if self._open_for(key):
            return
        self.close()
        remote = self.remote
        writer, reader = remote._connection().do_exchange(
            flight.FlightDescriptor.for_command(dumps(key)),
            remote._options(EXCHANGE_S + remote.timeout_s + wait_ms / 1000))
        self._call = (writer, reader, key, time.monotonic())  # (closed by close())
        writer.begin(REPORT_SCHEMA)

    @staticmethod
    def _read_to_end(reader) -> None:
        while reader.read_chunk().data.num_rows:
            pass
