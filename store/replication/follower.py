"""A follower: copies its leader's CommitLog as it grows, byte for byte, and builds its own
queues and indexes from it.

:class:`Follower` runs one thread beside a served store (``rmq serve --replica-set``): it asks
the leader for the CommitLog from its own end (:mod:`store.remote.replication_stream`), appends each chunk with
:func:`~store.core.replica_log.append_chunk` (checked as recovery checks the log, then
dispatched through the store's one dispatch path), and asks again.  After a restart it goes
on from its own end.  A leader that cannot be reached is asked again every
:data:`RETRY_S`; a leader that says this log is not a prefix of its own stops the follower
for good (:attr:`Follower.state` ``"diverged"``, with the leader's reason).  At each
(re)connection the leader's terms are handed to ``on_epochs`` first, which cuts a tail the
leader's history does not hold (:mod:`.truncation`); a replica that does not lead yet (or
no longer) is asked again: its terms are not taken, and it refuses to be copied.  Each
request names the leader's epoch as the follower took its terms: a leader named again in a
later epoch refuses it (``NotLeaderError``), and the follower takes its terms again at
once, before any byte of the new term (:mod:`store.remote.replication_stream`).  Each
request reports this replica's end (what it appended, synced as its flush mode says) to the
leader, which counts it for the writers waiting for their copies (:mod:`.acks`).  Each answer
tells the leader's high watermark, handed to ``on_watermark`` as each batch arrives (this
replica's readers see below it and below this replica's end, :mod:`.watermark`; it goes
back with the next request, and a leader whose watermark moved past it answers at once),
and the oldest CommitLog offset the leader keeps, handed to ``on_leader_min`` once the
answer is appended (this replica's retention follows the leader's).  Beside it,
``progress`` copies the leader's consumer progress on a thread of its own
(:mod:`.consumer_progress`).

**Lag**, while it runs: ``lag_bytes`` is the leader's confirmed CommitLog end (as the last
answer gave it) minus this store's end; ``lag_messages`` the messages of user topics the
leader holds past this store's queue ends, from the leader's queue snapshot (one call at
most every :data:`LAG_MESSAGES_S`, none while ``lag_bytes`` is 0).
"""

from __future__ import annotations

import logging
import threading
import time

from ..base.errors import NotLeaderError, ReplicaDivergedError, StoreError
from ..core.replica_log import append_chunk, tail_crc
from ..remote.replication_stream import LogExchange

log = logging.getLogger("store.replication")

#: Seconds between attempts to reach an unreachable leader.
RETRY_S = 0.2
#: How long the leader may wait for an append before answering (ms): the long poll.
WAIT_MS = 500
#: Bytes asked for per request.
REQUEST_BYTES = 64 << 20
#: Seconds between two counts of ``lag_messages``.
LAG_MESSAGES_S = 1.0


