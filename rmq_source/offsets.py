"""Streaming offsets of the ``rmq`` source: ``{"topic": {"queue_id": next_offset}}``.

Spark ``json.dumps`` the dict a stream reader returns (without ``sort_keys``) and the JVM
compares offsets as JSON strings, so every dict built here has its keys in sorted order at
both levels (queue ids sorted as the strings they become), i.e. it serialises exactly like
``json.dumps(..., sort_keys=True)``.  Inside the package offsets are a flat
``{(topic, queue_id): next_offset}`` mapping.
"""

from __future__ import annotations

import json
from typing import Mapping

from .errors import RmqSourceError

QueueKey = tuple[str, int]
QueueOffsets = dict[QueueKey, int]


def to_spark(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, int]]:
    """The nested, key-sorted dict Spark stores in its offset log."""
    nested: dict[str, dict[str, int]] = {}
    for topic, queue_id in sorted(offsets, key=lambda k: (k[0], str(k[1]))):
        nested.setdefault(topic, {})[str(queue_id)] = int(offsets[(topic, queue_id)])
    return nested


def serialize(offsets: Mapping[QueueKey, int]) -> str:
    """The offset JSON text (sorted keys)."""
    return json.dumps(to_spark(offsets))


def from_spark(data: Mapping[str, Mapping[str, int]] | str | None) -> QueueOffsets:
    """Parse an offset dict (or its JSON text) from Spark's offset log.

    Raises
    ------
    RmqSourceError
        When the value is not an rmq offset (e.g. a checkpoint of another source).
    """
    if data is None:
        return {}
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            raise RmqSourceError(f"offset {data!r} is not JSON; expected "
                                 '{"topic": {"queue_id": next_offset}}') from None
    if not isinstance(data, Mapping):
        raise RmqSourceError(f"offset {data!r} is not an object; expected "
                             '{"topic": {"queue_id": next_offset}}')
    out: QueueOffsets = {}
    for topic, per in data.items():
        if not isinstance(per, Mapping):
            raise RmqSourceError(f"offset of topic {topic!r} is {per!r}; expected "
                                 '{"queue_id": next_offset}')
        for qid, off in per.items():
            if not str(qid).isdigit() or isinstance(off, bool) or not isinstance(off, int) \
                    or off < 0:
                raise RmqSourceError(f"offset {topic}/{qid}={off!r} is not valid; expected a "
                                     "queue id >= 0 mapped to an offset >= 0 (checkpoint of "
                                     "another source?)")
            out[(str(topic), int(qid))] = off
    return out
