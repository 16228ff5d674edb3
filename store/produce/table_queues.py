"""Ordered sends from a table: the ``queue_id`` and ``sharding_key`` columns.

RocketMQ keeps messages in order within one queue; a producer picks the queue with a
``MessageQueueSelector``, commonly by hashing a key (``SelectMessageQueueByHash``).  A table
given to ``Producer.send_table`` (or written by the Spark sink) may carry one of:

* ``queue_id`` (integer): each row's queue, from 0 to its topic's queue count - 1 (null:
  round robin);
* ``sharding_key`` (string): rows with the same topic and key go to the same queue, the key's
  Java hash modulo the topic's queue count, as :func:`store.formats.message.sharding_queue` (null:
  round robin).

Rows keep their table order within each queue.  :func:`chosen_queues` validates the column
and returns each row's queue (-1: round robin), hashing each distinct key once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.ports import StorePort
from ..base.errors import InvalidMessageError
from ..formats.byte_columns import one_array

QUEUE_COLUMNS = ("queue_id", "sharding_key")


def chosen_queues(store: StorePort, table: pa.Table, topic_names: list,
                  topic_ids: np.ndarray) -> np.ndarray | None:
    """Each row's queue (-1: round robin), or ``None`` when the table has neither column.

    Raises :class:`~store.base.errors.InvalidMessageError` naming the first bad row.  A topic
    that does not exist yet is created here (with its default queue count), as the append
    that follows would.
    """
    given = [c for c in QUEUE_COLUMNS if c in table.column_names]
    if not given:
        return None
    if len(given) == 2:
        raise InvalidMessageError("columns queue_id and sharding_key were both given; allowed: "
                                  "at most one (a queue per row, or a key hashed to a queue)")
    counts = np.array([store.ensure_topic(t) for t in topic_names], dtype=np.int64)
    per_row = counts[topic_ids]
    col = one_array(table.column(given[0]))
    if given[0] == "queue_id":
        if not pa.types.is_integer(col.type):
            raise InvalidMessageError(f"column queue_id has type {col.type}; allowed: an "
                                      "integer type (null: round robin)")
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        values = col.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        bad = valid & ((values < 0) | (values >= per_row))
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidMessageError(
                f"row {i}: queue_id={values[i]} for topic {topic_names[topic_ids[i]]!r}; "
                f"allowed: 0 to {per_row[i] - 1} (the topic's queues) or null (round robin)")
        return np.where(valid, values, -1)
    h = sharding_hashes(col, store.tag_hashes)
    return np.where(h >= 0, h % np.maximum(per_row, 1), -1)


def sharding_hashes(col: pa.Array, hash_keys) -> np.ndarray:
    """``abs(java_hash(key))`` of each row's ``sharding_key`` (-1 for null), validated.

    ``hash_keys(list of str)`` gives the Java hashes of the distinct keys (each key is hashed
    once).  Raises :class:`~store.base.errors.InvalidMessageError` for a column that is not
    string, or an empty key (naming its row).
    """
    if pa.types.is_large_string(col.type):
        col = col.cast(pa.string())
    if not pa.types.is_string(col.type):
        raise InvalidMessageError(f"column sharding_key has type {col.type}; allowed: string "
                                  "(null: round robin)")
    empty = pc.fill_null(pc.equal(col, ""), False).to_numpy(zero_copy_only=False)
    if empty.any():
        raise InvalidMessageError(f"row {int(np.argmax(empty))}: sharding_key is empty; "
                                  "allowed: a non-empty string, or null (round robin)")
    enc = col.dictionary_encode()
    distinct = enc.dictionary.to_pylist()
    hashes = np.append(np.abs(np.asarray(hash_keys(distinct), dtype=np.int64)), -1)
    idx = enc.indices.fill_null(len(distinct)).to_numpy(zero_copy_only=False)
    return hashes[idx.astype(np.int64)]


__all__ = ["QUEUE_COLUMNS", "chosen_queues"]
