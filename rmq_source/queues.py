"""Which queues a query reads and where it starts and ends, resolved against a store.

Shared by the batch and the stream reader; runs on the driver only.  Uses the store's public
API (``topics``, ``queue_ids``, ``min_offset``, ``max_offset``, ``offset_for_timestamp``).
"""

from __future__ import annotations

import logging

from store import StoreReader

from .errors import DataLossError, InvalidOptionError
from .offsets import QueueKey, QueueOffsets
from .options import EARLIEST, LATEST, OffsetSpec, RmqOptions
from .partitions import data_loss_message

log = logging.getLogger("rmq_source")


def subscribed_queues(store: StoreReader, options: RmqOptions, *,
                      missing_topics: str = "ignore") -> list[QueueKey]:
    """Every (topic, queue id) the subscription covers right now, sorted.

    ``missing_topics`` says what a ``subscribe`` naming a topic the store does not hold does:
    ``"fail"`` (a batch query: the topic is probably mistyped), ``"warn"`` (a stream: it may
    be created later; logged once per store and topic) or ``"ignore"``.
    """
    known = store.topics()
    missing = sorted(set(options.subscribe or ()) - set(known))
    if missing_topics == "fail":
        check_subscribed_exist(options, known)
    if missing and missing_topics == "warn":
        new = [t for t in missing if (options.path, t) not in _warned]
        if new:
            _warned.update((options.path, t) for t in new)
            log.warning("subscribe: topic(s) %s do not exist in the store %s yet (existing: "
                        "%s); the query reads them once they are created", new, options.path,
                        known)
    return [(t, q) for t in options.select_topics(known) for q in store.queue_ids(t)]


_warned: set[tuple[str, str]] = set()


def check_subscribed_exist(options: RmqOptions, known: list[str]) -> None:
    """A batch query's ``subscribe`` may name only topics the store (or group) holds."""
    missing = sorted(set(options.subscribe or ()) - set(known))
    if missing:
        raise InvalidOptionError(
            f"option subscribe={','.join(options.subscribe)!r}: topic(s) {missing} do not exist "
            f"in the store {options.path}; allowed: existing topics {known} (or read with "
            "readStream, which waits for new topics)")


def queue_bounds(store: StoreReader, keys) -> dict[QueueKey, tuple[int, int]]:
    """``{key: (min_offset, max_offset)}`` for each queue (one call to the store)."""
    return store.queue_bounds(keys)


def check_named_queues(spec: OffsetSpec, option: str, bounds: dict[QueueKey, tuple[int, int]],
                       store: StoreReader) -> None:
    """Every queue a JSON offsets option names must exist in the store."""
    for topic, queue_id in spec.named():
        if (topic, queue_id) in bounds:
            continue
        if topic in store.topics():
            allowed = f"queue ids 0 to {len(store.queue_ids(topic)) - 1} for topic {topic!r}"
            problem = f"queue {topic}/{queue_id} does not exist"
        else:
            allowed = f"existing topics ({', '.join(store.topics()) or 'none yet'})"
            problem = f"topic {topic!r} does not exist in the store"
        raise InvalidOptionError(f"option {option}={spec_text(spec)}: {problem}; "
                                 f"allowed: {allowed}")


def spec_text(spec: OffsetSpec) -> str:
    if not spec.queues:
        return "earliest" if spec.default == EARLIEST else "latest"
    return repr({t: {str(q): o for q, o in qs.items()} for t, qs in spec.queues.items()})


def resolve_offsets(store: StoreReader, bounds: dict[QueueKey, tuple[int, int]],
                    spec: OffsetSpec, timestamp_ms: int | None, option: str) -> QueueOffsets:
    """Turn an offsets option (or a timestamp) into one offset per queue.

    ``earliest``/-2 is the queue's minimum offset, ``latest``/-1 its maximum, a timestamp the
    first offset stored at or after it.  A number above the queue's end is an option error;
    one below its minimum is returned as given (the caller applies ``failOnDataLoss``).
    """
    out: QueueOffsets = {}
    for key, (low, high) in bounds.items():
        if timestamp_ms is not None:
            out[key] = store.offset_for_timestamp(key[0], key[1], timestamp_ms)
            continue
        value = spec.get(*key)
        if value == EARLIEST:
            out[key] = low
        elif value == LATEST:
            out[key] = high
        elif value > high:
            raise InvalidOptionError(
                f"option {option}={spec_text(spec)}: offset {value} of queue {key[0]}/{key[1]} "
                f"is past its end; allowed: {low} to {high} for this queue, -2 or -1")
        else:
            out[key] = value
    return out


def apply_data_loss(starts: QueueOffsets, bounds: dict[QueueKey, tuple[int, int]],
                    fail_on_data_loss: bool) -> QueueOffsets:
    """Starts below a queue's minimum offset: raise :class:`DataLossError` or move them up.

    Keys are ``(topic, queue_id)``, or ``(store, topic, queue_id)`` over a store group."""
    out = dict(starts)
    for key, start in starts.items():
        low = bounds[key][0] if key in bounds else start
        if start < low:
            if fail_on_data_loss:
                raise DataLossError(data_loss_message(key[-2], key[-1], start, low))
            out[key] = low
    return out
