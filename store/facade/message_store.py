"""MessageStore: the store's public face (``facade/``): the core, the services and their factories.

A :class:`MessageStore` is a :class:`~store.core.store_core.StoreCore` (the files, the append
path, reading, recovery, retention) with the three services built on it, as RocketMQ's
``BrokerController`` builds its services outside the store and hands them the store's
interface:

* :class:`~store.delayed.delay_levels.DelayLevelService`: the 4.x delay levels;
* :class:`~store.timer.timer_service.TimerService`: the 5.x timer wheel;
* :class:`~store.transaction.transaction_service.TransactionService`: half messages and the check loop.

Each service sees only the core's narrow port (:class:`~store.core.ports.StorePort`) and makes
itself known through its hooks: the services' system topics (with their tagsCode rules) and the
transaction recovery listener are registered before recovery runs, retention listeners once the
services exist.  :meth:`MessageStore.open` with ``read_only=True`` returns a
:class:`~store.facade.store_reader.StoreReader` instead.
"""

from __future__ import annotations

import os
from typing import Mapping

from ..transaction.published_checks import last_check_round, read_check_round
from ..base import jit
from ..base.config import StoreConfig
from ..core.reading import Clock
from ..core.retention import retention_plan
from ..core.store_core import StoreCore
from ..delayed.delay_levels import DelayLevelService, register_schedule_topic
from ..base.errors import InvalidGroupError
from ..files.group_file import is_group
from .pending_view import pending_messages
from ..produce.producer import Producer
from .store_reader import StoreReader
from ..schedule.recurring_schedule import ScheduleInfo
from ..schedule.schedule_book import ScheduleBook
from ..sink.sink import Sink, register_sink_topic, settle_check_views, sink_retention_floor
from .pending_stats import pending_delayed_stats
from ..timer.timer_service import (TimerService, refuse_broker_timer_of_another_precision,
                                   register_timer_topic)
from ..transaction.check_loop import CheckResult
from ..produce.transaction_producer import TransactionProducer
from ..transaction.commit_repair import register_transaction_recovery
from ..transaction.transaction_service import TransactionService


