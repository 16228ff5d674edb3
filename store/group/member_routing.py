"""Which member of a store group each message goes to (:mod:`store.group.store_group`).

A topic of a group has the queues of every member: its *route* lists them as
``(member, queue_id)`` pairs, member by member in the group's order, queue ids ascending, as
RocketMQ's producer lists a topic's ``MessageQueue`` objects broker by broker.

* A **sharding key** picks ``route[abs(java_hash(key)) % len(route)]``: RocketMQ's
  ``SelectMessageQueueByHash`` over the whole route, so every message of one key goes to one
  queue of one member and keeps its order.
* Rows with no key are spread over the members either **round robin** (contiguous slices,
  the producer's default) or **by content** (``deterministic=True``, the exactly-once sink):
  the CRC32 of the row's body modulo the member count.  A pure function of the row is what
  lets a Spark batch that is replayed after committing in some members but not others send
  every row to the member it went to the first time (see :mod:`store.group.store_group`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..base.errors import InvalidMessageError
from ..formats.message import java_string_hash
from ..formats.byte_columns import one_array
from ..kernels.segment_walk import body_crcs
from ..produce.table_queues import sharding_hashes


def _java_hashes(keys: list) -> list[int]:
    return [java_string_hash(k) for k in keys]


def body_hashes(table: pa.Table) -> np.ndarray:
    """CRC32 of each row's body (column ``body`` or ``value``, binary or string), int64."""
    name = "body" if "body" in table.column_names else "value"
    col = one_array(table.column(name))
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
    if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise InvalidMessageError(f"column {name} has type {col.type}; allowed: binary or string")
    col = col.fill_null(b"")
    width = np.int64 if pa.types.is_large_binary(col.type) else np.int32
    offsets = np.frombuffer(col.buffers()[1], dtype=width)[col.offset:col.offset + len(col) + 1]
    data = col.buffers()[2]
    buf = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    offsets = offsets.astype(np.int64)
    return body_crcs(buf, offsets[:-1], offsets[1:])


def route_rows(table: pa.Table, members: int, topic_ids: np.ndarray | None,
               routes: list | None,
               *, deterministic: bool, start: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """The member of each row and, for rows with a sharding key, its queue id there.

    Parameters
    ----------
    table : pyarrow.Table
        The rows (the columns of ``send_table``; a ``queue_id`` column is refused: in a group
        a queue id alone does not name a queue).
    members : int
        How many members the group has.
    topic_ids : numpy.ndarray of int or None
        Each row's topic, as an index into ``routes`` (needed with ``routes`` only).
    routes : list or None
        Per topic, its route ``[(member, queue_id), ...]`` (only read for topics of rows
        with a sharding key); ``None``: keys are not routed here (the rows go to their
        member with their ``sharding_key`` column, whose checks then refuse them).
    deterministic : bool
        Rows with no key go to ``crc32(body) % members`` (else: contiguous slices, round
        robin from member ``start``).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray or None)
        Member index per row; queue id per row (-1: the member's own round robin), ``None``
        when the table has no ``sharding_key`` column.
    """
    n = table.num_rows
    if "queue_id" in table.column_names:
        raise InvalidMessageError(
            "column queue_id cannot place rows in a store group (each store has its own queue "
            "ids); allowed: a sharding_key column (rows with one key share a queue), or "
            "writing to one store of the group")
    if deterministic:
        member = (body_hashes(table) % members).astype(np.int64) if members > 1 \
            else np.zeros(n, np.int64)
    else:
        member = (start + (np.arange(n, dtype=np.int64) * members) // max(n, 1)) % members
    if routes is None or "sharding_key" not in table.column_names:
        return member, None
    hashes = sharding_hashes(one_array(table.column("sharding_key")), _java_hashes)
    queue = np.full(n, -1, dtype=np.int64)
    keyed = hashes >= 0
    for topic in np.unique(topic_ids[keyed]).tolist():
        route = routes[topic]
        route_member = np.array([m for m, _ in route], dtype=np.int64)
        route_queue = np.array([q for _, q in route], dtype=np.int64)
        rows = keyed & (topic_ids == topic)
        pick = hashes[rows] % len(route)
        member[rows] = route_member[pick]
        queue[rows] = route_queue[pick]
    return member, queue