class Follower:
    """Copies ``leader`` (a :class:`~store.remote.flight_client.RemoteStore`) into ``store`` (an
    open :class:`~store.MessageStore`) on a thread, from :meth:`start` to :meth:`stop`."""

    def __init__(self, store, leader, on_epochs=None, me: str | None = None,
                 on_watermark=None, on_leader_min=None, progress=None) -> None:
        self.store = store
        self.leader = leader
        self.me = me  # this replica's URL, sent with each request (synchronous acks count it)
        self._on_epochs = on_epochs  # told the leader's terms at each (re)connection
        self._on_watermark = on_watermark or (lambda mark: None)
        self._on_leader_min = on_leader_min or (lambda offset: None)
        #: Copies the leader's consumer progress beside the log (a
        #: :class:`~.consumer_progress.ProgressCopy`, started and stopped with this), if any.
        self.progress = progress
        #: The leader's high watermark and oldest offset kept, as the last answer gave them.
        self.high_watermark: int | None = None
        self.leader_min: int | None = None
        self.state = "starting"
        self.error: str | None = None
        self.leader_end: int | None = None
        self.lag_messages: int | None = None
        self.last_contact_ms: int | None = None
        self.chunks = 0
        #: the leader's epoch when its terms were taken (sent with each request: a later
        #: term's bytes are refused until its terms are taken again)
        self.leader_epoch: int | None = None
        self._lag_counted = 0.0
        self._unread_end = None  # (see _take_answer)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rmq-follower", daemon=True)
        #: the requests: one stream kept open, or tickets for a leader of an earlier version
        self._log = LogExchange(leader)

    def start(self) -> Follower:
        self._thread.start()
        if self.progress is not None:
            self.progress.start()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop after the request in progress (the leader answers within :data:`WAIT_MS`)."""
        self._stop.set()
        if self.progress is not None:
            self.progress.stop()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if not self._thread.is_alive():  # (else its read of a leader cut off would hold this
            self._log.close()            # close until the stream's deadline)
        self.leader.close()

    # ------------------------------------------------------------------ status
    def lag_bytes(self) -> int | None:
        if self.leader_end is None:
            return None
        return max(0, self.leader_end - self.store.confirmed_offset())

    def status(self) -> dict:
        return {"state": self.state, "error": self.error, "leader_end": self.leader_end,
                "end": self.store.confirmed_offset(), "lag_bytes": self.lag_bytes(),
                "lag_messages": self.lag_messages, "last_contact_ms": self.last_contact_ms,
                "leader_high_watermark": self.high_watermark, "leader_min": self.leader_min,
                "chunks": self.chunks,
                **({} if self.progress is None else self.progress.status())}

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except ReplicaDivergedError as exc:
                self.state, self.error = "diverged", str(exc)
                log.error("stopped following %s: %s", self.leader.address.url, exc)
                return
            except NotLeaderError as exc:  # (a new term: its terms are taken again at once)
                log.info("following %s: %s", self.leader.address.url, exc)
                self._stop.wait(RETRY_S / 10)
            except StoreError as exc:
                if self.state != "unreachable" or self.error != str(exc):
                    log.warning("following %s: %s; retrying", self.leader.address.url, exc)
                self.state, self.error = "unreachable", str(exc)
                self._stop.wait(RETRY_S)
            except Exception as exc:  # a bug must not end the server: logged, retried
                log.exception("follower failed; retrying")
                self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
                self._stop.wait(RETRY_S * 5)

    def _follow(self) -> None:
        if self._on_epochs is not None:
            answer = self.leader.replica_epochs()
            if answer.get("role") not in (None, "leader"):  # (elected: not leading yet)
                raise StoreError(f"{self.leader.address.url} does not lead (yet): its terms "
                                 "are not taken, nor its log copied")
            self._on_epochs(answer)
            epoch = answer.get("epoch")
            self.leader_epoch = epoch if isinstance(epoch, int) else None
        try:
            while not self._stop.is_set():
                self._take_answer()
        finally:
            self._unread_end = None  # (dropped: its stream is closed, whatever its end said)

    def _take_answer(self) -> None:
        """One request and its answer, appended.  An answer whose last batch was applied
        (:func:`_is_last`) is kept with its stream's end unread, so that the next request
        (this replica's report, which writers may be waiting for) goes out without waiting
        for that end; it is dropped (its stream closed) once the next answer has come."""
        store = self.store
        offset = store.confirmed_offset()
        answer = iter(self._log.log_chunks(offset, tail_crc=tail_crc(store, offset),
                                          file_size=store.commit_log.file_size,
                                          max_bytes=REQUEST_BYTES, wait_ms=WAIT_MS,
                                          replica=self.me,
                                          high_watermark=self.high_watermark,
                                          epoch=self.leader_epoch))
        first = next(answer, None)  # (the leader's long poll: no lock held meanwhile)
        self._unread_end = None  # (the answer before: its stream's end came long ago)
        if first is not None and _has_data(first) and _is_last(first, first):
            self._apply(first)  # (one chunk: one append, which readers see whole)
            self._unread_end = answer
        elif first is not None and _has_data(first):
            # one answer is one atomic group: readers see it whole, as the leader's
            # readers saw each of its appends (it ends at a confirmed end of the leader's)
            with store.atomic_append():
                self._apply(first)
                batch = first
                while not _is_last(batch, first):
                    batch = next(answer, None)
                    if batch is None:
                        break
                    self._apply(batch)
            if batch is not None:
                self._unread_end = answer
        elif first is not None:  # (nothing new: the answer's last batch)
            self._apply(first)
            self._unread_end = answer
        if first is not None and self.leader_min is not None:
            self._on_leader_min(self.leader_min)
        self.state, self.error = "following", None
        self.last_contact_ms = store.now_ms()
        self._count_lag_messages()

    def _apply(self, batch) -> None:
        if batch.num_rows and "high_watermark" in batch.schema.names:  # (else: an earlier
            # version's leader; learned first: readers see below this replica's end anyway)
            self.high_watermark = int(batch.column("high_watermark")[0].as_py())
            self.leader_min = int(batch.column("leader_min")[0].as_py())
            self._on_watermark(self.high_watermark)
        offsets = batch.column("offset").to_pylist()  # (one row per chunk: a few per call)
        ends = batch.column("end").to_pylist()
        data = batch.column("data")
        for i, offset in enumerate(offsets):
            chunk = data[i].as_buffer()
            if chunk is not None and chunk.size:
                done = append_chunk(self.store, offset, chunk)  # (the batch's own bytes)
                if done.end != ends[i]:
                    raise ReplicaDivergedError(
                        f"the chunk at CommitLog offset {offset} ends at {done.end} here, at "
                        f"{ends[i]} on the leader")
                self.chunks += 1
        self.leader_end = int(batch.column("leader_end")[batch.num_rows - 1].as_py())

    def _count_lag_messages(self) -> None:
        if not self.lag_bytes():
            self.lag_messages = 0
            return
        now = time.monotonic()
        if now - self._lag_counted < LAG_MESSAGES_S:
            return
        self._lag_counted = now
        leader, behind = self.leader, 0
        leader.refresh()
        for topic in leader.topics():
            for queue_id in leader.queue_ids(topic):
                try:
                    mine = self.store.max_offset(topic, queue_id)
                except StoreError:  # a queue this replica has not seen yet
                    mine = 0
                behind += max(0, leader.max_offset(topic, queue_id) - mine)
        self.lag_messages = behind


def _is_last(batch, first) -> bool:
    """Whether ``batch`` (applied) ends its answer at a confirmed end of the leader's: it
    reaches the leader's confirmed end it tells, and the one the answer's ``first`` batch
    told (the leader's answer ends there, :mod:`store.remote.replication_stream`).  A leader
    that sent more would only see the follower ask again from there: each answer ends at a
    confirmed end, so stopping at one keeps the leader's atomic groups whole."""
    if batch.num_rows != 1:  # (one row per batch: anything else is read to its end)
        return False
    end = batch.column("end")[0].as_py()
    return end > batch.column("offset")[0].as_py() and end >= min(
        batch.column("leader_end")[0].as_py(), first.column("leader_end")[0].as_py())


def _has_data(batch) -> bool:
    """Whether a batch of the answer carries log bytes (a chunk ending past its start)."""
    return batch.num_rows > 0 and batch.column("end")[0].as_py() > batch.column("offset")[0].as_py()
