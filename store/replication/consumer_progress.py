"""A follower's copy of its leader's consumer progress (the gRPC face's consumer groups).

The groups of the RocketMQ 5 gRPC face (:mod:`store.proxy.consumers`) keep their committed
offsets and the acks above them in two config files, not in the CommitLog, so the log's
copy does not carry them.  As RocketMQ's slaves copy their master's consumer offsets on a
timer, a follower asks its leader for them (the ``consumer_progress`` action, which needs
the replication right and which only a leader answers) at most every
``consumer_progress_sync_ms`` of the replica-set file, on a thread and a connection of its
own beside the follower's (:class:`~store.replication.follower.Follower` starts and stops
it).  It sends the leader's epoch, log and version of the copy it holds, and is answered
only the queues changed since (a full copy when it holds none the leader knows:
:mod:`store.files.progress_table`); it checks the answer
(:func:`~store.files.progress_table.parse_answer`, and a delta against the copy held:
:func:`~store.files.progress_table.check_delta`), merges it with the copy it holds, as
columns (:func:`~store.files.progress_table.merged_table`: no group's offset moves back
within a leader's term) and writes it into its own files, which a follower that comes to
lead takes before it serves a consumer
(:meth:`~store.proxy.consumers.ConsumerGroups.take_role`).  A leader of the previous
version answers whole, in the older shape
(:func:`~store.files.consumer_progress.parse_progress`), and is copied whole.

So after a failover a group goes on from its progress as the old leader saved it at most
one interval (and the leader's own save interval) before: what it acked since, and what
was handed out and not acked, is handed out again (at least once).  An answer that fails
the checks is logged and dropped; nothing of it is written, and the next interval asks
again, for a full copy.
"""

from __future__ import annotations

import logging
import threading

from ..base.errors import ConsumerProgressError, StoreError
from ..files.consumer_progress import parse_progress
from ..files.progress_table import (
    check_delta,
    merged_table,
    parse_answer,
    read_table,
    table_of,
    write_table,
)

log = logging.getLogger("store.replication")

#: How long one ask of the leader may take (s).
ASK_TIMEOUT_S = 10.0


class ProgressCopy:
    """Copies ``leader``'s consumer progress (a
    :class:`~store.remote.flight_client.RemoteStore` of its own: the log's copy never waits
    for this one) into ``store``'s files every ``interval_ms``, on a thread from
    :meth:`start` to :meth:`stop` (the follower's)."""

    def __init__(self, store, leader, interval_ms: int) -> None:
        self.store = store
        self.leader = leader
        self.interval_s = interval_ms / 1000
        #: The store clock's time of the last copy taken (written or already held).
        self.copied_ms: int | None = None
        self.copies = 0
        self.error: str | None = None
        self._held = None    # what the files hold (read once, then as written)
        self._other: dict = {}  # the other top-level fields of consumerOffset.json
        self._answer = None  # the last answer of the older shape taken (the same again:
        #                      nothing to do)
        #: The leader's epoch, log and version of the copy held, sent with each ask (the
        #: leader answers what changed since); ``None``: ask for a full copy.
        self._since: dict | None = None
        self._stop = threading.Event()
        self._writing = threading.Lock()  # (no write once stop returned)
        self._thread = threading.Thread(target=self._run, name="rmq-consumer-progress",
                                        daemon=True)

    def start(self) -> ProgressCopy:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop copying: once this returns, nothing more is written (a copy whose answer
        is still on its way is dropped)."""
        self._stop.set()
        with self._writing:  # (not the call on its way: a change of role never waits for
            pass             # an unreachable leader's answer)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.copy()
                self._stop.wait(self.interval_s)
        finally:  # (by this thread: a call may still be on its way when stop returns)
            self.leader.close()

    def copy(self) -> bool:
        """Ask, check, merge and write once; whether the files changed.  A failure (the
        leader unreachable, an answer refused by the checks, a full disk) is logged and
        kept in :attr:`error`, never raised; after a refused answer or a failed write the
        next ask is for a full copy."""
        try:
            answer = self.leader.consumer_progress(since=self._since)
            changed = False
            if answer != self._answer:
                changed = self._take(answer)
        except (StoreError, OSError) as exc:
            if isinstance(exc, (ConsumerProgressError, OSError)):
                self._since = self._answer = None
            text = f"{type(exc).__name__}: {exc}"
            if text != self.error:
                log.warning("copying the consumer progress of %s: %s; kept the copy held",
                            self.leader.address.url, text)
            self.error = text
            return False
        self.error = None
        self.copied_ms = self.store.now_ms()
        self.copies += changed
        return changed

    def _take(self, answer) -> bool:
        """Check ``answer`` (a full copy or a delta; of a leader of the previous version,
        the older shape, always full), merge it into the copy held and write it."""
        older = isinstance(answer, dict) and set(answer) == {"epoch", "offsets", "acks"}
        copy = table_of(parse_progress(answer)) if older else parse_answer(answer)
        root = self.store.root
        with self._writing:
            if self._stop.is_set():
                return False
            if self._held is None:
                self._held, self._other = read_table(root)
            if not older and answer["since"] is not None:
                check_delta(self._held, self._since, answer, copy)
            kept = merged_table(self._held, copy)
            if kept is not None:
                write_table(root, kept, self._other)
                self._held = kept
            # (an answer of the older shape is asked for again whole: kept to skip it)
            self._answer = answer if older else None
            self._since = (None if older or self._held.epoch != answer["epoch"] else
                           {"epoch": answer["epoch"], "log": answer["log"],
                            "version": answer["version"]})
            return kept is not None

    def status(self) -> dict:
        return {"consumer_progress_copied_ms": self.copied_ms,
                "consumer_progress_error": self.error}
