"""How far a streaming query is behind its store: per-queue lag from a checkpoint or progress.

Python data sources cannot report Spark source metrics (``avgOffsetsBehindLatest`` of the
Kafka source), so these helpers compute the same from what a query leaves behind:

* :func:`checkpoint_offsets` reads the end offsets of the last **committed** micro-batch from
  the query's checkpoint directory (``offsets/<batch>``, confirmed by ``commits/<batch>``);
* :func:`progress_offsets` takes them from ``query.lastProgress`` in the running process;
* :func:`queue_lag` compares them with the store's end of each queue: ``lag`` is the number
  of messages visible in the store that the query has not processed yet.

A queue of a subscribed topic the checkpoint does not list yet (a topic created, or queues
added, after the batch) counts from its first offset, as the source would read it.
``rmq lag --checkpoint DIR --store DIR [--json]`` prints the result.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

from .errors import RmqSourceError
from .offsets import QueueOffsets, from_spark, has_store_level, members_from_spark


def _batch_ids(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def checkpoint_offsets(checkpoint_dir: str, *, raw: bool = False
                       ) -> tuple[int | None, list[QueueOffsets]]:
    """``(batch id, [offsets per rmq source])`` of the last committed batch of a query.

    ``(None, [])`` when no batch has been committed yet.  Sources that are not ``rmq``
    (another format in a union or a join) are left out.  With ``raw``, each offset is
    the JSON object as Spark stored it (a store group's has a store level; see
    :func:`path_lag`).

    Raises
    ------
    RmqSourceError
        ``checkpoint_dir`` is not a streaming checkpoint (no ``offsets/`` directory).
    """
    offsets_dir = os.path.join(checkpoint_dir, "offsets")
    if not os.path.isdir(offsets_dir):
        raise RmqSourceError(f"{checkpoint_dir} is not a streaming query's checkpoint (no "
                             "offsets/ directory); give the checkpointLocation of the query")
    committed = set(_batch_ids(os.path.join(checkpoint_dir, "commits")))
    done = [b for b in _batch_ids(offsets_dir) if b in committed]
    if not done:
        return None, []
    batch = done[-1]
    with open(os.path.join(offsets_dir, str(batch)), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    # line 0: the log version; line 1: batch metadata; then one line per source
    return batch, _rmq_offsets(lines[2:], raw=raw)


def progress_offsets(progress: Mapping | str | None, *, raw: bool = False
                     ) -> list[QueueOffsets]:
    """The rmq sources' end offsets in a ``StreamingQuery.lastProgress`` (dict or JSON);
    ``raw`` as for :func:`checkpoint_offsets`."""
    if progress is None:
        return []
    if isinstance(progress, str):
        progress = json.loads(progress)
    return _rmq_offsets((source.get("endOffset") for source in progress.get("sources", [])),
                        raw=raw)


def _rmq_offsets(values, *, raw: bool = False) -> list:
    out = []
    for value in values:
        if value in (None, "", "-"):
            continue
        try:
            data = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            continue  # another source's offset, not JSON
        try:
            parsed = from_spark(data)
        except (RmqSourceError, ValueError):
            if raw and data and has_store_level(data):
                out.append(data)  # a store group's offset
            continue  # another source's offset
        out.append(data if raw else parsed)
    return out


def path_lag(store_path: str, offsets: list) -> dict:
    """:func:`queue_lag` of raw offsets (:func:`checkpoint_offsets` with ``raw=True``)
    against the store or store group at ``store_path`` (opened read-only); over a group
    every queue row carries its ``store`` and ``stores`` gives each store's lag."""
    from .stores import open_reader, store_members

    members = store_members(store_path)
    names = tuple(name for name, _ in members)
    merged: dict[str, QueueOffsets] = {name: {} for name in names}
    for raw in offsets:
        try:
            parsed = members_from_spark(raw, names)
        except (RmqSourceError, ValueError):
            continue  # a source over another path
        for name, per in parsed.items():
            merged[name].update(per)
    if len(members) == 1:
        with open_reader(members[0][1]) as store:
            return queue_lag(store, merged[names[0]])
    rows, per_store = [], {}
    for name, path in members:
        with open_reader(path) as store:
            part = queue_lag(store, merged[name])
        per_store[name] = part["lag"]
        rows += [{"store": name, **r} for r in part["queues"]]
    return {**_summary(rows), "stores": per_store}


def queue_lag(store, offsets: QueueOffsets) -> dict:
    """Per-queue lag of ``offsets`` against ``store`` (a ``MessageStore`` or ``StoreReader``).

    Returns ``{"queues": [{"topic", "queue_id", "processed", "latest", "lag"}], "lag",
    "max_lag", "topics": {topic: lag}}``; ``processed`` is the next offset the query reads.
    """
    rows = []
    known = set(store.topics())
    for topic in sorted({t for t, _ in offsets}):
        if topic not in known:
            continue
        for q in store.queue_ids(topic):
            latest = store.max_offset(topic, q)
            processed = offsets.get((topic, q), store.min_offset(topic, q))
            rows.append({"topic": topic, "queue_id": q, "processed": processed,
                         "latest": latest, "lag": max(0, latest - processed)})
    return _summary(rows)


def _summary(rows: list[dict]) -> dict:
    """The lag result of queue rows: totals, the largest queue lag, lag per topic."""
    per_topic: dict[str, int] = {}
    for r in rows:
        per_topic[r["topic"]] = per_topic.get(r["topic"], 0) + r["lag"]
    return {"queues": rows, "lag": sum(r["lag"] for r in rows),
            "max_lag": max((r["lag"] for r in rows), default=0), "topics": per_topic}


def query_lag(query, store_path: str) -> dict:
    """:func:`queue_lag` of a running query's last progress against the store (or store
    group) at ``store_path`` (opened read-only), summed over its rmq sources."""
    return path_lag(store_path, progress_offsets(query.lastProgress, raw=True))


__all__ = ["checkpoint_offsets", "path_lag", "progress_offsets", "query_lag", "queue_lag"]
