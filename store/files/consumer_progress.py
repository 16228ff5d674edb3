"""The consumer groups' progress of the gRPC face: two config files, and their copy over the
network to a replica set's followers.

Files (JSON text, each replaced atomically: a temporary file, then ``os.replace``):

* ``config/consumerOffset.json``: RocketMQ's ``ConsumerOffsetManager`` format,
  ``{"offsetTable": {"topic@group": {queue: committed offset}}}`` (fastjson's text, the
  previous file kept as ``.bak``, other top-level fields kept), where every queue offset
  below the committed one is acked.  A follower also records there
  ``"rmqCopiedEpoch"``: the leader's epoch of the copy it holds (:func:`merged`);
* ``config/rmq_consumer_acks.json``: ``{"topic@group": {"queue": [offset, ...]}}``, the
  offsets acked out of order above the committed one.

A file that cannot be read (torn by a crash before its replace, damaged) reads as its
``.bak`` or as empty: a group then starts again from the queue's oldest message (at least
once), never past a message it did not ack.  Entries that do not parse are skipped.

**The copy** (a leader's ``consumer_progress`` answer to a follower of the previous
version, whose ask has no body; this version's ask and answer, as columns and only what
changed, are :mod:`.progress_table`'s): the same tables as one JSON object, ``{"epoch": <the leader's epoch>, "offsets": {...}, "acks":
{...}}`` (:func:`progress_fields`).  It comes over the network, so :func:`parse_progress`
checks every name, queue and offset and bounds its size (:data:`MAX_QUEUES`,
:data:`MAX_ACKS_PER_QUEUE`) before anything is written
(:class:`~store.base.errors.ConsumerProgressError` otherwise).  A leader leaves out the
acks of a queue holding more than :data:`MAX_ACKS_PER_QUEUE`: a follower that leads later
hands those messages out again (at least once).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field

from ..base.errors import ConsumerProgressError
from ..formats.message import is_valid_topic_name
from .broker_files import read_lenient_json, write_config
from .fileio import atomic_write

OFFSETS_FILE = os.path.join("config", "consumerOffset.json")
ACKS_FILE = os.path.join("config", "rmq_consumer_acks.json")
#: The field of ``consumerOffset.json`` naming the leader's epoch of a follower's copy.
COPIED_EPOCH_FIELD = "rmqCopiedEpoch"
#: Bounds on a copy: (group, topic, queue) entries, and acks above one queue's offset.
MAX_QUEUES = 100_000
MAX_ACKS_PER_QUEUE = 10_000
#: Bound on a queue id and an offset in a copy.
MAX_QUEUE_ID = (1 << 31) - 1
MAX_OFFSET = (1 << 63) - 1

#: One writer of the two files at a time in this process (the temporary file's name is the
#: process's: two threads writing at once would share it).
_WRITING = threading.Lock()

Key = tuple[str, str, int]  # (group, topic, queue)


@dataclass(frozen=True, slots=True)
class ConsumerProgress:
    """The groups' committed offsets and the acks above them, per (group, topic, queue);
    ``epoch``: the leader's epoch of a copy (``None``: a store's own progress)."""

    offsets: dict[Key, int] = field(default_factory=dict)
    acks: dict[Key, frozenset[int]] = field(default_factory=dict)
    epoch: int | None = None


def _per_queue(table, convert) -> dict:
    """``{(group, topic, queue): convert(value)}`` of a ``{"topic@group": {queue: value}}``
    table (RocketMQ's ``offsetTable`` shape); entries that do not parse are skipped."""
    out: dict = {}
    if not isinstance(table, dict):
        return out
    for name, queues in table.items():
        topic, sep, group = str(name).partition("@")
        if not sep or not isinstance(queues, dict):
            continue
        for q, value in queues.items():
            try:
                out[(group, topic, int(q))] = convert(value)
            except (TypeError, ValueError):
                continue
    return out


def read_progress(root: str) -> ConsumerProgress:
    """The progress in the store at ``root``'s two files (see the module docstring)."""
    data = read_lenient_json(os.path.join(root, OFFSETS_FILE))
    data = data if isinstance(data, dict) else {}
    epoch = data.get(COPIED_EPOCH_FIELD)
    return ConsumerProgress(
        _per_queue(data.get("offsetTable"), int),
        _per_queue(read_lenient_json(os.path.join(root, ACKS_FILE)),
                   lambda offsets: frozenset(int(o) for o in offsets)),
        epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None)


def _tables(progress: ConsumerProgress) -> tuple[dict, dict]:
    """The offsets table (integer queue keys, as fastjson writes them) and the acks table
    (string queue keys) of ``progress``; empty ack sets left out."""
    offsets: dict[str, dict[int, int]] = {}
    for (group, topic, q), offset in sorted(progress.offsets.items()):
        offsets.setdefault(f"{topic}@{group}", {})[q] = offset
    acks: dict[str, dict[str, list[int]]] = {}
    for (group, topic, q), acked in sorted(progress.acks.items()):
        if acked:
            acks.setdefault(f"{topic}@{group}", {})[str(q)] = sorted(acked)
    return offsets, acks


def write_progress(root: str, progress: ConsumerProgress, *, sync: bool = False) -> None:
    """Replace the two files with ``progress`` (each atomically; ``sync``: fsynced, as a
    follower's copy is).  The acks go first: a crash between the two leaves acks of the
    newer progress beside an older offset, which a group reads as acks above it."""
    offsets, acks = _tables(progress)
    top: dict = {"offsetTable": offsets}
    if progress.epoch is not None:
        top[COPIED_EPOCH_FIELD] = progress.epoch
    with _WRITING:
        atomic_write(os.path.join(root, ACKS_FILE), json.dumps(acks).encode(), sync=sync)
        write_config(os.path.join(root, OFFSETS_FILE), top)


def progress_fields(progress: ConsumerProgress, epoch: int | None) -> dict:
    """``progress`` as a leader's answer (see the module docstring), ``epoch`` its own;
    within the bounds :func:`parse_progress` checks (the acks of a queue beyond them left
    out, and queues beyond :data:`MAX_QUEUES` too: handed out again after a failover)."""
    keys = sorted(progress.offsets)[:MAX_QUEUES]
    kept = ConsumerProgress(
        {k: progress.offsets[k] for k in keys},
        {k: frozenset(o for o in progress.acks[k] if o > progress.offsets[k])
         for k in keys if k in progress.acks and len(progress.acks[k]) <= MAX_ACKS_PER_QUEUE})
    offsets, acks = _tables(kept)
    return {"epoch": epoch,
            "offsets": {name: {str(q): o for q, o in queues.items()}
                        for name, queues in offsets.items()},
            "acks": acks}


def _int(value: object, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConsumerProgressError(f"{what}: {str(value)[:40]!r}; allowed: an integer from "
                                    f"{low} to {high}")
    return value


def _queues(data: dict, name: str):
    """``(key, value)`` of each queue of table ``name`` of a copy, its names checked."""
    table = data.get(name)
    if not isinstance(table, dict):
        raise ConsumerProgressError(f"the copy's {name!r}: {type(table).__name__}; allowed: "
                                    "an object of \"topic@group\" names")
    for pair, queues in table.items():
        topic, _, group = str(pair).partition("@")
        if not (is_valid_topic_name(topic) and is_valid_topic_name(group)):
            raise ConsumerProgressError(f"the copy's {name!r} names {str(pair)[:80]!r}; "
                                        "allowed: \"topic@group\", each a valid name")
        if not isinstance(queues, dict):
            raise ConsumerProgressError(f"the copy's {name!r} of {pair}: allowed: an object "
                                        "of queue ids")
        for q, value in queues.items():
            if not (isinstance(q, str) and q.isdigit() and len(q) <= 10):
                raise ConsumerProgressError(f"the copy's {name!r} of {pair}: queue "
                                            f"{str(q)[:20]!r}; allowed: a decimal queue id")
            yield (group, topic, _int(int(q), 0, MAX_QUEUE_ID, "a queue id")), value


def parse_progress(data: object) -> ConsumerProgress:
    """A leader's ``consumer_progress`` answer, checked (see the module docstring);
    :class:`~store.base.errors.ConsumerProgressError` says what is wrong."""
    if not isinstance(data, dict) or set(data) != {"epoch", "offsets", "acks"}:
        raise ConsumerProgressError(
            "the copy of the consumer progress: allowed: an object of exactly \"epoch\", "
            f"\"offsets\" and \"acks\", not {str(data)[:80]!r}")
    epoch = data["epoch"]
    if epoch is not None:
        epoch = _int(epoch, 0, MAX_OFFSET, "the copy's epoch")
    offsets = {}
    for key, value in _queues(data, "offsets"):
        offsets[key] = _int(value, 0, MAX_OFFSET, f"the committed offset of {key}")
        if len(offsets) > MAX_QUEUES:
            raise ConsumerProgressError(f"the copy names more than {MAX_QUEUES} queues; "
                                        "allowed: at most that many")
    acks = {}
    for key, value in _queues(data, "acks"):
        if key not in offsets:
            raise ConsumerProgressError(f"the copy acks above {key} without its offset")
        if not isinstance(value, list) or len(value) > MAX_ACKS_PER_QUEUE:
            raise ConsumerProgressError(f"the acks of {key}: allowed: a list of at most "
                                        f"{MAX_ACKS_PER_QUEUE} offsets")
        acks[key] = frozenset(_int(o, offsets[key] + 1, MAX_OFFSET, f"an ack of {key}")
                              for o in value)
    return ConsumerProgress(offsets, acks, epoch)


def merged(held: ConsumerProgress, copy: ConsumerProgress) -> ConsumerProgress | None:
    """What a follower holding ``held`` keeps of its leader's ``copy``; ``None`` to keep
    ``held`` as it is.

    A copy of an earlier epoch than ``held``'s is ignored.  Of the same epoch, each queue
    keeps the copy with the higher committed offset (the newer copy on a tie, for its
    acks), so that no group's offset moves back.  A copy of a later epoch (a new leader)
    is taken whole: its progress is what the new leader serves, and an offset kept from an
    earlier term could lie past messages the new leader's log holds at those offsets.
    """
    if held.epoch is not None and (copy.epoch is None or copy.epoch < held.epoch):
        return None
    if held.epoch != copy.epoch:
        return copy
    offsets, acks = dict(held.offsets), dict(held.acks)
    for key, offset in copy.offsets.items():
        if offset >= offsets.get(key, -1):
            offsets[key] = offset
            acks[key] = copy.acks.get(key, frozenset())
    out = ConsumerProgress(offsets, {k: a for k, a in acks.items() if a}, copy.epoch)
    return None if out == held else out
