"""Consumer groups of the gRPC endpoint: receive, invisibility, ack (RocketMQ 5's "pop").

A consumer group reads a topic's queues on its own, beside any Spark query.  For each
(group, topic, queue) it keeps:

* ``committed``: every offset below it is acked.  It is the group's progress on disk, in
  ``config/consumerOffset.json`` in RocketMQ's format (``{"offsetTable": {"topic@group":
  {queue: offset}}}``), written atomically at most every :data:`SAVE_INTERVAL_S` and on
  close;
* ``next``: offsets below it were handed out at least once;
* the **leases** of messages handed out and not acked: offset -> (visible again at, attempt,
  epoch).  A leased message is invisible until its time; then the next receive hands it out
  again with the attempt counted up (at-least-once);
* the offsets acked out of order, until ``committed`` passes them; saved with the offsets,
  in ``config/rmq_consumer_acks.json``, so that a restart does not hand them out again.

**What a group reads.**  Messages are handed out only below the store's visible end
(:meth:`~store.core.reading.ReadableStore.visible_offset`).  A replica's endpoint reads
through a :class:`~store.StoreReader` of the store whose read bound is the replica's high
watermark (:meth:`ConsumerGroups.read_below`), as the Flight face's readers do: on a leader
with synchronous replication, a message is handed out only once ``min_insync_replicas``
replicas hold it, so that no change of leader takes back a message a consumer got.  The
leases are this replica's alone; the committed offsets and acks are copied by the
followers from the files (:mod:`store.replication.consumer_progress`), and a follower that
comes to lead takes the newest copy (:meth:`ConsumerGroups.take_role`): after a change of
leader what was in flight, and what was acked since the last copy, is handed out again (at
least once).

Leases live in memory: after a restart every unacked message from ``committed`` on is handed
out again at once.  Acks reach the disk within :data:`SAVE_INTERVAL_S`: an ack that a crash
(SIGKILL) caught before its save is lost, and its message handed out again (at least once,
as RocketMQ promises); a clean stop saves everything.

A **receipt handle** names one hand-out: ``rmq1.<queue>.<offset>.<epoch>.<visible-at>``.  An
ack or a change of invisibility with a handle of an earlier hand-out, or after the message
became visible again, is refused (``INVALID_RECEIPT_HANDLE``), as RocketMQ refuses expired
handles.  A FIFO group gets a queue's messages in order: nothing of a queue is handed out
while an earlier message of it is leased.  A message handed out ``max_attempts`` times is
moved to the group's dead-letter topic ``%DLQ%<group>`` instead of a further hand-out.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from ..base.errors import OffsetOutOfRangeError, StoreError, UnknownTopicError
from ..facade.store_reader import StoreReader
from ..files.consumer_progress import (
    ACKS_FILE,
    OFFSETS_FILE,
    ConsumerProgress,
    read_progress,
    write_progress,
)
from ..formats.message import MessageView
from .convert import Code, Refused

log = logging.getLogger("store.proxy")

#: Longest time the group offsets stay unsaved after an ack (seconds).
SAVE_INTERVAL_S = 0.2
#: RocketMQ's default: a message is handed out at most this many times, then dead-lettered.
MAX_DELIVERY_ATTEMPTS = 16
HANDLE_PREFIX = "rmq1"


@dataclass(slots=True)
class Lease:
    visible_at_ms: int
    attempt: int
    epoch: int


@dataclass(slots=True)
class QueueProgress:
    committed: int
    next: int
    leases: dict[int, Lease] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)

    def advance(self) -> bool:
        """Move ``committed`` past acked offsets; whether it moved."""
        start = self.committed
        while self.committed in self.acked:
            self.acked.discard(self.committed)
            self.committed += 1
        return self.committed != start


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed out: the stored message, its handle, its attempt."""

    view: MessageView
    handle: str
    attempt: int
    invisible_ms: int


