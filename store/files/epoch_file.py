"""The epoch file of a replica set's member: each leadership term and the CommitLog offset it
starts at (RocketMQ 5's ``epochFileCheckpoint``, Kafka's ``leader-epoch-checkpoint``).

File: ``config/epochs``, text, replaced atomically (temp file, fsync, ``os.replace``), so a
crash leaves the old file or the new one, never a torn one::

    1                 the format version
    2                 how many terms follow
    1 0               epoch 1 starts at CommitLog offset 0
    2 1048576         epoch 2 starts at offset 1048576 (where its leader's log ended then)

Epochs rise strictly and start offsets never fall.  A leader adds its term when it starts
leading (``rmq serve --replica-set`` as the leader, ``rmq promote``); a follower keeps a copy
of its leader's.  A term ends where the next starts: the history of offsets below a term's
start is that of the earlier terms, which is how a replica that led once finds where its log
and the new leader's part (:func:`divergence`).

A file that cannot be read (not this format, epochs not rising) raises
:class:`~store.base.errors.StoreError` naming it; it is never overwritten by a reader.
"""

from __future__ import annotations

import os
from itertools import pairwise

from ..base.errors import StoreError
from .fileio import atomic_write

EPOCH_FILE = os.path.join("config", "epochs")
VERSION = 1


def read_epochs(root: str) -> list[tuple[int, int]]:
    """The terms recorded for the store at ``root`` as ``(epoch, start offset)``, oldest
    first (``[]``: no file)."""
    path = os.path.join(root, EPOCH_FILE)
    try:
        with open(path, encoding="ascii") as fh:
            lines = fh.read().split("\n")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read the epoch file {path}: {exc}") from None
    try:
        version, count = int(lines[0]), int(lines[1])
        terms = [tuple(int(v) for v in line.split(" ")) for line in lines[2:2 + count]]
    except (ValueError, IndexError):
        raise StoreError(f"the epoch file {path} is damaged (expected: version, count, then "
                         "'epoch offset' lines)") from None
    if version != VERSION or len(terms) != count or any(len(t) != 2 for t in terms):
        raise StoreError(f"the epoch file {path} is damaged (version {version}, {count} "
                         f"terms announced, {len(terms)} read)")
    check_terms(terms, path)
    return terms


def check_terms(terms, where: str) -> None:
    """Refuse terms whose epochs do not rise or whose offsets fall."""
    for (e0, s0), (e1, s1) in pairwise(terms):
        if e1 <= e0 or s1 < s0:
            raise StoreError(f"{where}: term {e1} at offset {s1} after term {e0} at {s0}; "
                             "allowed: epochs rising, offsets never falling")


def write_epochs(root: str, terms) -> None:
    """Replace the epoch file of the store at ``root`` with ``terms``."""
    terms = [(int(e), int(s)) for e, s in terms]
    check_terms(terms, os.path.join(root, EPOCH_FILE))
    text = "\n".join([str(VERSION), str(len(terms))] + [f"{e} {s}" for e, s in terms]) + "\n"
    atomic_write(os.path.join(root, EPOCH_FILE), text.encode("ascii"))


def with_term(terms, epoch: int, start: int) -> list[tuple[int, int]]:
    """``terms`` with a term ``epoch`` starting at ``start`` added: the terms starting past
    ``start`` (a history this log does not hold) dropped first."""
    kept = [(e, s) for e, s in terms if s <= start and e < epoch]
    return kept + [(epoch, start)]


def held_epoch(terms, end: int) -> int:
    """The epoch of the last of ``terms`` a log ending at ``end`` holds bytes of, or starts
    exactly at: the last term starting at or below ``end`` (0: none).  A follower copies
    its leader's terms before their bytes, so its last term may start past its end: its
    bytes are then still those of an earlier term (an election compares this epoch,
    :mod:`store.replication.election`)."""
    held = [int(e) for e, s in terms if int(s) <= end]
    return held[-1] if held else 0


def divergence(mine, theirs) -> int | None:
    """Where a log whose terms are ``mine`` stops agreeing with a log whose terms are
    ``theirs`` (its leader's), as Kafka's leader-epoch truncation finds it; ``None`` when
    nothing of ``mine`` lies outside ``theirs`` as far as the terms tell (or no term is
    shared: nothing can be said).

    Both logs agree up to the end of the latest term they share (same epoch, same start):
    each holds that term's bytes as its one leader wrote them, up to where the term ends in
    that log (the next term's start; a last term has not ended).
    """
    theirs = [(int(e), int(s)) for e, s in theirs]
    shared = set(theirs)
    common = [i for i, term in enumerate(mine) if tuple(term) in shared]
    if not common:
        return None
    last = common[-1]
    epoch = int(mine[last][0])
    ends = []
    if last + 1 < len(mine):
        ends.append(int(mine[last + 1][1]))
    later = [s for e, s in theirs if e > epoch]
    if later:
        ends.append(min(later))
    return min(ends) if ends else None
