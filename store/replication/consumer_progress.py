"""A follower's copy of its leader's consumer progress (the gRPC face's consumer groups).

The groups of the RocketMQ 5 gRPC face (:mod:`store.proxy.consumers`) keep their committed
offsets and the acks above them in two config files, not in the CommitLog, so the log's
copy does not carry them.  As RocketMQ's slaves copy their master's consumer offsets on a
timer, a follower asks its leader for them (the ``consumer_progress`` action, which needs
the replication right and which only a leader answers) at most every
``consumer_progress_sync_ms`` of the replica-set file, between two requests for the log
(:class:`~store.replication.follower.Follower`), checks the answer
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
import time

from ..base.errors import StoreError
from ..files.consumer_progress import merged, parse_progress, read_progress, write_progress

log = logging.getLogger("store.replication")


class ProgressCopy:
    """Copies ``leader``'s consumer progress (a
    :class:`~store.remote.flight_client.RemoteStore`) into ``store``'s files every
    ``interval_ms``, when :meth:`due` is called (the follower's loop calls it)."""

    def __init__(self, store, leader, interval_ms: int, clock=time.monotonic) -> None:
        self.store = store
        self.leader = leader
        self.interval_s = interval_ms / 1000
        self.clock = clock
        self._next = 0.0
        #: The store clock's time of the last copy taken (written or already held).
        self.copied_ms: int | None = None
        self.copies = 0
        self.error: str | None = None

    def due(self) -> None:
        """Copy now when the interval has passed since the last attempt."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval_s
        self.copy()

    def copy(self) -> bool:
        """Ask, check, merge and write once; whether the files changed.  A failure (the
        leader unreachable, an answer refused by the checks) is logged and kept in
        :attr:`error`, never raised: the log's copy goes on."""
        try:
            # (the client's one door to an action: the follower's RemoteStore has no
            # method of its own for this one)
            copy = parse_progress(self.leader._action("consumer_progress"))
            root = self.store.root
            kept = merged(read_progress(root), copy)
            if kept is not None:
                write_progress(root, kept, sync=True)
        except (StoreError, OSError) as exc:  # (the log's copy goes on regardless)
            text = f"{type(exc).__name__}: {exc}"
            if text != self.error:
                log.warning("copying the consumer progress of %s: %s; kept the copy held",
                            self.leader.address.url, text)
            self.error = text
            return False
        self.error = None
        self.copied_ms = self.store.now_ms()
        self.copies += kept is not None
        return kept is not None

    def status(self) -> dict:
        return {"consumer_progress_copied_ms": self.copied_ms,
                "consumer_progress_error": self.error}
