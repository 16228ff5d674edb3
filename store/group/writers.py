"""What writes to a store group: :class:`GroupProducer`, :class:`GroupTransactionProducer`
and :class:`GroupSink` (see :mod:`store.group.store_group` for where each message goes).

They are made by :class:`~store.group.store_group.StoreGroup` and hold it as ``group``; they use its
members, its round robin (``next_member``), its routes and its table split
(``split_table``), through their public methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa

from ..formats.batch_encoding import paused_gc
from ..base.errors import InvalidGroupError, InvalidMessageError
from ..formats.message import Message, SendResult, sharding_queue, validate_schedule_key
from ..sink.sink import SinkCommit
from ..produce.table_producer import RESULT_SCHEMA, append_prepared
from ..produce.table_keys import checked_key_column
from ..produce.table_rows import as_table
from ..schedule.schedule_table import ScheduleTableResult
from ..timer.delay_keys import checked_key_array, key_list, key_shares, validate_delay_key


def named(producer, name: str):
    """A member's producer whose results carry the member's name."""
    producer.store_name = name
    return producer


class GroupProducer:
    """Sends messages of one producer group to a :class:`~store.group.store_group.StoreGroup` (see the module
    docstring for where each message goes)."""

    def __init__(self, group, producers: list) -> None:
        self.group = group
        self._producers = producers

    def _target(self, topic: str, store: str | None, queue_id: int | None,
                sharding_key: str | None) -> tuple[int, int | None]:
        """The member and queue a send goes to (queue ``None``: the member's round robin)."""
        if sharding_key is not None:
            if store is not None or queue_id is not None:
                raise InvalidMessageError("sharding_key with store or queue_id; allowed: a "
                                          "sharding key alone, or a store (and a queue of it)")
            if not isinstance(sharding_key, str) or not sharding_key:
                raise InvalidMessageError(f"sharding_key={sharding_key!r}; allowed: a "
                                          "non-empty str (messages with one key keep order)")
            route = self.group.route(topic)
            return route[sharding_queue(sharding_key, len(route))]
        if store is None:
            if queue_id is not None:
                raise InvalidMessageError(
                    f"queue_id={queue_id!r} without store=...; in a store group each store "
                    "has its own queue ids; allowed: store=<name> with it, or a sharding_key")
            return self.group.next_member(), None
        return self.group.member_index(store), queue_id

    def send(self, message: Message, *, store: str | None = None, queue_id: int | None = None,
             sharding_key: str | None = None, key: str | None = None, **delay) -> SendResult:
        """Send one message (arguments as :meth:`Producer.send <store.produce.producer.Producer.send>`
        plus ``store``: the member to send to; default round robin).  The result's
        ``store_name`` says which member holds it.  A delay ``key`` goes to the member that
        owns the key (:meth:`StoreGroup.key_owner <store.group.store_group.StoreGroup.key_owner>`),
        where the message it replaces waits."""
        if not isinstance(message, Message):
            raise InvalidMessageError(f"expected a store.Message, got {type(message).__name__}")
        if key is not None:
            if store is not None:
                raise InvalidMessageError("key= with store=...; allowed: key= alone (a key's "
                                          "messages live in the member that owns the key)")
            validate_delay_key(key)
            i = self.group.key_owner(key)
            return self._producers[i].send(message, queue_id=queue_id,
                                           sharding_key=sharding_key, key=key, **delay)
        i, queue = self._target(message.topic, store, queue_id, sharding_key)
        return self._producers[i].send(message, queue_id=queue, **delay)

    def send_batch(self, messages, *, store: str | None = None, queue_id: int | None = None,
                   sharding_key: str | None = None) -> list[SendResult]:
        """One batch (RocketMQ's batch rules) to one member: named, chosen by the sharding
        key, or round robin."""
        topic = messages[0].topic if isinstance(messages, (list, tuple)) and messages and \
            isinstance(messages[0], Message) else None
        if topic is None:  # let the member's producer raise its typed error
            return self._producers[0].send_batch(messages)
        i, queue = self._target(topic, store, queue_id, sharding_key)
        return self._producers[i].send_batch(messages, queue_id=queue)

    def send_table(self, data, *, topic: str | None = None) -> pa.Table:
        """Send a table (columns as :meth:`Producer.send_table
        <store.produce.producer.Producer.send_table>`; ``sharding_key`` picks a queue of the whole
        group, a ``queue_id`` column is refused).  Rows are spread round robin over the
        members in contiguous slices; every share is validated before any member writes.
        Returns the results table, in input order, with a ``store`` column."""
        with paused_gc():
            shares = self.group.split_table(data, topic, deterministic=False)
            results = [(i, (self._producers[i].send_table(rows, topic=topic)
                            if isinstance(rows, pa.Table)  # a served member's share
                            else append_prepared(self.group.member_at(i), rows)), positions)
                       for i, rows, positions in shares]
        return self._in_input_order(results)

    def _in_input_order(self, results: list) -> pa.Table:
        """The members' results tables ``[(member, table, input positions)]`` as one, in
        input order, with a ``store`` column."""
        if not results:
            return RESULT_SCHEMA.append(pa.field("store", pa.string())).empty_table()
        tables = [out.append_column("store", pa.array([self.group.names[i]] * out.num_rows,
                                                      pa.string()))
                  for i, out, _ in results]
        inverse = np.argsort(np.concatenate([positions for *_, positions in results]),
                             kind="stable")
        return pa.concat_tables(tables).take(inverse)

    def cancel(self, topic: str | None = None, msg_id: str | None = None, *,
               key: str | None = None) -> bool:
        """Cancel a pending timer message in whichever member holds it (by id), or the one
        a delay key names (in the member that owns the key)."""
        if key is not None:
            if topic is not None or msg_id is not None:
                raise InvalidMessageError("cancel: key= was given with topic / msg_id; "
                                          "allowed: key= alone, or topic and msg_id")
            return self._producers[self.group.key_owner(validate_delay_key(key))].cancel(key=key)
        return any([p.cancel(topic, msg_id) for p in self._producers])

    def _per_owner(self, keys, method: str) -> np.ndarray:
        """``method`` (``cancel_keys`` / ``pending_keys``) asked of each key's owner; one
        bool per key, in input order."""
        keys = key_list(keys)
        out = np.zeros(len(keys), dtype=bool)
        for i, rows in key_shares(keys, len(self._producers)):
            out[rows] = getattr(self._producers[i], method)([keys[r] for r in rows.tolist()])
        return out

    def cancel_keys(self, keys) -> np.ndarray:
        """``cancel_keys`` in each key's owner; per key, whether it named a pending message."""
        return self._per_owner(keys, "cancel_keys")

    def pending_keys(self, keys) -> np.ndarray:
        """Per delay key, whether it names a pending message (asked of its owner)."""
        return self._per_owner(keys, "pending_keys")

    def replace_table(self, data, *, topic: str | None = None) -> pa.Table:
        """``replace_table`` with each row sent to the member that owns its key; results in
        input order, with a ``store`` column."""
        table = as_table(data)
        keys = checked_key_column(table)
        return self._in_input_order([
            (i, self._producers[i].replace_table(table.take(pa.array(rows)), topic=topic), rows)
            for i, rows in key_shares(keys, len(self._producers))])

    def schedule_table(self, data, *, topic: str | None = None):
        """``schedule_table`` with each row applied in the member that owns its key."""
        table = as_table(data)
        if "key" not in table.column_names or table.column("key").null_count:
            return self._producers[0].schedule_table(table, topic=topic)  # its typed error
        changed = unchanged = removed = 0
        for i, rows in key_shares(table.column("key"), len(self._producers)):
            r = self._producers[i].schedule_table(table.take(pa.array(rows)), topic=topic)
            changed, unchanged, removed = (changed + r.changed, unchanged + r.unchanged,
                                           removed + r.removed)
        return ScheduleTableResult(changed, unchanged, removed)

    def schedule(self, message: Message, *, key: str, **options):
        """``schedule`` in the member that owns ``key`` (one member keeps and fires it)."""
        validate_schedule_key(key)
        return self._producers[self.group.key_owner(key)].schedule(message, key=key, **options)


class GroupTransactionProducer:
    """Transactional sends over a group: each goes to the next member, where its half
    message is ended (by the listener's answer) and later checked."""

    def __init__(self, group, producers: list) -> None:
        self.group = group
        self._producers = producers

    def send_in_transaction(self, message: Message, arg: object = None):
        """As :meth:`TransactionProducer.send_in_transaction
        <store.produce.transaction_producer.TransactionProducer.send_in_transaction>`, in one member;
        the result's ``store_name`` names it."""
        i = self.group.next_member()
        return self._producers[i].send_in_transaction(message, arg)


class GroupSink:
    """The exactly-once sink over a group (see the module docstring): :meth:`stage` returns
    the staged halves per member, :meth:`commit` commits each member's share idempotently."""

    def __init__(self, group, sinks: list) -> None:
        self.group = group
        self._sinks = sinks

    def stage(self, data, *, topic: str | None = None) -> dict[str, list[str]]:
        """Validate every row, route each by its body's CRC32 (or its sharding key) and stage
        each member's share; returns ``{store name: [transaction ids]}``."""
        table = as_table(data)
        if "key" in table.column_names:  # keyed rows: to the member owning each key
            return {self.group.names[i]: self._sinks[i].stage(table.take(pa.array(rows)),
                                                              topic=topic)
                    for i, rows in key_shares(checked_key_array(table.column("key")),
                                              len(self._sinks))}
        with paused_gc():
            shares = self.group.split_table(data, topic, deterministic=True)
            return {self.group.names[i]: (self._sinks[i].stage(rows, topic=topic)
                                          if isinstance(rows, pa.Table)  # a served member
                                          else self._sinks[i].stage_prepared(rows))
                    for i, rows, _ in shares}

    def commit(self, batch_id: int, transactions: Mapping[str, Iterable[str]]
               ) -> dict[str, SinkCommit]:
        """Commit batch ``batch_id`` in every member, member by member, each with its own
        marker: a member that committed it before (a replay after a crash between members)
        adds nothing and rolls its new halves back, the others commit their share."""
        unknown = sorted(set(transactions) - set(self.group.names))
        if unknown:
            raise InvalidGroupError(f"halves listed for {unknown}, which are not members of "
                                    f"the group {self.group.root}")
        return {name: sink.commit(batch_id, transactions.get(name, ()))
                for name, sink in zip(self.group.names, self._sinks)}

    def abort(self) -> int:
        """Roll back every open half of this sink in every member; return how many."""
        return sum(sink.abort() for sink in self._sinks)

    def committed_batches(self) -> dict[str, dict[int, dict]]:
        """Per member, its committed batches of this sink (batch id -> marker fields)."""
        return {name: sink.committed_batches() for name, sink in zip(self.group.names,
                                                                      self._sinks)}
