"""``startingOffsets`` / ``endingOffsets``: their parsed form, and the option errors' wording.

The JSON form names queues of one store, ``{"orders": {"0": 42}}``, or, for a store group
(several stores read as one stream), queues per store: ``{"store-0": {"orders": {"0": 42}}}``
(a store level only when the path is a group, as rocketmq-spark keyed offsets by broker).
Which form applies is known only once the path is opened: :meth:`OffsetSpec.for_store` then
refuses the form that does not fit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from store import InvalidTopicError, validate_topic

from .errors import InvalidOptionError

#: JSON offset meaning "the queue's earliest offset" (Kafka's -2).
EARLIEST = -2
#: JSON offset meaning "the queue's latest offset" (Kafka's -1).
LATEST = -1

#: canonical spelling of every option, by its lower-cased name
OPTION_NAMES = {name.lower(): name for name in (
    "path", "subscribe", "subscribePattern", "tags", "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp", "maxOffsetsPerTrigger", "failOnDataLoss",
    "deliverDue", "view", "action", "topic", "producerGroup", "guarantee", "sinkId",
    "sinkCommit", "verifyCrc", "checkRounds", "token", "tokenFile", "tlsRootCerts", "timeoutMs",
    "account", "secret", "secretFile", "pushFilters", "keys",
)}
#: Options of an ``rmq://`` path (a served store), taken out of the option map at parse time.
REMOTE_OPTION_NAMES = frozenset({"token", "tokenfile", "tlsrootcerts", "timeoutms",
                                 "account", "secret", "secretfile"})

def _fail(name: str, value: object, problem: str, allowed: str) -> InvalidOptionError:
    return InvalidOptionError(f"option {OPTION_NAMES.get(name, name)}={value!r}: {problem}; "
                              f"allowed: {allowed}")


def _parse_topic(name: str, value: str, topic: str) -> str:
    try:
        return validate_topic(topic)
    except InvalidTopicError as exc:
        raise _fail(name, value, f"topic {topic!r} is not valid ({exc})",
                    "user topic names (letters, digits, %, |, _ and -; at most 127; "
                    "no system topics)") from None


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """A ``startingOffsets`` / ``endingOffsets`` value.

    Parameters
    ----------
    default : int
        :data:`EARLIEST` or :data:`LATEST`, for every queue not named in ``queues``.
    queues : dict
        ``{topic: {queue_id: offset}}`` from the JSON form; offsets are >= 0 or one of the
        two sentinels.
    """

    default: int
    queues: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    #: the group form: ``{store name: {topic: {queue_id: offset}}}`` (``None``: one store)
    stores: Mapping[str, Mapping[str, Mapping[int, int]]] | None = None
    #: the option's name and text, for errors found once the path is opened
    option: str = ""
    text: str = ""

    def get(self, topic: str, queue_id: int) -> int:
        """The offset (or sentinel) this spec gives for one queue."""
        return self.queues.get(topic, {}).get(queue_id, self.default)

    def named(self) -> list[tuple[str, int]]:
        """The (topic, queue id) pairs the JSON form names, sorted."""
        return sorted((t, q) for t, qs in self.queues.items() for q in qs)


    def topics(self) -> set[str]:
        """Every topic the JSON form names (in any store)."""
        if self.stores is not None:
            return {t for qs in self.stores.values() for t in qs}
        return set(self.queues)

    def per_store(self) -> list[tuple[str | None, "OffsetSpec"]]:
        """``[(store name or None, spec of that store's queues)]``."""
        if self.stores is None:
            return [(None, self)]
        return [(name, OffsetSpec(self.default, qs)) for name, qs in self.stores.items()]

    def for_store(self, name: str | None, names: tuple[str, ...]) -> "OffsetSpec":
        """The spec of one member of the path's stores (``names``; one store: ``("",)``).

        Raises :class:`InvalidOptionError` when the JSON form does not fit the path: a store
        level for one store, none for a group, or a store the group does not have.
        """
        grouped = len(names) > 1
        if self.stores is None:
            if grouped and self.queues:
                raise _fail(self.option, self.text, "names queues without their store, but the "
                            f"path is a store group of {len(names)} stores",
                            'offsets per store, e.g. {"%s": {"orders": {"0": 42}}}' % names[0])
            return self
        if not grouped:
            raise _fail(self.option, self.text, "names stores, but the path is one store",
                        'offsets of its queues, e.g. {"orders": {"0": 42}}')
        unknown = sorted(set(self.stores) - set(names))
        if unknown:
            raise _fail(self.option, self.text, f"store(s) {unknown} are not in the group",
                        f"the group's stores {list(names)}")
        return OffsetSpec(self.default, self.stores.get(name, {}), option=self.option,
                          text=self.text)


def parse_offset_spec(name: str, value: str, *, allow_earliest: bool,
                      allow_latest: bool) -> OffsetSpec:
    """Parse ``startingOffsets`` / ``endingOffsets``: a keyword or the per-queue JSON form."""
    keywords = [k for k, ok in (("earliest", allow_earliest), ("latest", allow_latest)) if ok]
    sentinels = [s for s, ok in ((EARLIEST, allow_earliest), (LATEST, allow_latest)) if ok]
    allowed = (" or ".join(keywords) + ' or JSON like {"orders":{"0":42}} with offsets >= 0'
               + ' (for a store group: {"store-0":{"orders":{"0":42}}})'
               + "".join(f" or {s}" for s in sentinels))
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        if text.lower() not in keywords:
            raise _fail(name, value, "not allowed here", allowed)
        return OffsetSpec(EARLIEST if text.lower() == "earliest" else LATEST)
    try:
        data = json.loads(text)
    except ValueError:
        raise _fail(name, value, "neither a keyword nor JSON", allowed) from None
    if not isinstance(data, dict) or not data:
        raise _fail(name, value, "JSON must be a non-empty object of topics", allowed)
    default = EARLIEST if name == "startingoffsets" else LATEST
    grouped = all(isinstance(v, dict) and v and all(isinstance(w, dict) for w in v.values())
                  for v in data.values())
    if grouped:  # {store: {topic: {queue: offset}}}
        stores = {}
        for store in sorted(data):
            stores[store] = _parse_queues(name, value, data[store], sentinels, allowed)
        return OffsetSpec(default, {}, stores, option=name, text=value)
    return OffsetSpec(default, _parse_queues(name, value, data, sentinels, allowed),
                      option=name, text=value)


def _parse_queues(name: str, value: str, data: dict, sentinels: list,
                  allowed: str) -> dict[str, dict[int, int]]:
    queues: dict[str, dict[int, int]] = {}
    for topic in sorted(data):
        per = data[topic]
        _parse_topic(name, value, topic)
        if not isinstance(per, dict) or not per:
            raise _fail(name, value, f"topic {topic!r} must map to a non-empty object of "
                        "queue ids", allowed)
        parsed: dict[int, int] = {}
        for qid, off in per.items():
            if not (isinstance(qid, str) and qid.isdigit()):
                raise _fail(name, value, f"queue id {qid!r} of {topic!r} is not a "
                            "non-negative integer", allowed)
            if (isinstance(off, bool) or not isinstance(off, int)
                    or (off < 0 and off not in sentinels)):
                raise _fail(name, value, f"offset {off!r} of {topic}/{qid} is not allowed", allowed)
            parsed[int(qid)] = off
        queues[topic] = dict(sorted(parsed.items()))
    return queues


