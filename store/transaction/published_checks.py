"""Check rounds a server publishes for resolvers elsewhere (``rmq serve --check-transactions``).

Round ``n`` is ``<store>/transaction_checks/server/<n:020d>.arrow``: an Arrow IPC file of the
transactions the round asks about (:data:`store.transaction.check_views.CHECK_SCHEMA`),
written atomically; ``transaction_checks/server/last_round`` holds the newest ``n`` (written
after the file).  The newest :data:`KEEP_ROUNDS` files are kept.  Resolvers only answer: the
Spark ``view=transaction_checks`` query with ``checkRounds=server``, or
``MessageStore.answer_check_rounds`` with this process's listeners.

A check-loop *query* (``checkRounds=query``) keeps the rounds it ran the same way, per
stream (its checkpoint's id, 32 hex digits): ``transaction_checks/<stream>/<n:020d>.arrow``
(:func:`write_query_round`), read by its tasks and deleted once their batch committed.
"""

from __future__ import annotations

import glob
import os
import re

import pyarrow as pa

from ..base.errors import InvalidConfigError
from ..files.fileio import atomic_write
from .check_loop import TransactionCheckView

#: Where published check rounds go, under the store root.
ROUNDS_DIR = os.path.join("transaction_checks", "server")
#: Round files kept (older ones are deleted; their transactions are asked again later).
KEEP_ROUNDS = 1000


def last_check_round(path: str) -> int:
    """The number of the newest check round a server published for the store (0: none)."""
    try:
        with open(os.path.join(path, ROUNDS_DIR, "last_round"), encoding="ascii") as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def check_round_path(path: str, number: int) -> str:
    """The file of published check round ``number`` (it may have been pruned)."""
    return os.path.join(path, ROUNDS_DIR, f"{number:020d}.arrow")


def publish_check_round(path: str, batch: pa.RecordBatch) -> int:
    """Write ``batch`` as the next check round (file first, then the round number, both
    atomically), delete rounds older than :data:`KEEP_ROUNDS`; return its number."""
    number = last_check_round(path) + 1
    os.makedirs(os.path.join(path, ROUNDS_DIR), exist_ok=True)

    def write(fh) -> None:
        with pa.ipc.new_file(fh, batch.schema) as writer:
            writer.write_batch(batch)

    atomic_write(check_round_path(path, number), write)
    atomic_write(os.path.join(path, ROUNDS_DIR, "last_round"), str(number).encode("ascii"))
    old = check_round_path(path, number - KEEP_ROUNDS)
    if number > KEEP_ROUNDS and os.path.exists(old):
        os.unlink(old)
    return number


def read_check_round_table(path: str, number: int) -> pa.Table | None:
    """The rows of round ``number`` (``None`` when it was pruned)."""
    try:
        with open(check_round_path(path, number), "rb") as fh:  # read in: it may be pruned
            return pa.ipc.open_file(fh).read_all()
    except FileNotFoundError:
        return None


def read_check_round(path: str, number: int) -> list[TransactionCheckView]:
    """The transactions round ``number`` asks about, as views (``[]`` when it was pruned)."""
    table = read_check_round_table(path, number)
    rows = [] if table is None else table.to_pylist()
    return [TransactionCheckView(
        topic=r["topic"], queue_id=r["queue_id"], queue_offset=r["queue_offset"],
        commitlog_offset=r["commitlog_offset"], msg_id=r["msg_id"], tags=r["tags"],
        keys=tuple(r["keys"] or ()), body=r["body"], properties=dict(r["properties"] or ()),
        born_timestamp_ms=int(r["born_timestamp"].timestamp() * 1000), store_timestamp_ms=0,
        deliver_timestamp_ms=None, transaction_id=r["transaction_id"], reconsume_times=0,
        producer_group=r["producer_group"] or "", check_times=r["check_times"] or 0)
        for r in rows]


_STREAM = re.compile(r"[0-9a-f]{32}")


def query_round_path(path: str, stream: str, number: int) -> str:
    """The file of round ``number`` of the check-loop query ``stream`` (see the module doc);
    :class:`InvalidConfigError` for a stream that is not 32 hex digits (never a path)."""
    if not isinstance(stream, str) or not _STREAM.fullmatch(stream):
        raise InvalidConfigError(f"check-loop stream {stream!r}; allowed: 32 hex digits")
    return os.path.join(path, "transaction_checks", stream, f"{int(number):020d}.arrow")


def write_query_round(path: str, stream: str, number: int, batch: pa.RecordBatch) -> None:
    """Keep a check-loop query's round ``number`` (atomically: temp file, fsync, rename)."""
    target = query_round_path(path, stream, number)
    os.makedirs(os.path.dirname(target), exist_ok=True)

    def write(fh) -> None:
        with pa.ipc.new_file(fh, batch.schema) as writer:
            writer.write_batch(batch)

    atomic_write(target, write)


def read_query_round(path: str, stream: str, number: int) -> pa.Table | None:
    """A check-loop query's round ``number`` (``None`` once deleted)."""
    try:
        with open(query_round_path(path, stream, number), "rb") as fh:  # read in: may go
            return pa.ipc.open_file(fh).read_all()
    except FileNotFoundError:
        return None


def drop_query_rounds(path: str, stream: str, last: int) -> None:
    """Delete a check-loop query's rounds up to ``last`` (their batch committed)."""
    folder = os.path.dirname(query_round_path(path, stream, 0))
    for name in glob.glob(os.path.join(folder, "*.arrow")):
        stem = os.path.basename(name).split(".")[0]
        if stem.isdigit() and int(stem) <= last:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass


__all__ = ["KEEP_ROUNDS", "drop_query_rounds", "query_round_path", "read_query_round",
           "write_query_round", "ROUNDS_DIR", "check_round_path", "last_check_round",
           "publish_check_round", "read_check_round", "read_check_round_table"]
