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

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..core.ports import StorePort
from ..base.errors import TransactionStateError
from ..formats.message import LocalTransactionState
from .check_chunks import ChunkChecks, Rules, walk_chunk
from .check_views import CheckViews, TransactionCheckView, check_view
from .transaction_index import TransactionIndex

__all__ = ["MAX_PROCESS_TIME_MS", "WALK_CHUNK", "CheckPlan", "CheckResult", "CheckState",
           "CheckViews", "TransactionCheckView", "check_view", "parse_state",
           "run_bookkeeping"]

#: RocketMQ's MAX_PROCESS_TIME_LIMIT: a round stops walking a queue after this long.
MAX_PROCESS_TIME_MS = 60_000
#: Half offsets decided and written per step of the walk.
WALK_CHUNK = 8192

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
class CheckPlan:
    """What a round's bookkeeping did, and the transactions to ask about (a lazy sequence of
    :class:`TransactionCheckView`; :meth:`CheckViews.to_arrow` gives them as columns)."""

    checks: CheckViews
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
                    max_process_ms: int = MAX_PROCESS_TIME_MS) -> CheckPlan:
    """Steps 1 to 4 of the round (see the module docstring); the caller holds the write lock.

    The open half offsets are walked in chunks (:func:`~store.transaction.check_chunks.
    walk_chunk`, at most :data:`WALK_CHUNK` records of one CommitLog segment each), each
    decided and written as columns; the time limit is looked at between chunks.
    """
    store = service.store
    index = service.index
    settings = service.settings
    rules = Rules(started_ms=store.now_ms(), timeout_ms=settings["transaction_timeout_ms"],
                  check_max=settings["transaction_check_max"],
                  interval_ms=settings["transaction_check_interval_ms"],
                  reserved_ms=store.config.file_reserved_time_ms)
    wall = time.monotonic()
    index.refresh()
    half_min, op_min = service.queue_minimums()
    saved_half, saved_op = service.load_progress()
    half_offset = max(saved_half, half_min)
    op_offset = max(saved_op, op_min)
    half_end = index.half_end
    qoffs, _ = index.window(half_offset, half_end)
    clogs = index.half_clogs(qoffs) if len(qoffs) else qoffs
    segment = clogs // store.config.commitlog_file_size_bytes

    new_half = half_end
    chunks: list[ChunkChecks] = []
    asked = discarded = immune = 0
    lo = 0
    while lo < len(qoffs):
        if (max_checks is not None and asked >= max_checks) or \
                (time.monotonic() - wall) * 1000 > max_process_ms:
            new_half = int(qoffs[lo])
            break
        hi = min(len(qoffs), lo + WALK_CHUNK)
        other = np.flatnonzero(segment[lo:hi] != segment[lo])
        if len(other):
            hi = lo + int(other[0])
        part = walk_chunk(store, qoffs[lo:hi], clogs[lo:hi], rules,
                          None if max_checks is None else max_checks - asked)
        discarded += part.discarded
        immune += part.immune
        if part.checks is not None:
            chunks.append(part.checks)
            asked += len(part.checks.commitlog_offsets)
        if part.cut < hi - lo:
            new_half = int(qoffs[lo + part.cut])
            break
        lo = hi
    index.refresh()  # the copies and discards just written
    new_op = index.op_progress(op_offset, new_half)
    service.save_progress(new_half, new_op, rules.started_ms)
    return CheckPlan(checks=CheckViews(store, chunks), discarded=discarded, immune=immune,
                     half_offset=new_half, op_offset=new_op, started_ms=rules.started_ms)
