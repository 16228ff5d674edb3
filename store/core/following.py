"""Following a topic: every queue's messages in order as they become visible.

One loop serves a local store (``MessageStore.follow``, ``StoreReader.follow``), a served
one (``connect(url).follow``), the stores of a group (``StoreGroup.follow``) and ``rmq
tail``.  It needs only what all of them offer: ``queue_ids``, ``min_offset``, ``max_offset``,
``pull`` and, when asked to deliver due messages, ``deliver_due``.  A served store answers
queue bounds from a snapshot (:mod:`store.remote.flight_client`); the loop asks for a fresh one
(``refresh``) once per round.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

from ..base.errors import InvalidConfigError, UnknownTopicError
from ..formats.message import MessageView

#: Where a follower starts in the queues that exist when it starts.
STARTS = ("latest", "earliest")
#: Messages asked of one queue per pull.
PULL_BATCH = 256


def follow_members(members: Sequence[tuple[str | None, object]], topic: str, *,
                   start: str = "latest", poll_interval_s: float = 0.2,
                   stop: Callable[[], bool] | None = None, deliver_due: bool = False,
                   ) -> Iterator[tuple[str | None, MessageView]]:
    """``(member name, view)`` of every message of ``topic`` in ``members`` (``[(name,
    store)]``), in queue order per queue, as they become visible.

    Parameters
    ----------
    start : {"latest", "earliest"}
        The queues found at the start begin at their end (only new messages) or at their
        oldest message; queues that appear later are followed from their oldest.
    poll_interval_s : float
        How long to wait before looking again once every queue is read to its end.
    stop : callable, optional
        Called each time every queue is read to its end (``threading.Event().is_set``, or
        ``lambda: True`` to stop there); the iteration ends when it returns true.  Without
        it the follower waits for new messages until the consumer stops iterating.
    deliver_due : bool
        Run each member's ``deliver_due()`` once per round first, so that delayed messages
        due by then surface (not needed where ``rmq serve`` runs).

    A topic that no member has yet is waited for (a send may create it).  Bad arguments
    raise :class:`InvalidConfigError` at the call, before anything is read.
    """
    if start not in STARTS:
        raise InvalidConfigError(f"start={start!r}; allowed: {' or '.join(map(repr, STARTS))}")
    if isinstance(poll_interval_s, bool) or not isinstance(poll_interval_s, (int, float)) \
            or not poll_interval_s > 0:
        raise InvalidConfigError(f"poll_interval_s={poll_interval_s!r}; allowed: a number > 0")
    return _follow(dict(members), topic, start, poll_interval_s, stop, deliver_due)


def _follow(stores: dict, topic: str, start: str, poll_interval_s: float, stop,
            deliver_due: bool) -> Iterator[tuple[str | None, MessageView]]:
    positions: dict[tuple[str | None, int], int] = {}
    from_latest = start == "latest"
    while True:
        if deliver_due:
            for store in stores.values():
                store.deliver_due()
        for name, store in stores.items():
            refresh = getattr(store, "refresh", None)  # a served store's bounds are a snapshot
            if refresh is not None:
                refresh()
            try:
                ids = store.queue_ids(topic)
            except UnknownTopicError:
                continue  # not (yet) in this member
            for q in ids:
                if (name, q) not in positions:
                    positions[(name, q)] = (store.max_offset(topic, q) if from_latest
                                            else store.min_offset(topic, q))
        from_latest = False  # queues found from now on are new: read from their oldest
        progressed = False
        for name, q in sorted(positions, key=lambda k: (k[0] or "", k[1])):
            store = stores[name]
            while positions[(name, q)] < store.max_offset(topic, q):
                views = store.pull(topic, q, positions[(name, q)], PULL_BATCH)
                if not views:
                    break
                positions[(name, q)] = views[-1].queue_offset + 1
                progressed = True
                for view in views:
                    yield name, view
        if not progressed:
            if stop is not None and stop():
                return
            time.sleep(poll_interval_s)


def follow_one(store, topic: str, **kwargs) -> Iterator[MessageView]:
    """:func:`follow_members` of one store, yielding its views only."""
    return (view for _, view in follow_members([(None, store)], topic, **kwargs))