class MessageStore(StoreCore):
    """A file-backed RocketMQ-style message store.

    Use :meth:`open` (or ``with MessageStore.open(path) as store``).  See the package
    docstring of :mod:`store` for the whole API.
    """

    @classmethod
    def open(cls, path: str | os.PathLike, config: StoreConfig | Mapping | None = None, *,
             clock: Clock | None = None, flush_service: bool = True,
             read_only: bool = False) -> "MessageStore | StoreReader":
        """Open (creating when missing) the store at ``path``; recover it after a crash.

        Parameters
        ----------
        path : str or path-like
            The store directory.
        config : StoreConfig, optional
            Settings; layout settings recorded in an existing store win (see
            :class:`StoreConfig`).
        clock : callable, optional
            Returns "now" in epoch ms; tests pass a controllable one.
        flush_service : bool
            Run the background threads: the flush (every ``flush_interval_commitlog_ms``)
            and the message-key index builder (without it the index is built at open and
            close, and queries walk what it misses).
        read_only : bool
            Open an existing store for reading only (what Spark executors do): returns a
            :class:`~store.facade.store_reader.StoreReader` (no marker, no recovery, no flush thread, no
            writes; every write method raises :class:`~store.base.errors.ReadOnlyStoreError`).
        """
        if is_group(path) and not os.path.isdir(os.path.join(os.fspath(path), "commitlog")):
            raise InvalidGroupError(
                f"{os.fspath(path)} is a store group, not a store; open it with "
                "StoreGroup.open(path), or open one of its stores (see group.json)")
        if read_only:
            return StoreReader.open(path, config, clock=clock)
        return cls(os.fspath(path), config, clock=clock, flush_service=flush_service)

    def __init__(self, path: str, config: StoreConfig | Mapping | None = None, *,
                 clock: Clock | None = None, flush_service: bool = True) -> None:
        given = (StoreConfig.from_dict(dict(config)) if isinstance(config, Mapping)
                 else config or StoreConfig())
        if isinstance(given, StoreConfig):
            # a broker's timer this open would refuse: refused before anything is written
            refuse_broker_timer_of_another_precision(os.path.abspath(path), given)
        super().__init__(path, config, clock=clock)
        # hooks recovery needs, before it runs
        register_schedule_topic(self)
        register_timer_topic(self)
        register_transaction_recovery(self)
        register_sink_topic(self)
        self.start(flush_service=flush_service)
        try:
            self.delay_levels = DelayLevelService(self)
            self.recurring = ScheduleBook(self)
            self.timer = TimerService(self)
            self.transactions = TransactionService(self)
            self.transactions.set_sink_settler(lambda views: settle_check_views(self, views))
        except BaseException:
            self.close()
            raise
        for service in (self.delay_levels, self.timer, self.transactions):
            self.add_retention_listener(service.on_retention)
            self.add_retention_guard(service.retention_floor)
        # the staged records of open stage notes lie before the notes
        self.add_retention_guard(lambda: sink_retention_floor(self))
        self.add_retention_guard(self.recurring.retention_floor)  # (a replica set's book)

    def _close_services(self) -> None:
        for name in ("timer", "delay_levels", "transactions"):
            service = getattr(self, name, None)
            if service is not None:
                service.close()

    # ------------------------------------------------------------------ producers
    def producer(self, group: str = "DEFAULT_PRODUCER") -> Producer:
        """A :class:`~store.produce.producer.Producer` of ``group``."""
        self._check_writable()
        return Producer(self, group)

    def sink(self, sink_id: str, group: str = "rmq-sink", *, commit: str = "index") -> Sink:
        """The exactly-once batch writer of ``sink_id`` (see :mod:`store.sink.sink`): stage rows
        invisible anywhere, commit a batch of them at once, idempotently.  ``commit``:
        ``"index"`` (rows written once, made visible by indexing) or ``"copy"`` (rows staged
        in half messages and copied by the commit: for a store Apache RocketMQ must open)."""
        self._check_writable()
        return Sink(self, sink_id, group, commit=commit)

    def transaction_producer(self, group: str, listener) -> TransactionProducer:
        """A producer that sends half messages and runs ``listener``'s local transaction."""
        self._check_writable()
        return TransactionProducer(self, group, listener)

    # ------------------------------------------------------------------ delayed and transactional
    def deliver_due(self, max_messages: int | None = None) -> int:
        """Move delayed messages due by now into their real topics; return how many.

        ``max_messages`` (``None``: all) bounds the work of one call, so that a caller can
        interleave delivery with reading; repeated calls deliver every due message exactly
        once (delay levels first, then the timer wheel).
        """
        self._check_writable()
        delivered = 0
        # Until this process has the compiled loops (store.base.jit), steps small enough for their
        # Python versions: the first due messages never wait for numba's import or compile.
        while not jit.ready():
            step = jit.FALLBACK_MAX_WORK if max_messages is None else \
                min(jit.FALLBACK_MAX_WORK, max_messages - delivered)
            handled = self._handled()
            done = self._deliver_due(step)
            delivered += done
            # a step may deliver fewer than it may (the timer's budgeted run stops at a slot
            # or a roll step, or spends its budget enqueuing) with more still due: only a
            # step that neither delivered nor handled anything says none is left
            if (not done and self._handled() == handled) \
                    or (max_messages is not None and delivered >= max_messages):
                return delivered
        return delivered + self._deliver_due(
            None if max_messages is None else max_messages - delivered)

    def _handled(self) -> int:
        return self.delay_levels.handled + self.timer.handled

    def _deliver_due(self, max_messages: int | None) -> int:
        if max_messages is None:
            return (self.delay_levels.deliver_due() + self.timer.deliver_due()
                    + self.recurring.fire_due())
        delivered = self.delay_levels.deliver_due(max_messages)
        if delivered >= max_messages:
            return delivered
        delivered += self.timer.deliver_due(max_messages - delivered)
        if delivered >= max_messages:
            return delivered
        return delivered + self.recurring.fire_due(max_messages - delivered)

    # ------------------------------------------------------------------ recurring schedules
    def schedules(self) -> list[ScheduleInfo]:
        """Every recurring schedule of this store, by key, with its next fire time
        (``producer.schedule`` adds them; ``deliver_due`` fires them)."""
        return self.recurring.list()

    def remove_schedule(self, key: str) -> bool:
        """Remove the schedule ``key``: no fire of it happens after this returns.  ``False``
        when there is none."""
        self._check_writable()
        return self.recurring.remove(key)

    def pause_schedule(self, key: str) -> bool:
        """Pause the schedule ``key`` (no fire until resumed); ``False`` when there is none."""
        self._check_writable()
        return self.recurring.set_paused(key, True)

    def resume_schedule(self, key: str) -> bool:
        """Resume the schedule ``key`` from its next fire time after now (the fires due
        while it was paused are skipped); ``False`` when there is none."""
        self._check_writable()
        return self.recurring.set_paused(key, False)

    def known_transactions(self, transaction_ids) -> list[bool]:
        """Whether this store holds the half message of each transaction id (ended or not):
        how a store group finds the member a transaction belongs to."""
        ids = list(transaction_ids)
        if not ids:
            return []
        with self.write_lock():
            return self.transactions.known(ids)

    def transaction_origins(self, transaction_ids) -> list[tuple[str, str] | None]:
        """``(real topic, producer group)`` of each transaction id's half message, ``None``
        for an id this store holds no half of."""
        return self.transactions.origins(transaction_ids)

    def end_transaction(self, transaction_id: str, state) -> bool:
        """Commit or roll back a half message; ``False`` when it was already ended."""
        self._check_writable()
        return self.transactions.end_transaction(transaction_id, state)

    def end_transactions(self, items, *, from_check: bool = False) -> list[bool]:
        """End many transactions in one append: ``items`` of ``(transaction_id, state)``.

        Returns, per item, whether it changed anything (``False``: already ended).
        """
        self._check_writable()
        return self.transactions.end_transactions(items, from_check=from_check)

    def check_transactions(self, resolve=None) -> CheckResult:
        """Run one round of the transaction check loop with ``resolve(view) -> state``.

        Without ``resolve`` the listeners of this process's transaction producers are asked.
        Returns a :class:`~store.transaction.check_loop.CheckResult` (counts of the round).
        """
        self._check_writable()
        return self.transactions.check(resolve)

    def answer_check_rounds(self, resolve=None, *, after: int = 0) -> tuple[int, CheckResult]:
        """Answer the check rounds a server published after round ``after`` (``rmq serve
        --check-transactions``, :mod:`store.transaction.published_checks`), with ``resolve(view)`` or this
        process's listeners, without running a round here.  Returns the newest round
        answered (give it as ``after`` next time) and the counts."""
        self._check_writable()
        last = last_check_round(self.root)
        views = [v for n in range(after + 1, last + 1) for v in read_check_round(self.root, n)]
        return max(last, after), self.transactions.answer(views, resolve)

    def prepare_transaction_checks(self, *, max_checks: int | None = None):
        """The bookkeeping half of a check round, for a resolver outside this process.

        Returns the :class:`~store.transaction.check_loop.CheckPlan` whose ``checks`` are the half
        messages to ask about: a sequence of views, built one by one when accessed, and
        ``checks.to_arrow()`` gives them all as one Arrow batch decoded as columns (what the
        Spark ``transaction_checks`` view reads).
        """
        self._check_writable()
        return self.transactions.prepare_checks(max_checks=max_checks)

    # ------------------------------------------------------------------ stats
    def pending_delayed_stats(self) -> dict:
        """Pending delayed messages: total, per kind, next due time and counts by due time.

        See :func:`store.facade.pending_stats.pending_delayed_stats` for the shape.
        """
        self._check_open()
        return pending_delayed_stats(self.now_ms(), self.delay_levels, self.timer)

    def pending_transaction_stats(self) -> dict:
        """Open transactions (``pending``) and the oldest one's born time (``oldest_born_ms``)."""
        self._check_open()
        return self.transactions.pending_stats()

    def pending_messages(self, limit: int = 20) -> dict:
        """The next delayed messages due and the oldest open transactions, at most ``limit``
        of each (``rmq pending``): ``{"timer", "delay_levels", "transactions"}``, see
        :func:`store.facade.pending_view.pending_messages`."""
        self._check_open()
        return pending_messages(self, limit)

    # ------------------------------------------------------------------ retention
    def retention_plan(self, *, force: bool = False) -> list[dict]:
        """What :meth:`clean_expired_files` would do now (``rmq retention --dry-run``),
        deleting nothing: one dict per CommitLog segment, oldest first (``file``, ``start``,
        ``end``, ``newest_ms``, and ``action``: ``"delete"`` or why it stays, ``"newest"``,
        ``"needed"`` by a pending delayed or open half message, ``"young"``, ``"after a
        kept segment"``)."""
        self._check_open()
        with self.write_lock():
            return retention_plan(self, force=force, guards=self._retention_guards)
