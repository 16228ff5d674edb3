"""Open-time checks of the files recovery does not look at: damaged segments and lost queues.

A writable open by the only process on the store runs :func:`check_at_open` after recovery:

* **CommitLog segments of the wrong length** were set aside and replaced by a zero-padded
  copy when the segment queue was opened (:mod:`store.files.mapped_file`).  The records from the
  first such segment on are rescanned (:func:`~store.core.recovery.recover_tail`): a
  truncated newest segment ends the log where its valid records end; damage in an older
  segment is skipped, never cut.
* **ConsumeQueues that lost entries.**  At every clean close the store records each queue's
  first and end offsets in ``config/queueTable.json`` (layout below).  A queue that now ends
  below its recorded end (its file was deleted, truncated or zeroed at the tail), starts
  above its recorded first offset (its head zeroed), whose directory is gone, or one of whose
  files had the wrong length, hides messages the CommitLog still holds: every queue is then
  rebuilt from the CommitLog (:func:`~store.core.queue_rebuild.rebuild_queues`).  Between an
  open's checks and the next close only an open store moves a queue (it grows at the end;
  retention removes from the front), so the recorded offsets hold after a crash, too; a
  retention run by another process after this one closed costs one needless rebuild.
  Damage inside a queue (entries zeroed or flipped below its end) is not looked for here:
  reads check every entry against its record's header, and the read that meets a damaged
  queue rebuilds that queue from the CommitLog (:mod:`store.core.queue_healing`).

``config/queueTable.json`` (with a ``.bak`` of the previous one)::

    {"version": 1, "written_ms": <epoch ms>, "store_id": "<the store's id>",
     "queues": {"<topic>": {"<queue id>": [<first offset>, <end offset>]}}}

A missing or unreadable table only skips the queue check (the next close writes it again), and
so does a table that names another store (a process that had a removed store open wrote it
into the new store at that path: :mod:`store.core.identity`).
"""

from __future__ import annotations

import logging
import os

from ..base.errors import DiskFullError
from ..files.fileio import read_json, write_json_atomic
from .ports import CoreParts
from .recovery import recover_tail
from .queue_rebuild import rebuild_queues

log = logging.getLogger("store")
TABLE_FILE = "queueTable.json"
TABLE_VERSION = 1


def table_path(store: CoreParts) -> str:
    return os.path.join(store.root, "config", TABLE_FILE)


def queue_ends(store: CoreParts) -> dict[str, dict[str, list[int]]]:
    """``{topic: {queue id: [min offset, end offset]}}`` of every queue with entries."""
    confirmed = store.checkpoint.get("confirm_phy_offset")
    cl_min = store.commit_log.min_offset()
    ends: dict[str, dict[str, list[int]]] = {}
    for topic, queue_id in store.all_consume_queues():
        q = store.consume_queue(topic, queue_id)
        end = q.max_offset(confirmed)
        if end:
            ends.setdefault(topic, {})[str(queue_id)] = [q.min_offset(cl_min, confirmed), end]
    return ends


def write_queue_table(store: CoreParts) -> None:
    """Record every queue's end offset (at a clean close, and after a rebuild).  A disk too
    full for it keeps the previous table (still a lower bound) and logs a warning."""
    try:
        write_json_atomic(table_path(store), {"version": TABLE_VERSION,
                                              "written_ms": store.now_ms(),
                                              "store_id": store.store_id,
                                              "queues": queue_ends(store)})
    except DiskFullError as exc:
        log.warning("the queue table was not updated: %s", exc)


def _valid_table(data: object) -> bool:
    return (isinstance(data, dict) and data.get("version") == TABLE_VERSION
            and isinstance(data.get("queues"), dict)
            and all(isinstance(t, str) and isinstance(qs, dict)
                    and all(isinstance(q, str) and q.isdigit() and isinstance(e, list)
                            and len(e) == 2 and all(type(v) is int for v in e)
                            for q, e in qs.items())
                    for t, qs in data["queues"].items()))


def lost_queues(store: CoreParts) -> list[str]:
    """Queues ending below their recorded end, or with a file of the wrong length."""
    found = []
    for topic, queue_id in store.all_consume_queues():
        q = store.consume_queue(topic, queue_id)
        if q.files.repaired:
            found.append(f"{topic}/{queue_id} (a file of the wrong length)")
    recorded = read_json(table_path(store), _valid_table)
    if recorded is None:
        return found
    if recorded.get("store_id", store.store_id) != store.store_id:
        log.warning("%s names another store (%s, this one is %s): not used", table_path(store),
                    recorded.get("store_id"), store.store_id)
        return found
    ends = queue_ends(store)
    for topic, queues in recorded["queues"].items():
        for queue_id, (low, end) in queues.items():
            now = ends.get(topic, {}).get(queue_id)
            if now is None:
                found.append(f"{topic}/{queue_id} (no entries left, recorded {low} to {end})")
            elif now[1] < end or now[0] > low:
                found.append(f"{topic}/{queue_id} (offsets {now[0]} to {now[1]}, recorded "
                             f"{low} to {end})")
    return found


def check_at_open(store: CoreParts, listeners=()) -> bool:
    """Repair what damaged segments and lost queue entries left (see the module docstring);
    returns whether anything was repaired.  The caller holds the write lock."""
    repaired = False
    segments = [path for path, _, aside in store.commit_log.files.repaired if aside]
    if segments:
        start = min(int(os.path.basename(p)) for p in segments)
        log.warning("CommitLog segments of the wrong length were repaired (%s): rescanning "
                    "from offset %d", ", ".join(segments), start)
        recover_tail(store, start, listeners=listeners)
        store.commit_log.files.repaired.clear()
        repaired = True
    lost = lost_queues(store)
    if lost:
        log.warning("ConsumeQueues lost entries the CommitLog holds (%s): rebuilding every "
                    "queue from the CommitLog", "; ".join(lost[:10]))
        rebuild_queues(store)
        for topic, queue_id in store.all_consume_queues():
            store.consume_queue(topic, queue_id).files.repaired.clear()
        write_queue_table(store)
        repaired = True
    return repaired


__all__ = ["check_at_open", "lost_queues", "queue_ends", "write_queue_table"]
