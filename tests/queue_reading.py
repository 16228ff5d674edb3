"""Test helper: read every visible message of a topic through the public ``pull`` API."""

from __future__ import annotations

from store import UnknownTopicError


def visible(store, topic):
    """Every message of ``topic``, all queues, in queue order ([] when the topic is unknown)."""
    try:
        queues = store.queue_ids(topic)
    except UnknownTopicError:
        return []
    out = []
    for q in queues:
        offset = 0
        while True:
            batch = store.pull(topic, q, offset, 1000)
            if not batch:
                break
            out.extend(batch)
            offset += len(batch)
    return out
