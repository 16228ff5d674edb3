"""Store groups: several stores read and written as one, as RocketMQ spreads a topic over brokers.

One store has one CommitLog and one append lock, like one RocketMQ broker: every writer in
every process queues behind it.  A :class:`StoreGroup` is several member stores (each with
its own CommitLog, lock, timer and transaction state), named like brokers and listed in
``group.json`` (:mod:`store.files.group_file`).  A topic of the group has the queues of every
member; what happens where:

* **sending** (:class:`GroupProducer`): a message goes to one member (round robin over the
  members, a member named with ``store=``, or the member owning its sharding key's queue,
  see :mod:`store.group.member_routing`); a table is split by member and every member's share is
  validated before any member writes;
* **delayed and transactional messages** wait, are delivered and are checked inside the
  member that holds them (:meth:`StoreGroup.deliver_due`, :meth:`StoreGroup.check_transactions`
  run every member's own step);
* **the exactly-once sink** (:class:`GroupSink`): rows are routed by content (the CRC32 of
  their body) so that a batch re-run by Spark sends every row to the same member as the first
  time; each member commits its share with its own marker for ``(sink, batch)``.  A batch is
  exactly once in every member, and visible member by member (each member's share at once),
  not in the whole group at one instant: a reader may see one member's rows of a batch a
  moment before another's;
* **reading**: each member is read on its own (``group.store(name)``); the Spark source
  reads a group directory as one stream with offsets keyed by store name.

Members of a group may live on other disks (absolute paths in ``group.json``); every member
must be reachable by every process that opens the group.  A member may also be a store served
on another host (``rmq://HOST:PORT`` in ``group.json``, ``rmq serve --listen`` there): the
group then reaches it through :func:`store.connect`, so one group spans several hosts.  A
table's shares for such members are validated by them (a dry run) before any member writes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa

from ..base.config import StoreConfig
from ..core.following import follow_members
from ..core.reading import Clock
from ..base.errors import (
    InvalidGroupError,
    InvalidMessageError,
    KeyIndexUnavailableError,
    UnknownMessageError,
)
from ..files.group_file import GroupLayout, is_group, read_group, write_group
from .member_routing import route_rows
from .writers import GroupProducer, GroupSink, GroupTransactionProducer, named
from ..formats.message import MessageView, validate_schedule_key, validate_topic
from ..facade.message_store import MessageStore
from ..facade.store_reader import StoreReader
from ..remote import connect
from ..base.remote_address import is_remote
from ..formats.byte_columns import one_array
from ..produce.table_rows import as_table, prepare_rows
from ..timer.delay_keys import key_owners
from ..transaction.check_loop import CheckResult


class StoreGroup:
    """Several member stores read and written as one (see the module docstring).

    Use :meth:`create` for a new group and :meth:`open` for an existing one (or ``with``).
    ``group.store(name)`` is a member (a :class:`~store.MessageStore`, or a
    :class:`~store.StoreReader` when opened read-only).
    """

    def __init__(self, layout: GroupLayout, stores: list) -> None:
        self.layout = layout
        self._stores = stores
        self._next = 0  # round robin over the members

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, path: str | os.PathLike, stores: int | Iterable[str] = 2,
               config: StoreConfig | Mapping | None = None, *, paths: Iterable[str] | None = None,
               clock: Clock | None = None, flush_service: bool = True,
               remote: Mapping | None = None) -> "StoreGroup":
        """Create a group at ``path`` and its member stores, and open it (writable).

        Parameters
        ----------
        stores : int or iterable of str
            How many members (named ``store-0``, ``store-1``, ...) or their names.
        config : StoreConfig, optional
            The settings every member is created with.
        paths : iterable of str, optional
            Each member's directory (relative to ``path``, or absolute to place a member on
            another disk), or the ``rmq://HOST:PORT`` URL of a store served on another host
            (``rmq serve --listen`` there; it must be running); default: a subdirectory of
            ``path`` named after the member.
        remote : mapping, optional
            Keyword arguments of :func:`store.connect` for the served members (``token``,
            ``token_file``, ``timeout_s``, ``tls_root_certs``).
        """
        if isinstance(stores, bool) or (isinstance(stores, int) and stores < 1):
            raise InvalidGroupError(f"stores={stores!r}; allowed: a count >= 1 or the names")
        names = [f"store-{i}" for i in range(stores)] if isinstance(stores, int) else list(stores)
        layout = write_group(path, names, paths)
        for member in layout.paths:
            if not is_remote(member) and os.path.isdir(member) and os.listdir(member):
                raise InvalidGroupError(f"member directory {member} is not empty; allowed: a "
                                        "new or empty directory per member")
        return cls._open_members(layout, config, clock, read_only=False,
                                 flush_service=flush_service, create=True, remote=remote)

    @classmethod
    def open(cls, path: str | os.PathLike, config: StoreConfig | Mapping | None = None, *,
             read_only: bool = False, clock: Clock | None = None,
             flush_service: bool = True, remote: Mapping | None = None) -> "StoreGroup":
        """Open the group at ``path``: every member, writable (recovering each one after a
        crash) or, with ``read_only``, as :class:`~store.StoreReader` objects; a member
        served on another host (an ``rmq://`` path) through :func:`store.connect` with the
        keyword arguments ``remote`` (``token``, ...).

        Raises
        ------
        InvalidGroupError
            ``path`` holds no ``group.json``, or a member's directory holds no store (a
            missing mount: the group never creates an empty member in its place).
        """
        if not is_group(path):
            raise InvalidGroupError(f"{os.fspath(path)} is not a store group (no group.json); "
                                    "allowed: a directory made by StoreGroup.create")
        return cls._open_members(read_group(path), config, clock, read_only=read_only,
                                 flush_service=flush_service, create=False, remote=remote)

    @staticmethod
    def members(path: str | os.PathLike) -> list[tuple[str, str]]:
        """``[(name, directory)]`` of the group at ``path``, from its ``group.json`` alone
        (nothing is opened)."""
        return read_group(path).members()

    @classmethod
    def _open_members(cls, layout: GroupLayout, config, clock, *, read_only: bool,
                      flush_service: bool, create: bool,
                      remote: Mapping | None) -> "StoreGroup":
        stores: list = []
        try:
            for name, member in layout.members():
                if is_remote(member):
                    served = connect(member, **dict(remote or {}))
                    stores.append(served)
                    served.info()  # reachable, and the token accepted
                    continue
                if not create and not os.path.isdir(os.path.join(member, "commitlog")):
                    raise InvalidGroupError(
                        f"store {name!r} of the group {layout.root} is missing: {member} holds "
                        "no store (an unmounted disk?); allowed: the member's store directory")
                if read_only:
                    stores.append(StoreReader.open(member, config, clock=clock))
                else:
                    stores.append(MessageStore.open(member, config, clock=clock,
                                                    flush_service=flush_service))
        except BaseException:
            for store in stores:
                store.close()
            raise
        return cls(layout, stores)

    def close(self) -> None:
        """Close every member (flushing the writable ones)."""
        for store in self._stores:
            store.close()

    def __enter__(self) -> "StoreGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ members
    @property
    def root(self) -> str:
        """The group directory (holding ``group.json``)."""
        return self.layout.root

    @property
    def names(self) -> tuple[str, ...]:
        """The members' names, in the group's fixed order."""
        return self.layout.names

    def store(self, name: str):
        """The member called ``name``."""
        return self._stores[self.member_index(name)]

    @property
    def encode_threads(self) -> int:
        """Threads that encode a large append in each member (see ``MessageStore``'s
        ``encode_threads``); setting it sets every member's."""
        return min(getattr(s, "encode_threads", 1) for s in self._stores)

    @encode_threads.setter
    def encode_threads(self, threads: int) -> None:
        for store in self._stores:
            store.encode_threads = int(threads)

    def stores(self) -> list[tuple[str, object]]:
        """``[(name, store)]`` of every member, in order."""
        return list(zip(self.names, self._stores))

    def member_index(self, name: str) -> int:
        """The position of member ``name`` among the group's stores."""
        if name not in self.names:
            raise InvalidGroupError(f"store {name!r} is not a member of the group "
                                    f"{self.root}; allowed: {', '.join(self.names)}")
        return self.names.index(name)

    def member_at(self, i: int):
        """The member at position ``i``."""
        return self._stores[i]

    def key_owner(self, key: str) -> int:
        """The position of the member that owns a delay key or a schedule key: its sends,
        cancels and schedule live there (see :func:`store.timer.delay_keys.key_owners`)."""
        return int(key_owners([key], len(self._stores))[0])

    def next_member(self) -> int:
        """The position of the next member in the group's round robin (advancing it)."""
        i = self._next % len(self._stores)
        self._next = i + 1
        return i

    # ------------------------------------------------------------------ what the group holds
    def follow(self, topic: str, *, start: str = "latest", poll_interval_s: float = 0.2,
               stop=None, deliver_due: bool = False):
        """``(store name, view)`` of every message of ``topic`` in every store as it becomes
        visible (as :meth:`MessageStore.follow <store.MessageStore.follow>`, each message
        naming its store)."""
        return follow_members(self.stores(), topic, start=start,
                              poll_interval_s=poll_interval_s, stop=stop,
                              deliver_due=deliver_due)

    def topics(self) -> list[str]:
        """User topics of any member, sorted."""
        return sorted({t for s in self._stores for t in s.topics()})

    def queues(self, topic: str) -> list[tuple[str, int]]:
        """The topic's route: ``(store name, queue id)`` of every member's queues, in order."""
        return [(name, q) for name, s in self.stores() if topic in s.topics()
                for q in s.queue_ids(topic)]

    def route(self, topic: str) -> list[tuple[int, int]]:
        """``(member index, queue id)`` of the topic's queues in every member, creating the
        topic where it is missing (a writable group): what sharding keys are hashed over."""
        validate_topic(topic)
        return [(i, q) for i, s in enumerate(self._stores) for q in range(s.ensure_topic(topic))]

    def query_messages(self, topic: str, key: str | None = None, begin_ms: int | None = None,
                       end_ms: int | None = None, max: int = 64
                       ) -> list[tuple[str, MessageView]]:
        """``(store name, view)`` of the messages of ``topic`` by key and/or store time in
        every member (as :meth:`MessageStore.query_messages
        <store.MessageStore.query_messages>` asks one store), at most ``max``: with
        ``key``, the newest ``max`` of every member's answers, oldest first; without, the
        first ``max`` stored in ``[begin_ms, end_ms]``, in store-time order.  A member
        without the topic answers nothing; a member that keeps no key index raises
        :class:`~store.base.errors.KeyIndexUnavailableError` for a key, naming it."""
        found: list[tuple[str, MessageView]] = []
        for name, store in self.stores():
            if topic not in store.topics():
                continue
            try:
                views = store.query_messages(topic, key=key, begin_ms=begin_ms,
                                             end_ms=end_ms, max=max)
            except KeyIndexUnavailableError as exc:
                raise KeyIndexUnavailableError(f"store {name!r} of the group {self.root}: "
                                               f"{exc}") from None
            found.extend((name, v) for v in views)
        found.sort(key=lambda nv: (nv[1].store_timestamp_ms, self.names.index(nv[0]),
                                   nv[1].commitlog_offset))
        return found[-max:] if key is not None else found[:max]

    def view_message(self, msg_id: str, *, topic: str | None = None
                     ) -> tuple[str, MessageView] | None:
        """``(store name, view)`` of the message of ``msg_id`` in the group, ``None`` when
        no member has it (as :meth:`MessageStore.view_message
        <store.MessageStore.view_message>`).  A unique key (``SendResult.msg_id``) is found
        in the member that holds it; an offset message id names a CommitLog offset, which
        several members may hold a message at (their store host is one): it is answered
        only when one member does, else :class:`~store.base.errors.InvalidMessageError`
        names them."""
        answers = [(name, view) for name, store in self.stores()
                   if (view := store.view_message(msg_id, topic=topic)) is not None]
        if len(answers) > 1:
            exact = [(n, v) for n, v in answers if v.msg_id == msg_id]
            if len(exact) == 1:
                return exact[0]
            raise InvalidMessageError(
                f"msg_id {msg_id!r} names a message in more than one store of the group "
                f"{self.root} ({', '.join(n for n, _ in answers)}): an offset message id "
                "names a CommitLog offset, which each store has; allowed: the unique key "
                "(SendResult.msg_id), or the member's own store (group.store(name))")
        return answers[0] if answers else None

    # ------------------------------------------------------------------ writing
    def producer(self, group: str = "DEFAULT_PRODUCER") -> GroupProducer:
        """A :class:`GroupProducer` of producer group ``group`` over every member."""
        return GroupProducer(self, [named(s.producer(group), n) for n, s in self.stores()])

    def sink(self, sink_id: str, group: str = "rmq-sink", *, commit: str = "index") -> GroupSink:
        """The exactly-once batch writer of ``sink_id`` over every member (:class:`GroupSink`;
        ``commit``: see :meth:`MessageStore.sink <store.facade.message_store.MessageStore.sink>`)."""
        return GroupSink(self, [s.sink(sink_id, group, commit=commit) for s in self._stores])

    def transaction_producer(self, group: str, listener) -> GroupTransactionProducer:
        """Transactional sends spread round robin over the members; each half message is
        ended and checked in the member that holds it."""
        return GroupTransactionProducer(
            self, [named(s.transaction_producer(group, listener), n) for n, s in self.stores()])

    def schedules(self) -> list:
        """Every member's recurring schedules, by key (each lives in the member owning it)."""
        return sorted((i for s in self._stores for i in s.schedules()), key=lambda i: i.key)

    def remove_schedule(self, key: str) -> bool:
        """Remove the schedule ``key`` (in the member that owns it)."""
        return self._stores[self.key_owner(validate_schedule_key(key))].remove_schedule(key)

    def pause_schedule(self, key: str) -> bool:
        """Pause the schedule ``key`` (in the member that owns it)."""
        return self._stores[self.key_owner(validate_schedule_key(key))].pause_schedule(key)

    def resume_schedule(self, key: str) -> bool:
        """Resume the schedule ``key`` (in the member that owns it)."""
        return self._stores[self.key_owner(validate_schedule_key(key))].resume_schedule(key)

    def deliver_due(self, max_messages: int | None = None) -> int:
        """Every member delivers its due delayed messages (at most ``max_messages`` each);
        returns how many in all."""
        return sum(s.deliver_due(max_messages) for s in self._stores)

    def check_transactions(self, resolve=None) -> CheckResult:
        """One check round in every member; the counts summed (``half_offset`` and
        ``op_offset``, which are per store, left at 0)."""
        served = [n for n, s in self.stores() if not hasattr(s, "check_transactions")]
        if served:
            raise InvalidGroupError(
                f"stores {served} of the group {self.root} are served on other hosts; their "
                "check rounds run there (`rmq serve --check-transactions`), not here")
        results = [s.check_transactions(resolve) for s in self._stores]
        counts = {f.name: sum(getattr(r, f.name) for r in results)
                  for f in dataclasses.fields(CheckResult)
                  if f.name not in ("errors", "half_offset", "op_offset")}
        return CheckResult(**counts, errors=tuple(e for r in results for e in r.errors))

    def end_transaction(self, transaction_id: str, state) -> bool:
        """End a transaction in the member holding its half message (see
        :meth:`MessageStore.end_transaction <store.MessageStore.end_transaction>`)."""
        for store in self._stores:
            try:
                return store.end_transaction(transaction_id, state)
            except UnknownMessageError:
                continue
        raise UnknownMessageError(
            f"transaction id {transaction_id!r} is not known to any store of the group "
            f"{self.root}; allowed: a transaction_id returned by send_in_transaction")

    def end_transactions(self, items, *, from_check: bool = False) -> list[bool]:
        """End many transactions, each in the member holding its half message (see
        :meth:`MessageStore.end_transactions <store.MessageStore.end_transactions>`): every
        id is looked up first (``UnknownMessageError`` naming one no member knows, nothing
        written), then each member ends its share in one append.  Returns, per item,
        whether it changed anything."""
        items = list(items)
        owner = np.full(len(items), -1, dtype=np.int64)
        ids = [tx for tx, _ in items]
        for i, store in enumerate(self._stores):
            known = np.asarray(store.known_transactions(ids), dtype=bool)
            owner[(owner < 0) & known] = i
        if (owner < 0).any():
            tx = ids[int(np.argmax(owner < 0))]
            raise UnknownMessageError(
                f"transaction id {tx!r} is not known to any store of the group {self.root}; "
                "allowed: a transaction_id returned by send_in_transaction (nothing was ended)")
        done = [False] * len(items)
        for i, store in enumerate(self._stores):
            picked = np.flatnonzero(owner == i).tolist()
            if picked:
                ended = store.end_transactions([items[k] for k in picked], from_check=from_check)
                for k, flag in zip(picked, ended):
                    done[k] = flag
        return done

    def flush(self) -> None:
        """Make every member's appended data durable."""
        for store in self._stores:
            store.flush()

    # ------------------------------------------------------------------ tables
    def split_table(self, data, topic: str | None, *, deterministic: bool) -> list:
        """``[(member, rows prepared for it, their positions in the input)]``, every share
        validated before anything is written (a served member's rows stay a table, checked
        by that member)."""
        table = as_table(data)
        if table.num_rows == 0:
            return []
        routes, topic_ids = None, None
        has_topics = topic is not None or (
            "topic" in table.column_names and table.column("topic").null_count == 0)
        if has_topics and "sharding_key" in table.column_names and \
                table.column("sharding_key").null_count < table.num_rows:
            # keyed rows go by their topic's route (rows with no topic, or a null one, are
            # routed without keys and refused by the members' checks)
            if topic is not None:
                names, topic_ids = [topic], np.zeros(table.num_rows, np.int64)
            else:
                enc = one_array(table.column("topic")).dictionary_encode()
                names = enc.dictionary.to_pylist()
                topic_ids = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            routes = [self.route(t) for t in names]
        member, queue = route_rows(table, len(self._stores), topic_ids, routes,
                                   deterministic=deterministic, start=self.next_member())
        if queue is not None:
            table = table.drop_columns(["sharding_key"]).append_column(
                "queue_id", pa.array(queue, pa.int32(), mask=queue < 0))
        shares = []
        for i, store in enumerate(self._stores):
            positions = np.flatnonzero(member == i)
            if len(positions) == 0:
                continue
            part = table.take(positions)
            if is_remote(getattr(store, "root", "")):
                store.check_table(part, topic=topic)  # validated there, nothing written
                shares.append((i, part, positions))
            else:
                shares.append((i, prepare_rows(store, part, topic=topic), positions))
        return shares
