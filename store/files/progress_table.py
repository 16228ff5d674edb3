"""The consumer groups' progress as columns: what a replica set's leader sends its followers
of it, only what changed since they last asked, and what a follower merges and writes.

The two files are :mod:`.consumer_progress`'s (``config/consumerOffset.json``,
``config/rmq_consumer_acks.json``); this module holds the same tables as NumPy columns, one
row per (group, topic, queue), so that checking, merging and writing a copy cost array
operations rather than a Python object per queue:

==============  ========  ===========================================================
column          type      what
==============  ========  ===========================================================
``name``        int64     index into ``names`` (``"topic@group"``, ordered by group,
                          then topic)
``queue``       int64     the queue id
``offset``      int64     the committed offset (every offset below it acked)
``ack_count``   int64     how many offsets above ``offset`` are acked
``acks``        int64     the acked offsets, row after row, each row's ascending
==============  ========  ===========================================================

Rows are ordered by (``name``, ``queue``), one per queue.

**The copy as sent** (the ``consumer_progress`` action asked with a body naming
``"since"``; :meth:`ProgressLog.answer`): ``{"epoch", "log", "version", "since", "names",
"name", "queue", "offset", "ack_count", "acks"}``, the columns as JSON lists of integers.
A leader's :class:`ProgressLog` stamps each row with the version of its progress that last
changed it; a follower sends the leader's epoch, log and version of the copy it holds, and
the leader answers the rows stamped after that version (``since``: that version), or every
row (``since``: ``null``) when the follower holds none, or holds one of another term or of
another log (the leader restarted).  A follower checks every field
(:func:`parse_answer`: the bounds of :mod:`.consumer_progress`, names, no row twice, acks
above their offset, strictly ascending) and a delta against what it holds
(:func:`check_delta`: the same term and log, the version it asked from, no offset moving
back); anything refused leaves its files as they were, and it asks for a full copy next.
A leader of the previous version answers the older shape (:func:`.consumer_progress.
parse_progress`), a follower of the previous version asks without a body and is answered
in that shape (:func:`.consumer_progress.progress_fields`).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass

import numpy as np

from ..base.errors import ConsumerProgressError
from ..formats.message import is_valid_topic_name
from . import consumer_progress as files
from .broker_files import dumps_fastjson, read_lenient_json
from .consumer_progress import ConsumerProgress, read_progress
from .fileio import atomic_write

#: The fields of a copy as sent (see the module docstring).
ANSWER_FIELDS = frozenset({"epoch", "log", "version", "since", "names", "name", "queue",
                           "offset", "ack_count", "acks"})
COLUMNS = ("name", "queue", "offset", "ack_count", "acks")
#: Longest ``log`` id a follower takes.
MAX_LOG_ID = 64

_EMPTY = np.zeros(0, dtype=np.int64)


def _name_order(name: str) -> tuple[str, str]:
    topic, _, group = name.partition("@")
    return group, topic


@dataclass(frozen=True, slots=True, eq=False)
class ProgressTable:
    """The progress as columns (see the module docstring); ``epoch``: the leader's epoch
    of a copy (``None``: a store's own progress)."""

    names: tuple[str, ...]
    name: np.ndarray
    queue: np.ndarray
    offset: np.ndarray
    ack_count: np.ndarray
    acks: np.ndarray
    epoch: int | None = None

    def __len__(self) -> int:
        return len(self.queue)

    def keys(self, lookup: dict[str, int]) -> np.ndarray:
        """Each row's (name, queue) as one sortable integer, the names numbered by
        ``lookup``."""
        ids = np.array([lookup[n] for n in self.names], dtype=np.int64)
        return (ids[self.name] << 32) | self.queue if len(self) else _EMPTY

    def take(self, rows: np.ndarray, epoch: int | None = None) -> ProgressTable:
        """The rows ``rows`` (in that order), only the names they use kept."""
        used, name = np.unique(self.name[rows], return_inverse=True)
        count, acks = _take_ragged(self.ack_count, self.acks, rows)
        return ProgressTable(tuple(self.names[i] for i in used.tolist()),
                             name.astype(np.int64).reshape(-1), self.queue[rows],
                             self.offset[rows], count, acks, epoch)

    def to_progress(self) -> ConsumerProgress:
        """The same progress as :class:`~.consumer_progress.ConsumerProgress`."""
        offsets, acks = {}, {}
        pairs = [_name_order(n) for n in self.names]
        starts = np.cumsum(self.ack_count) - self.ack_count
        for n, q, o, c, s in zip(self.name.tolist(), self.queue.tolist(),
                                 self.offset.tolist(), self.ack_count.tolist(),
                                 starts.tolist()):
            key = (*pairs[n], q)
            offsets[key] = o
            if c:
                acks[key] = frozenset(self.acks[s:s + c].tolist())
        return ConsumerProgress(offsets, acks, self.epoch)


def empty_table(epoch: int | None = None) -> ProgressTable:
    return ProgressTable((), _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, epoch)


def _take_ragged(count: np.ndarray, values: np.ndarray,
                 rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The counts and concatenated values of rows ``rows`` of a ragged column."""
    rows = np.asarray(rows, dtype=np.int64)
    taken = count[rows]
    total = int(taken.sum())
    if not total:
        return taken, _EMPTY
    starts = (np.cumsum(count) - count)[rows]
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(taken) - taken, taken)
    return taken, values[np.repeat(starts, taken) + within]


def _sorted_table(names: list[str], name, queue, offset, count, acks,
                  epoch) -> ProgressTable:
    """A table of unordered rows, ordered (names by group then topic, rows by name and
    queue); the caller has checked there is no row twice."""
    order = sorted(range(len(names)), key=lambda i: _name_order(names[i]))
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names), dtype=np.int64)
    name = rank[name] if len(name) else _EMPTY
    rows = np.lexsort((queue, name))
    count, acks = _take_ragged(count, acks, rows)
    return ProgressTable(tuple(names[i] for i in order), name[rows], queue[rows],
                         offset[rows], count, acks, epoch)


def table_of(progress: ConsumerProgress, *, bounded: bool = False) -> ProgressTable:
    """``progress`` as a table; ``bounded``: within what a follower takes (as
    :func:`~.consumer_progress.progress_fields`: the queues past
    :data:`~.consumer_progress.MAX_QUEUES` and the acks of a queue holding more than
    :data:`~.consumer_progress.MAX_ACKS_PER_QUEUE` left out, acks not above the offset
    dropped)."""
    keys = sorted(progress.offsets)
    if bounded:
        keys = keys[:files.MAX_QUEUES]
    lookup: dict[str, int] = {}
    name, queue, offset, count, acks = [], [], [], [], []
    for key in keys:
        group, topic, q = key
        o = progress.offsets[key]
        acked = sorted(a for a in progress.acks.get(key, ()) if a > o)
        if bounded and len(acked) > files.MAX_ACKS_PER_QUEUE:
            acked = []
        name.append(lookup.setdefault(f"{topic}@{group}", len(lookup)))
        queue.append(q)
        offset.append(o)
        count.append(len(acked))
        acks.extend(acked)
    return _sorted_table(list(lookup), *(np.array(c, dtype=np.int64)
                                         for c in (name, queue, offset, count, acks)),
                         progress.epoch)


# ---------------------------------------------------------------- the files


def _name_rows(queues: dict) -> tuple[list[int], list[int]] | None:
    """The queue ids and offsets of one name's ``{queue: offset}``, converted at C speed;
    ``None`` when an entry needs :func:`~.consumer_progress.read_progress`'s lenience."""
    values = list(queues.values())
    if not set(map(type, values)) <= {int}:
        return None
    try:
        return list(map(int, queues)), values
    except (TypeError, ValueError):
        return None


def read_table(root: str, *, bounded: bool = False) -> tuple[ProgressTable, dict]:
    """The progress in the store at ``root``'s files as a table (what
    ``table_of(read_progress(root), bounded=bounded)`` gives, a name's queues converted
    as columns; ``bounded`` also leaves out the queues a follower would refuse: a name
    that is no ``topic@group``, a queue id or offset out of range), and the other
    top-level fields of ``consumerOffset.json`` (kept by :func:`write_table`)."""
    data = read_lenient_json(os.path.join(root, files.OFFSETS_FILE))
    data = data if isinstance(data, dict) else {}
    other = {k: v for k, v in data.items() if k not in ("offsetTable", files.COPIED_EPOCH_FIELD)}
    epoch = data.get(files.COPIED_EPOCH_FIELD)
    epoch = epoch if type(epoch) is int else None
    offsets, acks = data.get("offsetTable"), read_lenient_json(
        os.path.join(root, files.ACKS_FILE))
    acks = acks if isinstance(acks, dict) else {}
    names: list[str] = []
    name, queue, offset = [], [], []
    for pair, queues in (offsets.items() if isinstance(offsets, dict) else ()):
        topic, sep, group = str(pair).partition("@")
        if not sep or not isinstance(queues, dict) or not queues:
            continue
        if bounded and not (is_valid_topic_name(topic) and is_valid_topic_name(group)):
            continue
        rows = _name_rows(queues)
        if rows is None:  # (entries that are not plain integers: the lenient reader)
            return table_of(read_progress(root), bounded=bounded), other
        name.extend([len(names)] * len(rows[0]))
        names.append(f"{topic}@{group}")
        queue.extend(rows[0])
        offset.extend(rows[1])
    try:
        name, queue, offset = (np.array(c, dtype=np.int64) for c in (name, queue, offset))
    except OverflowError:
        return table_of(read_progress(root), bounded=bounded), other
    if bounded:
        keep = np.flatnonzero((queue >= 0) & (queue <= files.MAX_QUEUE_ID) & (offset >= 0))
        name, queue, offset = name[keep], queue[keep], offset[keep]
    table = _sorted_table(names, name, queue, offset, np.zeros(len(queue), dtype=np.int64),
                          _EMPTY, epoch)
    keys = (table.name << 32) | (table.queue & 0xFFFFFFFF)
    if len(keys) > 1 and (np.diff(keys) == 0).any():  # (a queue twice: "1" and "01")
        return table_of(read_progress(root), bounded=bounded), other
    if bounded and len(table) > files.MAX_QUEUES:
        table = table.take(np.arange(files.MAX_QUEUES), epoch)
        keys = keys[:files.MAX_QUEUES]
    with_acks = _with_acks(table, keys, acks, bounded)
    if with_acks is None:
        return table_of(read_progress(root), bounded=bounded), other
    return with_acks, other


def _with_acks(table: ProgressTable, keys: np.ndarray, acks: dict,
               bounded: bool) -> ProgressTable | None:
    """``table`` with the acks of ``rmq_consumer_acks.json``'s ``acks`` (as
    :func:`table_of` keeps them); ``None`` for an entry that needs the lenient reader."""
    index = {n: i for i, n in enumerate(table.names)}
    rows, lists = [], []
    for pair, queues in acks.items():
        n = index.get(pair)
        if n is None or not isinstance(queues, dict):
            continue
        for q, acked in queues.items():
            try:
                rows.append((n << 32) | (int(q) & 0xFFFFFFFF))
            except (TypeError, ValueError):
                continue
            lists.append(acked)
    if not rows or not len(keys):
        return table
    pos, found = _positions(keys, np.array(rows, dtype=np.int64))
    count = np.zeros(len(table), dtype=np.int64)
    found_acks: dict[int, list[int]] = {}
    offsets = table.offset
    for row, ok, acked in zip(pos.tolist(), found.tolist(), lists):
        if not ok:
            continue
        if not isinstance(acked, list) or not set(map(type, acked)) <= {int}:
            return None
        low = offsets[row]
        kept = sorted({a for a in acked if a > low})
        if bounded and len(kept) > files.MAX_ACKS_PER_QUEUE:
            kept = []
        found_acks[row] = kept
    for row, kept in found_acks.items():
        count[row] = len(kept)
    flat = [a for row in sorted(found_acks) for a in found_acks[row]]
    return ProgressTable(table.names, table.name, table.queue, table.offset, count,
                         np.array(flat, dtype=np.int64) if flat else _EMPTY, table.epoch)


_PLACEHOLDER = "rmq-offset-table-placeholder"


def _offsets_text(table: ProgressTable) -> str:
    """The ``offsetTable`` value as :func:`~.broker_files.dumps_fastjson` writes it at
    depth 1 (names sorted as strings, queues ascending, integer keys bare)."""
    if not len(table):
        return "{}"
    lines = list(map("\t\t\t{}:{}".format, table.queue.tolist(), table.offset.tolist()))
    bounds = np.searchsorted(table.name, np.arange(len(table.names) + 1)).tolist()
    parts = []
    for i in sorted(range(len(table.names)), key=lambda i: table.names[i]):
        body = ",\n".join(lines[bounds[i]:bounds[i + 1]])
        parts.append(f"\t\t{json.dumps(table.names[i], ensure_ascii=False)}:"
                     f"{{\n{body}\n\t\t}}" if body else
                     f"\t\t{json.dumps(table.names[i], ensure_ascii=False)}:{{}}")
    return "{\n" + ",\n".join(parts) + "\n\t}"


def _acks_json(table: ProgressTable) -> bytes:
    """``rmq_consumer_acks.json`` of ``table`` (as :func:`~.consumer_progress.
    write_progress` writes it)."""
    out: dict[str, dict[str, list[int]]] = {}
    rows = np.flatnonzero(table.ack_count)
    if len(rows):
        ends = np.cumsum(table.ack_count)
        for r, start, end in zip(rows.tolist(), (ends - table.ack_count)[rows].tolist(),
                                 ends[rows].tolist()):
            out.setdefault(table.names[table.name[r]], {})[str(int(table.queue[r]))] = \
                table.acks[start:end].tolist()
    return json.dumps(out).encode()


def write_table(root: str, table: ProgressTable, other: dict, *, sync: bool = True) -> None:
    """Replace the two files with ``table`` (the bytes :func:`~.consumer_progress.
    write_progress` writes, with ``other``'s top-level fields), each atomically, the acks
    first (see :func:`~.consumer_progress.write_progress`)."""
    top = {**other, "offsetTable": _PLACEHOLDER}
    if table.epoch is not None:
        top[files.COPIED_EPOCH_FIELD] = table.epoch
    text = dumps_fastjson(top).replace(json.dumps(_PLACEHOLDER), _offsets_text(table), 1)
    with files._WRITING:
        atomic_write(os.path.join(root, files.ACKS_FILE), _acks_json(table), sync=sync)
        atomic_write(os.path.join(root, files.OFFSETS_FILE), text.encode("utf-8"),
                     keep_backup=True, sync=sync)


# ---------------------------------------------------------------- merging


def _union(a: ProgressTable, b: ProgressTable) -> tuple[list[str], dict[str, int]]:
    names = sorted(set(a.names) | set(b.names), key=_name_order)
    return names, {n: i for i, n in enumerate(names)}


def _positions(held_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``keys`` is in the sorted ``held_keys``, and whether it is there."""
    pos = np.searchsorted(held_keys, keys)
    clipped = np.minimum(pos, max(len(held_keys) - 1, 0))
    found = (pos < len(held_keys)) & (held_keys[clipped] == keys if len(held_keys)
                                      else np.zeros(len(keys), dtype=bool))
    return clipped, found


def _same_acks(a: ProgressTable, rows_a: np.ndarray, b: ProgressTable,
               rows_b: np.ndarray) -> np.ndarray:
    """Per pair, whether row ``rows_a[i]`` of ``a`` and ``rows_b[i]`` of ``b`` ack the
    same offsets."""
    count_a, acks_a = _take_ragged(a.ack_count, a.acks, rows_a)
    count_b, acks_b = _take_ragged(b.ack_count, b.acks, rows_b)
    same = count_a == count_b
    if not same.all():  # compare only the pairs of equal counts, value by value
        keep = np.flatnonzero(same)
        count_a, acks_a = _take_ragged(count_a, acks_a, keep)
        count_b, acks_b = _take_ragged(count_b, acks_b, keep)
    else:
        keep = np.arange(len(rows_a))
    if len(acks_a):
        owner = np.repeat(np.arange(len(keep)), count_a)
        differs = np.bincount(owner, weights=acks_a != acks_b, minlength=len(keep)) > 0
        same[keep[differs]] = False
    return same


def changed_rows(old: ProgressTable, new: ProgressTable) -> np.ndarray:
    """Whether each row of ``new`` is new or differs from ``old``'s row of its queue."""
    _, lookup = _union(old, new)
    pos, found = _positions(old.keys(lookup), new.keys(lookup))
    changed = ~found
    both = np.flatnonzero(found)
    changed[both] = ((old.offset[pos[both]] != new.offset[both])
                     | ~_same_acks(old, pos[both], new, both))
    return changed


def merged_table(held: ProgressTable, copy: ProgressTable) -> ProgressTable | None:
    """What a follower holding ``held`` keeps of ``copy`` (a full copy or a delta);
    ``None`` to keep ``held`` as it is: the rules of :func:`~.consumer_progress.merged`
    (an earlier term ignored, a later term's copy taken whole, within a term each queue
    keeps the further offset, the copy's on a tie)."""
    if held.epoch is not None and (copy.epoch is None or copy.epoch < held.epoch):
        return None
    if held.epoch != copy.epoch:
        return copy
    if not len(copy):  # (a delta of nothing: what a quiet interval costs)
        return None
    names, lookup = _union(held, copy)
    held_keys, copy_keys = held.keys(lookup), copy.keys(lookup)
    pos, found = _positions(held_keys, copy_keys)
    held_offset = np.where(found, held.offset[pos] if len(held) else 0, -1)
    taken = copy.offset >= held_offset
    both = np.flatnonzero(found & taken)
    if not (~found).any():
        same = (held.offset[pos[both]] == copy.offset[both]) & _same_acks(
            held, pos[both], copy, both)
        if same.all():
            return None
    replaced = np.zeros(len(held), dtype=bool)
    replaced[pos[both]] = True
    kept = np.flatnonzero(~replaced)
    from_copy = np.flatnonzero(taken)
    keys = np.concatenate([held_keys[kept], copy_keys[from_copy]])
    order = np.argsort(keys, kind="stable")
    count = np.concatenate([held.ack_count[kept], copy.ack_count[from_copy]])
    acks = np.concatenate([_take_ragged(held.ack_count, held.acks, kept)[1],
                           _take_ragged(copy.ack_count, copy.acks, from_copy)[1]])
    count, acks = _take_ragged(count, acks, order)
    keys = keys[order]
    offset = np.concatenate([held.offset[kept], copy.offset[from_copy]])[order]
    out = ProgressTable(tuple(names), keys >> 32, keys & 0xFFFFFFFF, offset, count, acks,
                        copy.epoch)
    used = np.unique(out.name)
    return out if len(used) == len(names) else out.take(np.arange(len(out)), copy.epoch)


def check_delta(held: ProgressTable, held_since: dict | None, answer: dict,
                delta: ProgressTable) -> None:
    """Refuse (:class:`~store.base.errors.ConsumerProgressError`) a delta that does not
    follow the copy a follower holds: of another term or log, from another version than it
    asked, or moving a queue's offset back."""
    if held_since is None:
        raise ConsumerProgressError("the copy is a delta, but no version was asked from; "
                                    "allowed: a full copy")
    epoch, log, version = held_since["epoch"], held_since["log"], held_since["version"]
    if (answer["epoch"], answer["log"], answer["since"]) != (epoch, log, version):
        raise ConsumerProgressError(
            f"the delta follows epoch {answer['epoch']}, log {str(answer['log'])[:20]!r}, "
            f"version {answer['since']}; allowed: the copy held (epoch {epoch}, "
            f"version {version})")
    if answer["version"] < version:
        raise ConsumerProgressError(f"the delta's version {answer['version']} is before "
                                    f"the version {version} it follows")
    if not len(delta):
        return
    _, lookup = _union(held, delta)
    pos, found = _positions(held.keys(lookup), delta.keys(lookup))
    back = found & (delta.offset < (held.offset[pos] if len(held) else 0))
    if back.any():
        row = int(np.flatnonzero(back)[0])
        raise ConsumerProgressError(
            f"the delta moves {delta.names[delta.name[row]]} queue {delta.queue[row]} back "
            f"to {delta.offset[row]}; allowed: an offset at least {held.offset[pos[row]]}")


# ---------------------------------------------------------------- the copy as sent


def answer_fields(table: ProgressTable, *, epoch: int | None, log: str, version: int,
                  since: int | None) -> dict:
    """``table`` as sent (see the module docstring)."""
    return {"epoch": epoch, "log": log, "version": version, "since": since,
            "names": list(table.names), **{c: getattr(table, c).tolist() for c in COLUMNS}}


def _column(data: dict, field: str, low: int, high: int) -> np.ndarray:
    values = data[field]
    if not isinstance(values, list) or not set(map(type, values)) <= {int}:
        raise ConsumerProgressError(f"the copy's {field!r}: allowed: a list of integers")
    try:
        column = np.array(values, dtype=np.int64)
    except OverflowError:
        column = None
    if column is None or (len(column) and (column.min() < low or column.max() > high)):
        raise ConsumerProgressError(f"the copy's {field!r}: allowed: integers from {low} to "
                                    f"{high}")
    return column


def _int_field(data: dict, field: str, *, optional: bool) -> int | None:
    value = data[field]
    if value is None and optional:
        return None
    if type(value) is not int or not 0 <= value <= files.MAX_OFFSET:
        raise ConsumerProgressError(f"the copy's {field}: {str(value)[:40]!r}; allowed: an "
                                    f"integer from 0 to {files.MAX_OFFSET}")
    return value


def parse_answer(data: object) -> ProgressTable:
    """A leader's copy as sent (see the module docstring), checked; its epoch, log, version
    and since are in ``data``.  :class:`~store.base.errors.ConsumerProgressError` says what
    is wrong."""
    if not isinstance(data, dict) or set(data) != ANSWER_FIELDS:
        raise ConsumerProgressError(
            f"the copy of the consumer progress: allowed: an object of exactly "
            f"{sorted(ANSWER_FIELDS)}, not {str(data)[:80]!r}")
    epoch = _int_field(data, "epoch", optional=True)
    _int_field(data, "version", optional=False)
    _int_field(data, "since", optional=True)
    if not isinstance(data["log"], str) or not 0 < len(data["log"]) <= MAX_LOG_ID:
        raise ConsumerProgressError(f"the copy's log: allowed: a text of 1 to {MAX_LOG_ID} "
                                    "characters")
    names = data["names"]
    if not isinstance(names, list) or len(names) > files.MAX_QUEUES:
        raise ConsumerProgressError(f"the copy's names: allowed: a list of at most "
                                    f"{files.MAX_QUEUES}")
    for name in names:
        topic, _, group = str(name).partition("@")
        if not (isinstance(name, str) and is_valid_topic_name(topic)
                and is_valid_topic_name(group)):
            raise ConsumerProgressError(f"the copy names {str(name)[:80]!r}; allowed: "
                                        "\"topic@group\", each a valid name")
    if len(set(names)) != len(names):
        raise ConsumerProgressError("the copy names a \"topic@group\" twice")
    rows = len(data["queue"]) if isinstance(data["queue"], list) else -1
    if rows > files.MAX_QUEUES:
        raise ConsumerProgressError(f"the copy names more than {files.MAX_QUEUES} queues; "
                                    "allowed: at most that many")
    name = _column(data, "name", 0, len(names) - 1)
    queue = _column(data, "queue", 0, files.MAX_QUEUE_ID)
    offset = _column(data, "offset", 0, files.MAX_OFFSET)
    count = _column(data, "ack_count", 0, files.MAX_ACKS_PER_QUEUE)
    if not len(name) == len(queue) == len(offset) == len(count):
        raise ConsumerProgressError("the copy's columns name, queue, offset and ack_count: "
                                    "allowed: lists of one length")
    if int(count.sum()) > files.MAX_QUEUES * files.MAX_ACKS_PER_QUEUE:
        raise ConsumerProgressError("the copy holds too many acks")
    acks = _column(data, "acks", 0, files.MAX_OFFSET)
    if len(acks) != int(count.sum()):
        raise ConsumerProgressError(f"the copy's acks: {len(acks)}; allowed: as many as "
                                    f"the ack counts add up to ({int(count.sum())})")
    owner = np.repeat(np.arange(len(count)), count)
    if len(acks) and (acks <= offset[owner]).any():
        raise ConsumerProgressError("the copy acks an offset below its queue's committed "
                                    "offset; allowed: acks above it")
    if len(acks) > 1 and ((np.diff(acks) <= 0) & (owner[1:] == owner[:-1])).any():
        raise ConsumerProgressError("the copy's acks of a queue: allowed: strictly ascending")
    keys = (name << 32) | queue
    if len(np.unique(keys)) != len(keys):
        raise ConsumerProgressError("the copy names a queue twice; allowed: once")
    return _sorted_table(list(names), name, queue, offset, count, acks, epoch)


# ---------------------------------------------------------------- the leader's side


class ProgressLog:
    """A leader's progress with each row stamped by the version that last changed it, read
    again from the files only when they changed (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root
        #: This log's id: a follower's version is worth something only within it.
        self.log = secrets.token_hex(8)
        self.version = 0
        self._table = empty_table()
        self._stamps = _EMPTY
        self._seen: object = None
        self._lock = threading.Lock()

    def _files_state(self) -> tuple:
        out = []
        for name in (files.OFFSETS_FILE, files.ACKS_FILE):
            try:
                st = os.stat(os.path.join(self.root, name))
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def _refresh(self) -> None:
        state = self._files_state()
        if state == self._seen:
            return
        table = read_table(self.root, bounded=True)[0]
        changed = changed_rows(self._table, table)
        if changed.any() or len(table) != len(self._table):
            self.version += 1
        _, lookup = _union(self._table, table)
        pos, found = _positions(self._table.keys(lookup), table.keys(lookup))
        stamps = np.where(found, self._stamps[pos] if len(self._stamps) else 0, 0)
        self._stamps = np.where(changed, self.version, stamps)
        self._table, self._seen = table, state

    def answer(self, epoch: int | None, body: dict) -> dict:
        """The answer to a ``consumer_progress`` action of ``body`` by a leader of
        ``epoch``: the older shape for a body without ``"since"`` (a follower of the
        previous version), else the rows changed since the follower's version, or all."""
        with self._lock:
            self._refresh()
            table, stamps, version = self._table, self._stamps, self.version
        if "since" not in body:
            return files.progress_fields(table.to_progress(), epoch)
        since = body["since"]
        asked = None
        if (isinstance(since, dict) and since.get("epoch") == epoch and epoch is not None
                and since.get("log") == self.log and type(since.get("version")) is int
                and 0 <= since["version"] <= version):
            asked = since["version"]
        if asked is not None:
            table = table.take(np.flatnonzero(stamps > asked))
        return answer_fields(table, epoch=epoch, log=self.log, version=version, since=asked)


_LOGS: dict[str, ProgressLog] = {}
_LOGS_LOCK = threading.Lock()


def progress_log(root: str) -> ProgressLog:
    """The one :class:`ProgressLog` of the store at ``root`` in this process."""
    key = os.path.realpath(root)
    with _LOGS_LOCK:
        log = _LOGS.get(key)
        if log is None:
            log = _LOGS[key] = ProgressLog(root)
        return log
