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
        if type(per) is not dict and not isinstance(per, Mapping):  # (dict: the usual, fast)
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


#: Offsets of a query over one store or a store group: ``{store name: offsets}`` (one
#: store: the single name ``""``); queue keys carry the store as ``(store, topic, queue_id)``
#: where the readers need them flat.
MemberOffsets = dict[str, QueueOffsets]


def members_to_spark(offsets: Mapping[str, QueueOffsets], names) -> dict:
    """What Spark stores: today's ``{"topic": {"queue_id": n}}`` for one store, and
    ``{"store": {"topic": {"queue_id": n}}}`` (sorted keys) for a group of several."""
    names = tuple(names)
    if len(names) == 1:
        return to_spark(offsets.get(names[0], {}))
    return {name: to_spark(offsets.get(name, {})) for name in sorted(names)}


def members_from_spark(data, names) -> MemberOffsets:
    """Parse an offset of :func:`members_to_spark` for the stores ``names``.

    Raises
    ------
    RmqSourceError
        The offset has no store level although the path is a group (or the other way
        round), or names a store the group does not have: the checkpoint was written for
        another path.
    """
    names = tuple(names)
    if len(names) == 1:
        return {names[0]: from_spark(data)}
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            raise RmqSourceError(f"offset {data!r} is not JSON") from None
    if data is None:
        return {name: {} for name in names}
    expected = '{"store": {"topic": {"queue_id": next_offset}}}'
    if not has_store_level(data):
        raise RmqSourceError(f"offset {data!r} has no store level, but the path is a store "
                             f"group of {list(names)}; expected {expected} (a checkpoint of "
                             "a query over one store cannot go on over a group)")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise RmqSourceError(f"offset names store(s) {unknown}, which the group "
                             f"{list(names)} does not have (members are never removed); "
                             "the checkpoint belongs to another group")
    return {name: from_spark(data.get(name, {})) for name in names}


def has_store_level(data) -> bool:
    """Whether a parsed offset has the store level of a group's:
    ``{"store": {"topic": {...}}}`` (an object of objects of objects)."""
    return isinstance(data, Mapping) and all(
        isinstance(v, Mapping) and all(isinstance(w, Mapping) for w in v.values())
        for v in data.values())


def flatten(offsets: Mapping[str, QueueOffsets]) -> dict[tuple[str, str, int], int]:
    """``{(store, topic, queue_id): offset}``."""
    return {(name, t, q): o for name, per in offsets.items() for (t, q), o in per.items()}


def unflatten(flat: Mapping[tuple[str, str, int], int], names) -> MemberOffsets:
    out: MemberOffsets = {name: {} for name in names}
    for (name, t, q), o in flat.items():
        out.setdefault(name, {})[(t, q)] = o
    return out
