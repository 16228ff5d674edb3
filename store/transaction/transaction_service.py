"""TransactionService: ending transactions and running the check loop for one store.

Files (JSON written atomically: temp file, fsync, rename, previous copy kept as ``.bak``)::

    config/transactionOffset.json   the check loop's progress, RocketMQ's consumer offsets of
                                    group CID_RMQ_SYS_TRANS:
                                    {"offsetTable": {"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS":
                                                       {"0": <next half offset>},
                                                     "RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS":
                                                       {"0": <next op offset>}},
                                     "rounds": n, "lastRoundMs": ms}
    config/transactionConfig.json   transaction settings given explicitly when the store was
                                    opened (transaction_timeout_ms, transaction_check_max,
                                    transaction_check_interval_ms); a process that opens the
                                    store with the defaults (a Spark query, the CLI) uses them
    config/transactionIndex.npz     snapshot of the transaction index (derived; optional)
    config/transactionRepair.json   commit records a reboot's recovery kept, maybe without
                                    their op message (:mod:`store.transaction.commit_repair`);
                                    repaired and removed when the service starts

Whether a transaction has ended is read from the op queue (through
:class:`~store.transaction.transaction_index.TransactionIndex`), never from memory alone: each decision
refreshes the index while holding the store's write lock, then appends.  A commit and its op
message go in one append, which the store keeps or drops whole after a crash, so every
process and every restart agrees, and no transaction reaches its real topic twice.  The one
exception, a reboot that tears that append after the commit record, is repaired when the
service starts (:mod:`store.transaction.commit_repair`): the missing op is written before anyone
decides anything.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..files.crash_points import crash_point
from ..base.config import StoreConfig
from ..core.ports import StorePort
from ..base.errors import StoreError, TransactionStateError, UnknownMessageError
from ..files.fileio import read_json, write_json_atomic
from ..formats.message import (PROPERTY_PRODUCER_GROUP, PROPERTY_REAL_TOPIC, TRANS_HALF_TOPIC,
                       TRANS_OP_HALF_TOPIC, LocalTransactionState, MessageView)
from .check_loop import MAX_PROCESS_TIME_MS, CheckPlan, CheckResult, parse_state, run_bookkeeping
from .ending import end_rows
from .half import CHECK_GROUP, HALF_QUEUE_ID
from .transaction_index import TransactionIndex
from .commit_repair import has_note, repair_noted_commits

SETTINGS = ("transaction_timeout_ms", "transaction_check_max", "transaction_check_interval_ms")
HALF_KEY = f"{TRANS_HALF_TOPIC}@{CHECK_GROUP}"
OP_KEY = f"{TRANS_OP_HALF_TOPIC}@{CHECK_GROUP}"

Resolve = Callable[[MessageView], object]


class TransactionService:
    """Transactions of one :class:`~store.MessageStore` (built by the store; see module doc)."""

    def __init__(self, store: StorePort) -> None:
        self.store = store
        self._index: TransactionIndex | None = None
        self._listeners: dict[str, object] = {}
        self._settings: dict[str, int] | None = None
        self._sink_settler: Callable | None = None
        self._config_dir = os.path.join(store.root, "config")
        self.progress_path = os.path.join(self._config_dir, "transactionOffset.json")
        self.settings_path = os.path.join(self._config_dir, "transactionConfig.json")
        self._record_explicit_settings()
        if has_note(store):  # recovery after a reboot kept commit records: write missing ops
            with store.write_lock():
                repair_noted_commits(store, self.index)

    def set_sink_settler(self, settle: Callable) -> None:
        """Who answers the check loop for halves of the exactly-once sink
        (``settle(views)``, called with the write lock held); those halves are never shown to
        users' resolvers (see :mod:`store.sink.sink`)."""
        self._sink_settler = settle

    # ------------------------------------------------------------------ settings
    def _record_explicit_settings(self) -> None:
        defaults = StoreConfig()
        explicit = {name: getattr(self.store.config, name) for name in SETTINGS
                    if getattr(self.store.config, name) != getattr(defaults, name)}
        if not explicit:
            return
        recorded = read_json(self.settings_path)
        recorded = recorded if isinstance(recorded, dict) else {}
        if any(recorded.get(k) != v for k, v in explicit.items()):
            with self.store.write_lock():
                recorded = read_json(self.settings_path)
                merged = dict(recorded) if isinstance(recorded, dict) else {}
                merged.update(explicit)
                write_json_atomic(self.settings_path, merged)

    @property
    def settings(self) -> dict[str, int]:
        """Effective settings: this store's config where it differs from the defaults, else
        what ``config/transactionConfig.json`` recorded, else the defaults."""
        if self._settings is None:
            defaults = StoreConfig()
            recorded = read_json(self.settings_path)
            recorded = recorded if isinstance(recorded, dict) else {}
            out = {}
            for name in SETTINGS:
                mine = getattr(self.store.config, name)
                value = recorded.get(name) if mine == getattr(defaults, name) else None
                out[name] = value if isinstance(value, int) and value > 0 else mine
            self._settings = out
        return self._settings

    # ------------------------------------------------------------------ index and progress
    @property
    def index(self) -> TransactionIndex:
        if self._index is None:
            from .snapshot import load_index

            self._index = load_index(self.store) or TransactionIndex(self.store)
        return self._index

    def queue_minimums(self) -> tuple[int, int]:
        store = self.store
        limit = store.confirmed_offset()
        cl_min = store.commit_log.min_offset()
        half = store.consume_queue(TRANS_HALF_TOPIC, HALF_QUEUE_ID).min_offset(cl_min, limit)
        op = store.consume_queue(TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID).min_offset(cl_min, limit)
        return half, op

    def load_progress(self) -> tuple[int, int]:
        """The saved (half offset, op offset); 0 for a queue never walked."""
        data = read_json(self.progress_path, _progress_shape)
        table = data.get("offsetTable", {}) if data is not None else {}

        def get(key: str) -> int:
            value = table.get(key, {}).get(str(HALF_QUEUE_ID), 0) if isinstance(
                table.get(key), dict) else 0
            return value if isinstance(value, int) and value >= 0 else 0

        return get(HALF_KEY), get(OP_KEY)

    def save_progress(self, half_offset: int, op_offset: int, now_ms: int) -> None:
        """Persist the check loop's half and op offsets (after a round)."""
        data = read_json(self.progress_path, _progress_shape)
        rounds = data.get("rounds", 0) if isinstance(data, dict) else 0
        crash_point("transaction.progress", "before")
        write_json_atomic(self.progress_path, {
            "offsetTable": {HALF_KEY: {str(HALF_QUEUE_ID): int(half_offset)},
                            OP_KEY: {str(HALF_QUEUE_ID): int(op_offset)}},
            "rounds": int(rounds) + 1 if isinstance(rounds, int) else 1,
            "lastRoundMs": int(now_ms),
        })
        crash_point("transaction.progress", "after")

    # ------------------------------------------------------------------ ending
    def end_transaction(self, transaction_id: str, state, *, from_check: bool = False) -> bool:
        """Commit or roll back one transaction; see :meth:`end_transactions`."""
        return self.end_transactions([(transaction_id, state)], from_check=from_check)[0]

    def origins(self, transaction_ids) -> list[tuple[str, str] | None]:
        """The real topic and producer group of each transaction, read from its half message
        (``None`` for an id no half of this store carries, or one retention removed): what a
        server authorizes the ending of a transaction by, rather than by the topic a request
        names."""
        ids = list(transaction_ids)
        out: list[tuple[str, str] | None] = []
        with self.store.write_lock():
            index = self.index
            index.refresh()
            for row in index.rows_of(ids):
                try:
                    props = self.store.read_record(index.latest_clog(row)).properties \
                        if row >= 0 else None
                except (IndexError, StoreError):  # the half is gone (retention)
                    props = None
                out.append(None if props is None else (props.get(PROPERTY_REAL_TOPIC, ""),
                                                       props.get(PROPERTY_PRODUCER_GROUP, "")))
        return out

    def end_transactions(self, items: Iterable[tuple[str, object]], *,
                         from_check: bool = False) -> list[bool]:
        """End transactions: commit appends the final message and an op message, rollback
        an op message only, UNKNOW nothing.

        All records of the call go in one append.  Every item is checked before anything is
        written, so a bad item changes nothing.

        Parameters
        ----------
        items : iterable of (transaction_id, state)
            States as :func:`~store.transaction.check_loop.parse_state` accepts them.
        from_check : bool
            The answers come from the check loop.  A late answer that does not (the
            producer's own, or a direct call) is refused for a half with a custom
            CHECK_IMMUNITY_TIME_IN_SECONDS older than that immunity (raised to at least
            ``transaction_timeout_ms``), as RocketMQ's broker refuses it (code 604).

        Returns
        -------
        list of bool
            Per item: ``True`` when this call ended it, ``False`` when it had already ended
            (or the state was UNKNOW).

        Raises
        ------
        UnknownMessageError
            An id no half message of this store carries (not a transaction id of this store,
            an ordinary message's id, or removed by retention).
        TransactionStateError
            A state that is not one of the three, an id that is not a string, or a late
            answer refused as described above.
        """
        txs: list[str] = []
        states: list[LocalTransactionState] = []
        for item in items:
            try:
                transaction_id, state = item
            except (TypeError, ValueError):
                raise TransactionStateError(
                    f"end_transactions item {item!r}; allowed: (transaction_id, state) pairs"
                ) from None
            if not isinstance(transaction_id, str) or not transaction_id:
                raise TransactionStateError(
                    f"transaction id {transaction_id!r}; allowed: the non-empty string "
                    "send_in_transaction returned (its transaction_id / msg_id)")
            txs.append(transaction_id)
            states.append(parse_state(state))
        if not txs:
            return []
        store = self.store
        commit_state = LocalTransactionState.COMMIT_MESSAGE
        unknown_state = LocalTransactionState.UNKNOW
        with store.write_lock():
            index = self.index
            index.refresh()
            rows = np.asarray(index.rows_of(txs), dtype=np.int64)
            missing = np.flatnonzero(rows < 0)
            if len(missing):
                raise UnknownMessageError(
                    f"transaction id {txs[int(missing[0])]!r} is not known to store "
                    f"{store.root}: no half message carries it; allowed: a transaction_id "
                    "returned by send_in_transaction (ids of ordinary messages cannot be ended; "
                    "half messages removed by retention are gone)")
            # an item ends its transaction when it answers, the transaction is open, and no
            # earlier item of the call ended it
            eligible = np.array([s is not unknown_state for s in states]) \
                & ~index.ended(rows)
            pick = np.flatnonzero(eligible)
            _, first = np.unique(rows[pick], return_index=True)
            pick = np.sort(pick[first])
            results = np.zeros(len(txs), dtype=bool)
            results[pick] = True
            end_rows(store, index, [txs[i] for i in pick.tolist()],
                     [states[i].name for i in pick.tolist()],
                     np.array([states[i] is commit_state for i in pick.tolist()], dtype=bool),
                     rows[pick], now=store.now_ms(),
                     timeout_ms=self.settings["transaction_timeout_ms"], from_check=from_check)
        return results.tolist()

    # ------------------------------------------------------------------ the check loop
    def register_listener(self, group: str, listener: object) -> None:
        """Ask ``listener.check_local_transaction`` about halves of producer ``group``."""
        self._listeners[group] = listener

    def forget_listener(self, group: str, listener: object) -> None:
        """Stop asking ``listener`` about ``group`` (if it is still the one registered)."""
        if self._listeners.get(group) is listener:
            del self._listeners[group]

    def _resolve_by_listener(self, view) -> object:
        listener = self._listeners.get(view.producer_group)
        if listener is None:  # no producer of that group in this process: nobody answers
            return LocalTransactionState.UNKNOW
        return listener.check_local_transaction(view)

    def prepare_checks(self, *, max_checks: int | None = None,
                       max_process_ms: int = MAX_PROCESS_TIME_MS) -> CheckPlan:
        """Run a round's bookkeeping; return the transactions to ask about.

        Answers go to :meth:`end_transactions` with ``from_check=True``; an answer never
        given leaves the transaction open for a later round.  Halves of the exactly-once
        sink are answered by the sink (see :meth:`set_sink_settler`), not listed.
        """
        if max_checks is not None and (not isinstance(max_checks, int) or max_checks < 1):
            raise TransactionStateError(f"max_checks={max_checks!r}; allowed: None or an int >= 1")
        with self.store.write_lock():
            plan = run_bookkeeping(self, max_checks=max_checks, max_process_ms=max_process_ms)
            sink = plan.checks.sink
            if not sink.any():
                return plan
            if self._sink_settler is not None:
                self._sink_settler(list(plan.checks.select(sink)))
            return dataclasses.replace(plan, checks=plan.checks.select(~sink))

    def check(self, resolve: Resolve | None = None, *,
              max_checks: int | None = None) -> CheckResult:
        """One round of the check loop, asking ``resolve(view)`` about each open transaction.

        ``resolve`` returns a state (see :func:`parse_state`); an exception or an answer that
        is no state counts as UNKNOW (as RocketMQ treats a failing check listener) and is
        reported in :attr:`CheckResult.errors`.  ``None`` asks the listeners of the
        transaction producers created in this process, by producer group.
        """
        plan = self.prepare_checks(max_checks=max_checks)
        return dataclasses.replace(self.answer(plan.checks, resolve), discarded=plan.discarded,
                                   immune=plan.immune, half_offset=plan.half_offset,
                                   op_offset=plan.op_offset)

    def answer(self, views: Iterable, resolve: Resolve | None = None) -> CheckResult:
        """Ask ``resolve(view)`` (default: this process's listeners) about each view and end
        the transactions it decides, in one append (the answering half of :meth:`check`)."""
        resolve = resolve or self._resolve_by_listener
        answers: list[tuple[str, LocalTransactionState]] = []
        errors: list[str] = []
        unknown = checked = 0
        for view in views:
            checked += 1
            try:
                state = parse_state(resolve(view))
            except Exception as exc:  # noqa: BLE001 - user code: the answer is lost, stays open
                errors.append(f"{view.transaction_id}: {type(exc).__name__}: {exc}")
                state = LocalTransactionState.UNKNOW
            if state is LocalTransactionState.UNKNOW:
                unknown += 1
            else:
                answers.append((view.transaction_id, state))
        done = self.end_transactions(answers, from_check=True) if answers else []
        committed = sum(1 for (_, s), d in zip(answers, done)
                        if d and s is LocalTransactionState.COMMIT_MESSAGE)
        rolled_back = sum(1 for (_, s), d in zip(answers, done)
                          if d and s is LocalTransactionState.ROLLBACK_MESSAGE)
        return CheckResult(checked=checked, committed=committed, rolled_back=rolled_back,
                           unknown=unknown, already_ended=len(done) - committed - rolled_back,
                           errors=tuple(errors[:20]))

    # ------------------------------------------------------------------ stats and lifecycle
    def pending_stats(self) -> dict:
        """Open transactions (neither ended nor discarded) and the oldest one's born time."""
        index = self.index
        index.refresh()
        return index.pending_stats()

    def retention_floor(self) -> int | None:
        """The CommitLog offset of the oldest open half message (its newest copy)."""
        index = self.index
        index.refresh()
        return index.oldest_open_clog()

    def is_ended(self, transaction_ids: Sequence[str]) -> list[bool]:
        """Whether each transaction has ended (per the op queue); unknown ids give False."""
        index = self.index
        index.refresh()
        out = []
        for tx in transaction_ids:
            row = index.row_of(tx)
            out.append(bool(row >= 0 and index.ended(row)))
        return out

    def known(self, transaction_ids: Sequence[str]) -> list[bool]:
        """Whether the index holds a half of each transaction id (ended or not)."""
        index = self.index
        index.refresh()
        return [int(r) >= 0 for r in index.rows_of(transaction_ids)]

    def oldest_open(self, limit: int) -> list[tuple[str, int, int]]:
        """``(transaction id, born ms, CommitLog offset of its newest half copy)`` of the
        ``limit`` oldest open transactions."""
        index = self.index
        index.refresh()
        return index.oldest_open(limit)

    # ------------------------------------------------------------------ the sink's halves
    def open_rows_with_prefix(self, prefix: bytes) -> dict[str, int]:
        """Open transactions whose id starts with ``prefix``: id -> index row (the index
        read up to the queues' end first)."""
        index = self.index
        index.refresh()
        return {index.transaction_id(r): r
                for r in index.open_rows_with_prefix(prefix).tolist()}

    def latest_clog(self, row: int) -> int:
        """CommitLog offset of the newest half copy of index row ``row``."""
        return self.index.latest_clog(row)

    def latest_half_offsets(self, rows: Sequence[int]) -> list[int]:
        """Half queue offsets of the newest half copies of index ``rows`` (what an op
        ending them names)."""
        return self.index.latest_half_offsets(np.array(rows, np.int64)).tolist()

    def transaction_id(self, row: int) -> str:
        """The transaction id of index row ``row``."""
        return self.index.transaction_id(row)

    def mark_ended(self, rows) -> None:
        """Record that the transactions of index ``rows`` ended (their ops landed)."""
        self.index.mark_ended(rows)

    def on_retention(self, commitlog_min: int) -> None:
        """Nothing to delete: the index skips records retention removed when it reads them."""

    def close(self) -> None:
        if self._index is not None:
            from .snapshot import save_index_if_grown

            try:
                save_index_if_grown(self._index)
            except OSError:  # a snapshot is an optimisation only
                pass


def _progress_shape(data: object) -> bool:
    """A progress file as :meth:`TransactionService.save_progress` writes it (else the
    ``.bak`` is tried, then the walk starts from the queues' minimums)."""
    return isinstance(data, dict) and isinstance(data.get("offsetTable", {}), dict)
