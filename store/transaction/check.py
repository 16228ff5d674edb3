"""One round of the transaction check loop (RocketMQ's ``TransactionalMessageServiceImpl.check``).

The round walks the half queue from the saved half offset, as RocketMQ's
TransactionalMessageCheckService does:

1. starting offsets: the saved half and op offsets, or the queues' minimum;
2. the op map: every op message from the op offset (here read in full through the index,
   which is what RocketMQ's repeated 32-message pulls amount to), plus whole transactions:
   a half offset is done when its transaction has ended, was discarded, or has a newer copy;
3. for each half offset still open, in order, stopping after 60 s (or ``max_checks``):

   * the record is gone (retention): skip it;
   * TRANSACTION_CHECK_TIMES >= ``transaction_check_max``, or older than the retention time:
     copy it to ``TRANS_CHECK_MAX_TIME_TOPIC`` (discard) and go on;
   * stored after the round began: stop;
   * (ours) a copy the loop itself made less than ``transaction_check_interval_ms`` ago:
     stop.  RocketMQ runs a round once per interval, so a copy is never re-checked sooner;
     here rounds may run at every Spark trigger, and this keeps RocketMQ's pacing;
   * with CHECK_IMMUNITY_TIME_IN_SECONDS and age <= that immunity (used as given): re-append
     a copy carrying TRAN_PREPARED_QUEUE_OFFSET (the first half offset) and go on.  The
     copy keeps its check count: it was not a check;
   * without it and 0 <= age <= ``transaction_timeout_ms``: stop;
   * otherwise: re-append a copy with TRANSACTION_CHECK_TIMES + 1 (put-back) and ask about
     the transaction;

4. save the half offset and the op offset (advanced over the run of ops whose halves are all
   behind the half offset) atomically, so no queue is ever walked again from its start.

Every copy, discard and offset of the round is written while holding the store's write lock,
so two processes never run the same round; asking (the ``resolve`` callable, or a Spark
query) happens after, and answers come back through ``end_transaction``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Protocol

from ..codec import Record
from ..core.ports import StorePort
from ..errors import CorruptRecordError, TransactionStateError
from ..message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
    SYSTEM_PROPERTY_NAMES,
    LocalTransactionState,
    MessageView,
)
from .half import check_times, discard_spec, immunity_ms, put_back_spec, transaction_id_of
from .index import TransactionIndex

#: RocketMQ's MAX_PROCESS_TIME_LIMIT: a round stops walking a queue after this long.
MAX_PROCESS_TIME_MS = 60_000

_STATE_NAMES = {
    "COMMIT": LocalTransactionState.COMMIT_MESSAGE,
    "COMMIT_MESSAGE": LocalTransactionState.COMMIT_MESSAGE,
    "ROLLBACK": LocalTransactionState.ROLLBACK_MESSAGE,
    "ROLLBACK_MESSAGE": LocalTransactionState.ROLLBACK_MESSAGE,
    "UNKNOWN": LocalTransactionState.UNKNOW,
    "UNKNOW": LocalTransactionState.UNKNOW,
}


def parse_state(value: object) -> LocalTransactionState:
    """A :class:`LocalTransactionState` from a member or its name.

    Accepted: the members, and the strings ``COMMIT``/``ROLLBACK``/``UNKNOWN`` or RocketMQ's
    ``COMMIT_MESSAGE``/``ROLLBACK_MESSAGE``/``UNKNOW`` (any case, surrounding blanks ignored).

    Raises
    ------
    TransactionStateError
        For anything else.
    """
    if isinstance(value, LocalTransactionState):
        return value
    if isinstance(value, str):
        state = _STATE_NAMES.get(value.strip().upper())
        if state is not None:
            return state
    raise TransactionStateError(
        f"transaction state {value!r} is not one of the three; allowed: COMMIT, ROLLBACK, "
        "UNKNOWN (or LocalTransactionState.COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW)")


@dataclass(frozen=True, slots=True)
class TransactionCheckView(MessageView):
    """A half message the check loop asks about: a :class:`MessageView` of the put-back copy
    with topic and queue restored to the real ones, plus who to ask and how often it was asked.

    ``queue_offset`` / ``commitlog_offset`` / ``store_timestamp_ms`` are the copy's (in the
    half topic); ``transaction_id`` is set.
    """

    producer_group: str = ""
    check_times: int = 0


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """What a round's bookkeeping did, and the transactions to ask about."""

    checks: tuple[TransactionCheckView, ...]
    discarded: int
    immune: int
    half_offset: int
    op_offset: int
    started_ms: int


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Counts of one in-process round (:meth:`MessageStore.check_transactions`).

    ``checked``: transactions asked about; ``committed`` / ``rolled_back``: ended by their
    answer; ``unknown``: answered UNKNOW (or the answer failed, see ``errors``), left for a
    later round; ``discarded``: given up after ``transaction_check_max`` checks (or past
    retention); ``immune``: re-appended inside their custom immunity; ``already_ended``:
    answered, but ended meanwhile by someone else.
    """

    checked: int = 0
    committed: int = 0
    rolled_back: int = 0
    unknown: int = 0
    discarded: int = 0
    immune: int = 0
    already_ended: int = 0
    half_offset: int = 0
    op_offset: int = 0
    errors: tuple[str, ...] = field(default_factory=tuple)


def check_view(record: Record, copy_queue_offset: int, copy_commitlog_offset: int,
               copy_store_ms: int, count: int) -> TransactionCheckView:
    """The view of a put-back copy sent to whoever decides (topic and queue restored)."""
    props = dict(record.properties)
    props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(count)
    qid = props.get(PROPERTY_REAL_QUEUE_ID, "0")
    return TransactionCheckView(
        topic=props.get(PROPERTY_REAL_TOPIC, ""),
        queue_id=int(qid) if qid.lstrip("-").isdigit() else 0,
        queue_offset=copy_queue_offset, commitlog_offset=copy_commitlog_offset,
        msg_id=props.get(PROPERTY_UNIQ_KEY, ""), tags=props.get(PROPERTY_TAGS),
        keys=tuple(k for k in props.get(PROPERTY_KEYS, "").split(" ") if k),
        body=record.body,
        properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES},
        born_timestamp_ms=record.born_timestamp_ms, store_timestamp_ms=copy_store_ms,
        deliver_timestamp_ms=None, transaction_id=transaction_id_of(record),
        reconsume_times=record.reconsume_times, sys_flag=record.sys_flag,
        system_properties={k: v for k, v in props.items() if k in SYSTEM_PROPERTY_NAMES},
        producer_group=props.get(PROPERTY_PRODUCER_GROUP, ""), check_times=count,
    )


class CheckState(Protocol):
    """What a check round uses of the transaction service: its store, index, settings and
    saved progress."""

    store: StorePort
    index: TransactionIndex
    settings: dict[str, int]

    def queue_minimums(self) -> tuple[int, int]: ...

    def load_progress(self) -> tuple[int, int]: ...

    def save_progress(self, half_offset: int, op_offset: int, now_ms: int) -> None: ...


def run_bookkeeping(service: CheckState, *, max_checks: int | None = None,
                    max_process_ms: int = MAX_PROCESS_TIME_MS,
                    remember: dict | None = None) -> CheckPlan:
    """Steps 1 to 4 of the round (see the module docstring); the caller holds the write lock.

    ``remember``: a dict that receives ``{CommitLog offset: Record}`` of each put-back copy,
    so answers given in this process need not read the copies back.
    """
    store = service.store
    index = service.index
    settings = service.settings
    timeout = settings["transaction_timeout_ms"]
    check_max = settings["transaction_check_max"]
    interval = settings["transaction_check_interval_ms"]
    reserved = store.config.file_reserved_time_ms

    started = store.now_ms()
    wall = time.monotonic()
    index.refresh()
    half_min, op_min = service.queue_minimums()
    saved_half, saved_op = service.load_progress()
    half_offset = max(saved_half, half_min)
    op_offset = max(saved_op, op_min)
    half_end = index.half_scanned
    qoffs, _ = index.window(half_offset, half_end)

    new_half = half_end
    specs = []
    asks: list[tuple[Record, int]] = []    # (record, its check count), aligned with copies
    kinds: list[str] = []
    discarded = immune = 0
    for q in qoffs.tolist():
        if (max_checks is not None and len(asks) >= max_checks) or \
                (time.monotonic() - wall) * 1000 > max_process_ms:
            new_half = q
            break
        try:
            record = store.read_record(int(index.half_clog.data[q - index.base]))
        except CorruptRecordError:
            continue  # gone with retention: nothing to check
        props = record.properties
        times = check_times(record)
        age = started - record.born_timestamp_ms
        if times >= check_max or age > reserved:
            specs.append(discard_spec(record))
            kinds.append("discard")
            discarded += 1
            continue
        count = times + 1
        if record.store_timestamp_ms >= started:
            new_half = q
            break
        made_by_loop = (PROPERTY_TRANSACTION_CHECK_TIMES in props
                        or PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in props)
        if made_by_loop and started - record.store_timestamp_ms < interval:
            new_half = q
            break
        custom = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if custom is not None:
            if age <= immunity_ms(custom, timeout, raise_to_timeout=False):
                first = props.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET) or str(q)
                specs.append(put_back_spec(
                    record, **{PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: first}))
                kinds.append("immune")
                immune += 1
                continue
        elif 0 <= age <= timeout:
            new_half = q
            break
        # every op has been read, none ends it, and it is past its immunity: ask
        specs.append(put_back_spec(record, **{PROPERTY_TRANSACTION_CHECK_TIMES: str(count)}))
        kinds.append("check")
        asks.append((record, count))

    results = store.append(specs) if specs else []
    checks = []
    ask_iter = iter(asks)
    for kind, spec, r in zip(kinds, specs, results):
        if kind == "check":
            record, count = next(ask_iter)
            checks.append(check_view(record, r.queue_offset, r.commitlog_offset,
                                     r.store_timestamp_ms, count))
            if remember is not None:  # the copy as read back, for the answers that follow
                remember[r.commitlog_offset] = dataclasses.replace(
                    record, topic=spec.topic, queue_id=spec.queue_id,
                    properties=dict(spec.properties), physical_offset=r.commitlog_offset,
                    queue_offset=r.queue_offset, store_timestamp_ms=r.store_timestamp_ms,
                    prepared_transaction_offset=0)
    index.refresh()  # the copies and discards just written
    new_op = index.op_progress(op_offset, new_half)
    service.save_progress(new_half, new_op, started)
    return CheckPlan(checks=tuple(checks), discarded=discarded, immune=immune,
                     half_offset=new_half, op_offset=new_op, started_ms=started)

