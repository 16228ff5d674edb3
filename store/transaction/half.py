"""Half messages: how a transactional message is stored before its outcome is known.

A half message is an ordinary CommitLog record (layout: :mod:`store.formats.record_codec`) in
``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 whose properties remember where it really goes::

    property                          value
    __transactionId__                 the transaction id (= UNIQ_KEY); always the FIRST pair
    TRAN_MSG                          "true"
    PGROUP                            the producer group
    REAL_TOPIC, REAL_QID              the real topic and queue
    TRANSACTION_CHECK_TIMES           checks so far (put-back copies only)
    TRAN_PREPARED_QUEUE_OFFSET        first half offset (immunity re-appends only)
    CHECK_IMMUNITY_TIME_IN_SECONDS    the producer's custom immunity (optional)

SYSFLAG keeps the transaction bits at NOT (0), as RocketMQ's broker resets them, so the half
topic's ConsumeQueue indexes every half message.  The check loop never changes a record: it
re-appends copies (put-back) with new properties; the newest copy of a transaction is the one
that counts.  ``__transactionId__`` is written first so :mod:`store.transaction.transaction_index` can read
transaction ids at a fixed place with NumPy instead of decoding every record.

Commit turns the (newest) half into a record of the real topic with SYSFLAG transaction type
COMMIT (0x8) and PREPAREDTRANSACTIONOFFSET = the half's CommitLog offset; the properties are
the half's as stored (RocketMQ serialises them before clearing REAL_TOPIC, REAL_QID and
TRAN_MSG, so they stay in the bytes; readers hide them).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..formats.record_codec import TRANSACTION_TYPE_MASK, Record, RecordSpec
from ..base.errors import InvalidMessageError
from ..formats.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
    TRANS_HALF_TOPIC,
)

HALF_QUEUE_ID = 0
#: RocketMQ's internal consumer group of the check loop (names the progress offsets).
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
#: Longest custom immunity a producer may ask for (RocketMQ's proxy: 1 hour).
MAX_IMMUNITY_SECONDS = 3600


def ordered_properties(properties: Mapping[str, str], transaction_id: str,
                       **changes: str | None) -> dict[str, str]:
    """Properties with ``__transactionId__`` first, then the rest; ``None`` removes a name."""
    out = {PROPERTY_TRANSACTION_ID: transaction_id}
    for k, v in properties.items():
        if k != PROPERTY_TRANSACTION_ID:
            out[k] = v
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def check_transactional_properties(properties: Mapping[str, str]) -> None:
    """Refuse user properties that the check loop owns or that it cannot read.

    ``__transactionId__`` and ``TRANSACTION_CHECK_TIMES`` are set by the store;
    ``CHECK_IMMUNITY_TIME_IN_SECONDS`` must be an integer from -1 (the default immunity)
    to 3600.
    """
    for name in (PROPERTY_TRANSACTION_ID, PROPERTY_TRANSACTION_CHECK_TIMES):
        if name in properties:
            raise InvalidMessageError(
                f"property {name!r}={properties[name]!r} is set by the store for transactional "
                "messages; leave it out")
    value = properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
    if value is not None:
        try:
            seconds = int(value)
        except ValueError:
            seconds = None
        if seconds is None or not -1 <= seconds <= MAX_IMMUNITY_SECONDS:
            raise InvalidMessageError(
                f"property {PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS}={value!r}; allowed: an "
                f"integer number of seconds from -1 (the default immunity) to "
                f"{MAX_IMMUNITY_SECONDS}")


def half_spec(spec: RecordSpec, group: str, real_queue_id: int) -> RecordSpec:
    """The half record of a validated user record ``spec`` (its UNIQ_KEY is the id)."""
    tx_id = spec.properties[PROPERTY_UNIQ_KEY]
    props = ordered_properties(spec.properties, tx_id)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    props[PROPERTY_PRODUCER_GROUP] = group
    props[PROPERTY_REAL_TOPIC] = spec.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
    return RecordSpec(topic=TRANS_HALF_TOPIC, body=spec.body, properties=props,
                      queue_id=HALF_QUEUE_ID, flag=spec.flag,
                      sys_flag=spec.sys_flag & ~TRANSACTION_TYPE_MASK,
                      born_timestamp_ms=spec.born_timestamp_ms,
                      reconsume_times=spec.reconsume_times)


def transaction_id_of(record: Record) -> str | None:
    """The transaction id a half (or discarded) record carries."""
    props = record.properties
    return props.get(PROPERTY_TRANSACTION_ID) or props.get(PROPERTY_UNIQ_KEY)


def immunity_ms(value: str | None, timeout_ms: int, *, raise_to_timeout: bool) -> int:
    """RocketMQ's immunity time of a half message.

    ``None``, ``"-1"`` or an unreadable value give ``timeout_ms``; otherwise the value in
    seconds times 1000.  The check loop uses that as given; the end-transaction reject
    raises it to at least ``timeout_ms`` (``raise_to_timeout``), RocketMQ's quirk: with a 6 s
    timeout, "1" gives 1000 in the loop and 6000 at end-transaction.
    """
    if value is None:
        return timeout_ms
    try:
        seconds = int(value)
    except ValueError:
        return timeout_ms
    if seconds == -1:
        return timeout_ms
    ms = seconds * 1000
    return max(ms, timeout_ms) if raise_to_timeout else ms


__all__ = [
    "CHECK_GROUP",
    "HALF_QUEUE_ID",
    "MAX_IMMUNITY_SECONDS",
    "PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET",
    "check_transactional_properties",
    "half_spec",
    "immunity_ms",
    "ordered_properties",
    "transaction_id_of",
]
