"""What is waiting in a store: the next delayed messages due and the oldest open transactions.

:func:`pending_messages` (``MessageStore.pending_messages``, ``rmq pending``) lists, soonest
first, at most ``limit`` of each kind:

* **timer** messages: the queued records not yet in the wheel (their fire times gathered from
  the records a range at a time) and the wheel's live slots from the read time on, walked in
  time order until ``limit`` units are found; cancelled ones (a marker in the slot) are left
  out; a rolled message shows its real due time;
* **delay-level** messages: each level's queue from the delay levels' progress offset (a level's
  queue is in due order);
* **open transactions**: the oldest by born time, with their producer group and check count.

Only the listed records are decoded, so the cost grows with ``limit``, not with the number of
pending messages (the queued timer tail is read as columns).
"""

from __future__ import annotations

import numpy as np

from ..delayed.delivery import read_queue_entries
from ..base.errors import CorruptRecordError
from ..formats.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_UNIQ_KEY,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
)
from ..timer.timer_log import MAGIC_DELETE, MAGIC_ROLL
from ..timer.timer_queue import CHUNK, read_timer_entries


def pending_messages(store, limit: int = 20) -> dict:
    """``{"timer": [...], "delay_levels": [...], "transactions": [...]}`` (see the module
    docstring); each delayed item has ``msg_id``, ``topic``, ``queue_id``, ``due_ms`` and
    ``commitlog_offset``; each transaction ``transaction_id``, ``producer_group``, ``topic``,
    ``born_ms``, ``check_times`` and ``commitlog_offset``."""
    limit = max(0, int(limit))
    return {"timer": _timer(store, limit), "delay_levels": _levels(store, limit),
            "transactions": _transactions(store, limit)}


def _item(store, offset: int, due_ms: int | None) -> dict | None:
    try:
        rec = store.read_record(int(offset))
    except CorruptRecordError:
        return None
    p = rec.properties
    if due_ms is None:
        due = p.get(PROPERTY_TIMER_DELIVER_MS) or p.get(PROPERTY_TIMER_OUT_MS)
        due_ms = int(due) if due and due.lstrip("-").isdigit() else None
    qid = p.get(PROPERTY_REAL_QUEUE_ID, "")
    return {"msg_id": p.get(PROPERTY_UNIQ_KEY), "topic": p.get(PROPERTY_REAL_TOPIC),
            "queue_id": int(qid) if qid.isdigit() else None, "due_ms": due_ms,
            "commitlog_offset": int(offset)}


def _timer(store, limit: int) -> list[dict]:
    if not limit:
        return []
    timer = store.timer
    state = timer.state()
    items: list[dict] = []
    cancelled: set[str] = set()  # "{topic}+{msg_id}" of every cancel marker seen
    # queued records not yet in the wheel: the smallest fire times of the tail
    qmax = store.max_offset(TIMER_TOPIC, 0) if TIMER_TOPIC in store.topics(
        include_system=True) else 0
    fires, offsets = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for q in range(state.last_timer_queue_offset, qmax, CHUNK):
        t = read_timer_entries(store, q, min(qmax, q + CHUNK))
        cancelled |= t.marker_keys
        keep = t.ok & ~t.marker
        top = np.argsort(t.fire[keep], kind="stable")[:limit]
        fires.append(t.fire[keep][top])
        offsets.append(t.entries["offset"][keep][top].astype(np.int64))
    fire, offs = np.concatenate(fires), np.concatenate(offsets)
    for i in np.argsort(fire, kind="stable")[:limit].tolist():
        item = _item(store, offs[i], None)
        if item is not None:
            items.append(item)
    # the wheel, slot by slot in time order, until enough units are found
    placed = 0  # not rolled: due in their own slot, so later slots hold later messages
    with store.write_lock():
        times, _nums = timer.wheel.live_slots(state.last_read_time_ms)
        for slot_time in np.sort(times).tolist():
            if placed >= limit:
                break
            _first, last, _num = timer.wheel.get(slot_time)
            _pos, units = timer.log.walk_chain(last, state.last_timer_log_flush_pos)
            units = units[::-1]
            if slot_time == state.last_read_time_ms:
                units = units[state.slot_done:]
            magic = units["magic"]
            marker = (magic & MAGIC_DELETE) != 0  # rolled or not
            for off in units["offset_py"][marker].tolist():
                try:
                    key = store.read_record(int(off)).properties.get(PROPERTY_TIMER_DEL_UNIQKEY)
                except CorruptRecordError:
                    continue
                cancelled.add(key)
            for off, rolled in zip(units["offset_py"][~marker].tolist(),
                                   ((magic & MAGIC_ROLL) != 0)[~marker].tolist()):
                item = _item(store, off, None)  # a marker sits in its target's slot
                if item is not None and f"{item['topic']}+{item['msg_id']}" not in cancelled:
                    items.append(item)
                    placed += not rolled
        timer.wheel.release_memory()
    items = [it for it in items if f"{it['topic']}+{it['msg_id']}" not in cancelled]
    items.sort(key=lambda it: (it["due_ms"] is None, it["due_ms"] or 0))
    return items[:limit]


def _levels(store, limit: int) -> list[dict]:
    if not limit or SCHEDULE_TOPIC not in store.topics(include_system=True):
        return []
    progress = store.delay_levels.offsets()
    found = []
    for q in store.queue_ids(SCHEDULE_TOPIC):
        start = max(progress.get(q + 1, 0), store.min_offset(SCHEDULE_TOPIC, q))
        end = min(store.max_offset(SCHEDULE_TOPIC, q), start + limit)
        if start < end:
            e = read_queue_entries(store.consume_queue(SCHEDULE_TOPIC, q), start, end)
            found += list(zip(e["tags_code"].tolist(), e["offset"].tolist()))
    items = []
    for due, offset in sorted(found)[:limit]:
        item = _item(store, offset, int(due))
        if item is not None:
            items.append(item)
    return items


def _transactions(store, limit: int) -> list[dict]:
    if not limit:
        return []
    out = []
    for tx, born, offset in store.transactions.oldest_open(limit):
        try:
            p = store.read_record(offset).properties
        except CorruptRecordError:
            p = {}
        checks = p.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0")
        out.append({"transaction_id": tx, "producer_group": p.get(PROPERTY_PRODUCER_GROUP),
                    "topic": p.get(PROPERTY_REAL_TOPIC), "born_ms": born,
                    "check_times": int(checks) if checks.isdigit() else 0,
                    "commitlog_offset": offset})
    return out


__all__ = ["pending_messages"]
