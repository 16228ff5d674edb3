"""How far a delay level's queue was really delivered, found from the delivered copies.

A progress file (``config/delayOffset.json``) says, per level, the queue offset delivery
goes on from: every entry below it was delivered.  A file this process did not save (another
process's, a restored backup, an edit, damage) may say more than the CommitLog holds.  The
CommitLog is the truth: every copy a delivery appends carries its source's CommitLog offset
(``__RMQ_DELAY_ORIGIN``, see :mod:`store.delayed.delivery`), a copy lies after its source, and
a level's entries are delivered in queue order, so the entries delivered form a prefix of the
queue.  :func:`delivered_prefix` finds where that prefix ends below the offset a file claims:

* the entry just below the claim is looked for first: a copy of it proves the claim (the
  normal case).  A file rmq saved says where that copy was appended (``lastCopies``, a
  hint: :func:`copy_in` scans that range only); without a hint that holds, one compiled
  scan of the CommitLog from that entry's record on;
* otherwise entries further back are probed, 2, 4, 8, ... below the claim, the scan
  extended back to each probe's record, until one has a copy (or is gone to retention, or
  the queue's first entry is reached);
* from there on every entry's record is looked up in the origins found (NumPy, no Python
  step per entry): the first without a copy is where delivery goes on, and the copies
  found are skipped by the delivery run (its mark covers them).

The scan is shared by the levels (:class:`OriginScan` only ever extends back), so its cost is
one pass over the CommitLog from the oldest record probed to the end.
"""

from __future__ import annotations

import numpy as np

from ..core.ports import StorePort
from .delivery import origins_since, read_queue_entries


def copy_in(store: StorePort, queue, claimed: int, span: tuple[int, int]) -> bool:
    """Whether the entry just below ``claimed`` has a copy within the CommitLog range
    ``span`` (a file's hint of where its last delivered entry's copy was appended: a wrong
    hint proves nothing and the entries are probed instead)."""
    head = read_queue_entries(queue, claimed - 1, claimed) if claimed > 0 else ()
    if not len(head):
        return False
    source = int(head["offset"][0])
    lo, hi = max(span[0], source), span[1]
    return lo < hi and source in origins_since(store, lo, hi)


class OriginScan:
    """The origins of the delivered copies from CommitLog offset :attr:`start` to the
    confirmed end, extended backwards on demand (:meth:`reach`)."""

    def __init__(self, store: StorePort) -> None:
        self.store = store
        self.start = store.confirmed_offset()
        self.origins = np.empty(0, np.int64)

    def reach(self, offset: int) -> None:
        """Make the scan cover the copies from ``offset`` on."""
        offset = max(offset, self.store.commit_log.min_offset())
        if offset < self.start:
            more = origins_since(self.store, offset, self.start)
            self.origins = np.union1d(self.origins, more)
            self.start = offset

    def delivered(self, records: np.ndarray) -> np.ndarray:
        """Which source records (CommitLog offsets, each at or after :attr:`start`) have a
        copy, or are gone to retention (nothing is left to deliver of them)."""
        records = records.astype(np.int64)
        return np.isin(records, self.origins) | (records < self.store.commit_log.min_offset())


def delivered_prefix(queue, first: int, claimed: int, scan: OriginScan,
                     copies_from: int | None = None) -> int:
    """The queue offset, at most ``claimed``, from which the entries of ``queue`` (from
    ``first``) lack delivered copies (see the module docstring); ``claimed`` when the entry
    below it has one.

    ``copies_from``: a CommitLog offset every copy of an entry from ``first`` on lies at or
    after (what this process saw when it saved last: the entries from its own offset on were
    not delivered then), so no probing is needed.
    """
    if claimed <= first:
        return claimed
    if copies_from is not None:
        scan.reach(copies_from)
        probe = first - 1
    else:
        probe = _last_with_copy(queue, first, claimed, scan)
    entries = read_queue_entries(queue, probe + 1, claimed)
    if not len(entries):
        return claimed
    scan.reach(int(entries["offset"][0]))  # (covered already, unless a probe was unreadable)
    done = scan.delivered(entries["offset"])
    return claimed if done.all() else probe + 1 + int(np.argmin(done))


def _last_with_copy(queue, first: int, claimed: int, scan: OriginScan) -> int:
    """An entry below ``claimed`` with a copy, probed 1, 2, 4, ... below it (``first - 1``
    when none from ``first`` on has one); the scan then covers every entry above it."""
    step, probe = 1, claimed - 1
    while True:
        head = read_queue_entries(queue, probe, probe + 1)
        if len(head):
            scan.reach(int(head["offset"][0]))
            if scan.delivered(head["offset"])[0]:
                return probe
        if probe == first:
            return first - 1  # no entry has a copy: all of them are checked
        step *= 2
        probe = max(first, claimed - step)