@dataclass(frozen=True, slots=True)
class Handle:
    queue_id: int
    offset: int
    epoch: int
    visible_at_ms: int

    def text(self) -> str:
        return f"{HANDLE_PREFIX}.{self.queue_id}.{self.offset}.{self.epoch}.{self.visible_at_ms}"

    @classmethod
    def parse(cls, text: str) -> Handle:
        parts = text.split(".")
        try:
            if len(parts) != 5 or parts[0] != HANDLE_PREFIX:
                raise ValueError
            q, o, e, v = (int(p) for p in parts[1:])
        except ValueError:
            raise Refused(Code.INVALID_RECEIPT_HANDLE,
                          f"receipt handle {text[:80]!r} is not one this server gave") from None
        return cls(q, o, e, v)


def tag_filter(expression: str | None):
    """A predicate on a message's tag for a TAG filter (``*``, ``a || b``)."""
    text = (expression or "").strip()
    if text in ("", "*"):
        return None
    tags = {t.strip() for t in text.split("||")}
    tags.discard("")
    if not tags:
        raise Refused(Code.ILLEGAL_FILTER_EXPRESSION,
                      f"filter {expression!r}; allowed: '*' or tags joined by '||'")
    return tags.__contains__


class ConsumerGroups:
    """The groups' progress over one store (see the module docstring); thread-safe."""

    def __init__(self, store, *, max_attempts: int = MAX_DELIVERY_ATTEMPTS) -> None:
        self.store = store
        #: What the groups read messages from (under ``_lock``): the store itself, or a
        #: reader of it bounded by a replica's high watermark (:meth:`read_below`).
        self._reads = store
        self.max_attempts = max_attempts
        self.path = os.path.join(store.root, OFFSETS_FILE)
        self.acks_path = os.path.join(store.root, ACKS_FILE)
        self._lock = threading.Lock()
        self._progress: dict[tuple[str, str, int], QueueProgress] = {}
        self._saved: dict[tuple[str, str, int], int] = {}
        self._saved_acks: dict[tuple[str, str, int], set[int]] = {}
        self._load()
        self._dirty = False
        self._epoch = store.now_ms() * 1000
        self._cursor = 0
        self._closed = threading.Event()
        self._saver = threading.Thread(target=self._save_loop, name="rmq-grpc-offsets",
                                       daemon=True)
        self._saver.start()

    # -- persistence ----------------------------------------------------------------------
    def _load(self) -> None:
        """Take the progress in the files (under ``_lock`` once the groups serve)."""
        held = read_progress(self.store.root)
        self._saved = dict(held.offsets)
        self._saved_acks = {key: set(acked) for key, acked in held.acks.items()}

    def save(self) -> None:
        """Write the committed offsets and the acks above them now (if any changed)."""
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            for key, p in self._progress.items():
                self._saved[key] = p.committed
                self._saved_acks[key] = set(p.acked)
            progress = ConsumerProgress(dict(self._saved), {
                key: frozenset(acked) for key, acked in self._saved_acks.items()})
        try:
            write_progress(self.store.root, progress)
        except OSError as exc:  # retried at the next save; the acks stay in memory
            log.error("saving consumer offsets to %s failed: %s", self.path, exc)
            with self._lock:
                self._dirty = True

    def take_role(self, role: str) -> None:
        """A replica set's change of role (``"leader"`` or ``"follower"``; called by the
        replica under the store's append lock, :mod:`store.replication.replica`).

        A follower's groups are its leader's (their calls go there), and their progress
        comes as copies into the files (:mod:`store.replication.consumer_progress`): what
        this replica held in memory, leases and acks, is dropped, unsaved.  A new leader
        takes the newest copy from the files, each committed offset no further than its
        queue's end in this log (an offset copied past what this log holds would skip the
        messages the new leader stores there); leases start afresh (what was in flight on
        the old leader is handed out again)."""
        with self._lock:
            self._progress.clear()
            self._dirty = False
            if role != "leader":
                return
            self._load()
            for key, offset in list(self._saved.items()):
                group, topic, q = key
                try:
                    end = self.store.max_offset(topic, q)
                except StoreError:  # a queue this log does not hold (yet)
                    end = 0
                if offset > end:  # (saved too: a restart must not take the copy again)
                    self._saved[key] = end
                    self._saved_acks.pop(key, None)
                    self._dirty = True
                    log.warning("group %s on %s/%d: the copied offset %d is past this "
                                "log's end %d; it goes on from there", group, topic, q,
                                offset, end)

    def _save_loop(self) -> None:
        while not self._closed.wait(SAVE_INTERVAL_S):
            self.save()

    def close(self) -> None:
        self._closed.set()
        self._saver.join(timeout=5)
        self.save()
        with self._lock:
            reads, self._reads = self._reads, self.store
        if reads is not self.store:
            reads.close()

    def read_below(self, read_bound) -> None:
        """Hand out only messages below ``read_bound()`` from now on (a CommitLog offset;
        ``None`` from it: the store's whole confirmed log), a replica's high watermark
        (:meth:`~store.replication.replica.Replica.high_watermark`): the groups read
        through a reader of the store with that read bound, as the Flight face's readers
        (:attr:`~store.core.reading.ReadableStore.read_bound`)."""
        reader = StoreReader.open(self.store.root, self.store.config)
        reader.read_bound = read_bound
        with self._lock:
            old, self._reads = self._reads, reader
        if old is not self.store:
            old.close()

    # -- state --------------------------------------------------------------------------
    def _queue(self, group: str, topic: str, q: int) -> QueueProgress:
        key = (group, topic, q)
        p = self._progress.get(key)
        if p is None:
            low = self._reads.min_offset(topic, q)
            start = self._saved.get(key, low)
            start = max(start, low)  # retention removed what the group never read
            acked = {o for o in self._saved_acks.get(key, ()) if o >= start}
            p = self._progress[key] = QueueProgress(start, start, acked=acked)
            if p.advance():
                self._dirty = True
        return p

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offset of each queue of ``topic`` it has read."""
        with self._lock:
            return {q: p.committed for (g, t, q), p in self._progress.items()
                    if g == group and t == topic}

    # -- receive ------------------------------------------------------------------------
    def receive(self, group: str, topic: str, *, batch: int, invisible_ms: int,
                tags=None, fifo: bool = False, dead_letter=None) -> list[Delivery]:
        """Hand out up to ``batch`` visible messages of ``topic`` to ``group``.

        ``tags``: a predicate on the tag (:func:`tag_filter`); a message it refuses is acked
        for the group at once.  ``dead_letter(view)`` stores a message handed out
        ``max_attempts`` times in the dead-letter topic (then it is acked).
        """
        out: list[Delivery] = []
        with self._lock:
            try:
                queues = self._reads.queue_ids(topic)
            except UnknownTopicError:  # nothing was sent to it yet
                return out
            now = self.store.now_ms()
            self._cursor += 1
            order = queues[self._cursor % len(queues):] + queues[:self._cursor % len(queues)]
            for q in order:
                if len(out) >= batch:
                    break
                p = self._queue(group, topic, q)
                self._receive_queue(p, group, topic, q, batch - len(out), invisible_ms, now,
                                    tags, fifo, dead_letter, out)
        return out

    def _receive_queue(self, p: QueueProgress, group: str, topic: str, q: int, room: int,
                       invisible_ms: int, now: int, tags, fifo: bool, dead_letter,
                       out: list[Delivery]) -> None:
        if fifo and any(lease.visible_at_ms > now for lease in p.leases.values()):
            return  # an earlier message of this queue is still being consumed
        due = sorted(o for o, lease in p.leases.items() if lease.visible_at_ms <= now)
        for offset in due:
            if room <= 0:
                return
            views = self._pull(topic, q, offset, 1)
            if not views:  # retention removed it: nothing left to deliver
                del p.leases[offset]
                p.acked.add(offset)
                continue
            lease = p.leases[offset]
            if lease.attempt >= self.max_attempts and dead_letter is not None:
                dead_letter(views[0])
                del p.leases[offset]
                p.acked.add(offset)
                continue
            out.append(self._lease(p, q, views[0], lease.attempt + 1, invisible_ms, now))
            room -= 1
            if fifo:
                return
        if fifo and due:
            return
        end = self._reads.max_offset(topic, q)
        while room > 0 and p.next < end:
            views = self._pull(topic, q, p.next, min(room, end - p.next, 32))
            if not views:
                if p.next < self._reads.min_offset(topic, q):  # retention moved past us
                    p.next = p.committed = self._reads.min_offset(topic, q)
                    continue
                break
            for view in views:
                p.next = view.queue_offset + 1
                if view.queue_offset in p.acked or view.queue_offset < p.committed:
                    continue  # acked before a restart
                if tags is not None and not tags(view.tags):
                    p.acked.add(view.queue_offset)
                    continue
                out.append(self._lease(p, q, view, 1, invisible_ms, now))
                room -= 1
                if fifo:
                    room = 0
                    break
        if p.advance():
            self._dirty = True

    def _pull(self, topic: str, q: int, offset: int, n: int) -> list[MessageView]:
        try:
            return self._reads.pull(topic, q, offset, n)
        except OffsetOutOfRangeError:
            return []
        except StoreError as exc:
            log.error("reading %s/%d at %d for a consumer failed: %s", topic, q, offset, exc)
            return []

    def _lease(self, p: QueueProgress, q: int, view: MessageView, attempt: int,
               invisible_ms: int, now: int) -> Delivery:
        epoch = self._next_epoch()
        visible_at = now + invisible_ms
        p.leases[view.queue_offset] = Lease(visible_at, attempt, epoch)
        handle = Handle(q, view.queue_offset, epoch, visible_at).text()
        return Delivery(view, handle, attempt, invisible_ms)

    # -- ack and invisibility -----------------------------------------------------------
    def _held(self, group: str, topic: str, text: str) -> tuple[QueueProgress, Handle]:
        handle = Handle.parse(text)
        p = self._progress.get((group, topic, handle.queue_id))
        lease = p.leases.get(handle.offset) if p is not None else None
        if lease is None or lease.epoch != handle.epoch:
            raise Refused(Code.INVALID_RECEIPT_HANDLE,
                          "the receipt handle is not current: the message was acked, or "
                          "handed out again since")
        if lease.visible_at_ms <= self.store.now_ms():
            raise Refused(Code.INVALID_RECEIPT_HANDLE,
                          "the receipt handle expired: the message became visible again")
        return p, handle

    def ack(self, group: str, topic: str, text: str) -> None:
        """Ack one hand-out; :class:`Refused` for a handle not current."""
        with self._lock:
            p, handle = self._held(group, topic, text)
            del p.leases[handle.offset]
            p.acked.add(handle.offset)
            p.advance()
            self._dirty = True

    def change_invisible(self, group: str, topic: str, text: str, invisible_ms: int) -> str:
        """Make a hand-out visible again after ``invisible_ms`` from now; the new handle."""
        with self._lock:
            p, handle = self._held(group, topic, text)
            lease = p.leases[handle.offset]
            lease.visible_at_ms = self.store.now_ms() + invisible_ms
            lease.epoch = self._next_epoch()
            return Handle(handle.queue_id, handle.offset, lease.epoch,
                          lease.visible_at_ms).text()

    def view_of(self, group: str, topic: str, text: str) -> MessageView | None:
        """The message a current handle names (for dead-lettering), or ``None``."""
        with self._lock:
            _, handle = self._held(group, topic, text)
            views = self._pull(topic, handle.queue_id, handle.offset, 1)
        return views[0] if views else None
