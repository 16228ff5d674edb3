"""A follower's copy of its leader's consumer progress (the gRPC face's consumer groups).

The groups of the RocketMQ 5 gRPC face (:mod:`store.proxy.consumers`) keep their committed
offsets and the acks above them in two config files, not in the CommitLog, so the log's
copy does not carry them.  As RocketMQ's slaves copy their master's consumer offsets on a
timer, a follower asks its leader for them (the ``consumer_progress`` action, which needs
the replication right and which only a leader answers) at most every
``consumer_progress_sync_ms`` of the replica-set file, on a thread and a connection of its
own beside the follower's (:class:`~store.replication.follower.Follower` starts and stops
it), checks the answer
(:func:`~store.files.consumer_progress.parse_progress`), merges it with the copy it holds
(:func:`~store.files.consumer_progress.merged`: no group's offset moves back within a
leader's term) and writes it into its own files, which a follower that comes to lead takes
before it serves a consumer (:meth:`~store.proxy.consumers.ConsumerGroups.take_role`).

So after a failover a group goes on from its progress as the old leader saved it at most
one interval (and the leader's own save interval) before: what it acked since, and what
was handed out and not acked, is handed out again (at least once).  An answer that fails
the checks is logged and dropped; nothing of it is written, and the next interval asks
again.
"""

from __future__ import annotations

import logging
import threading

from ..base.errors import StoreError
from ..files.consumer_progress import merged, parse_progress, read_progress, write_progress

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
        self._answer = None  # the last answer taken (the same again: nothing to do)
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
        kept in :attr:`error`, never raised."""
        try:
            answer = self.leader.consumer_progress()
            changed = False
            if answer != self._answer:
                changed = self._take(parse_progress(answer))
                self._answer = answer
        except (StoreError, OSError) as exc:
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

    def _take(self, copy) -> bool:
        root = self.store.root
        with self._writing:
            if self._stop.is_set():
                return False
            if self._held is None:
                self._held = read_progress(root)
            kept = merged(self._held, copy)
            if kept is None:
                return False
            write_progress(root, kept, sync=True)
            self._held = kept
            return True

    def status(self) -> dict:
        return {"consumer_progress_copied_ms": self.copied_ms,
                "consumer_progress_error": self.error}
