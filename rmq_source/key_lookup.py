"""Batch reads by message key or id through the store's key index, instead of a scan.

A read that asks only for the messages of some keys (the option ``keys``; a pushed ``keys =``
or ``keys IN`` of whole arrays, looked up by each array's first key) or of some message ids (a
pushed ``msg_id =`` / ``msg_id IN``: the ``msg_id`` column is the message's unique key,
``UNIQ_KEY``, which the index holds as well) needs a handful of rows out of millions.  With
the store's message-key index (RocketMQ's IndexFile, ``message_index_enable``) the planner
asks the store for them, one :meth:`~store.MessageStore.query_messages` call per subscribed
topic and key (never one per message), and plans only the queue offsets it is given, within
the ranges the other options and filters left.  The tasks then read those offsets as any
other range and check every row against the filter (the index answers by 32-bit hash and
matches a key in ``KEYS`` or ``UNIQ_KEY`` alike), so the rows are exactly those of the scan.

An offset message id (store host and CommitLog offset, which ``view_message`` and ``rmq query
--id`` also take) is never a value of the ``msg_id`` column: ``msg_id = '<offset id>'`` finds
no row by the scan, so it is not looked up either (``view_message`` would return a row the
same query without the index does not).

The scan (every offset read, every row checked) stays the way when the index cannot answer:
the store keeps none (:class:`~store.KeyIndexUnavailableError`), or one key has
:data:`LOOKUP_LIMIT` messages or more in a topic (an answer may stop there).  A store group is
looked up member by member (each member's own index); an ``rmq://`` store answers on its
server, and only the matching messages cross the network.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from store import KeyIndexUnavailableError

from .partitions import QueueRange
from .pushdown import KEYS_COLUMN, RowFilter

#: the most messages one lookup asks for (what a served store answers at most); a key with
#: as many in a topic is read by the scan instead
LOOKUP_LIMIT = 10_000


def lookup_keys(row_filter: RowFilter | None) -> tuple[str, ...] | None:
    """The index keys under which every row passing ``row_filter`` is found, the fewest
    among what the filter offers; ``None`` when it offers none (read by the scan)."""
    if row_filter is None:
        return None
    choices = []
    if row_filter.keys is not None:
        choices.append(row_filter.keys)
    ids = row_filter.values("msg_id")
    if ids is not None:
        choices.append(ids)
    arrays = row_filter.values(KEYS_COLUMN)
    if arrays is not None and all(arrays):  # an empty array has no key to look up
        choices.append(tuple(dict.fromkeys(a[0] for a in arrays)))
    return min(choices, key=len) if choices else None


def index_ranges(store, ranges: list[QueueRange], row_filter: RowFilter | None
                 ) -> list[QueueRange] | None:
    """``ranges`` cut to the queue offsets the key index gives for ``row_filter``'s keys (runs
    of consecutive offsets), or ``None`` when the read is not one by key or the index cannot
    answer it (then every offset of ``ranges`` is read).  Runs on the driver, on one store (a
    group's member, or an ``rmq://`` client)."""
    keys = lookup_keys(row_filter)
    if keys is None or not ranges:
        return None
    found: dict[tuple[str, int], list[int]] = defaultdict(list)
    try:
        for topic in sorted({r.topic for r in ranges}):
            for key in keys:
                views = store.query_messages(topic, key=key, max=LOOKUP_LIMIT)
                if len(views) >= LOOKUP_LIMIT:
                    return None  # there may be more than one answer holds
                for v in views:
                    found[(v.topic, v.queue_id)].append(v.queue_offset)
    except KeyIndexUnavailableError:
        return None
    out = []
    for r in ranges:
        offsets = np.unique(np.asarray(found.get((r.topic, r.queue_id), ()), dtype=np.int64))
        offsets = offsets[(offsets >= r.start) & (offsets < r.end)]
        if len(offsets):
            runs = np.split(offsets, np.flatnonzero(np.diff(offsets) != 1) + 1)
            out.extend(QueueRange(r.topic, r.queue_id, int(run[0]), int(run[-1]) + 1)
                       for run in runs)
    return out
