"""Which files of the message-key index a query can trust: the first-use check and its verdicts.

A process checks an index file the first time it uses it: its size and header
(:meth:`~store.files.index_file.IndexFile.problem`) and its slots and chains
(:meth:`~store.files.index_file.IndexFile.check_chains`, one compiled pass).  A file can fail
only because another process's builder is at work on it (a file being created, not yet
sized; a put half-published), so :class:`~store.core.key_index.KeyIndex` looks at a failed
file again holding the builders' lock before it counts.  What that finds is the file's
*verdict*, kept here with the file's identity (device, inode, size, modification time): a
later query whose file has the same identity takes the verdict as it stands, without the
lock, a directory listing, opening the file again or checking it again, and the damage is
logged once.  A file replaced (a repair's rename, a copy put back) or changed (written since,
cut again) has another identity and is checked again.  A writable open still sets a damaged
index aside and rebuilds it from the CommitLog.

A query answers what a damaged file held from the CommitLog records instead
(:func:`trusted_and_gaps` gives those ranges), so it never returns fewer messages than were
sent.
"""

from __future__ import annotations

import logging
import os

from ..files.index_file import UNCHECKED, IndexFile

log = logging.getLogger("store.core.key_index")

#: ``(st_dev, st_ino, st_size, st_mtime_ns)`` of a file: what a verdict holds for.
Identity = tuple[int, int, int, int]

#: A range's end past any CommitLog offset.
LOG_END = 1 << 62


def identity(path: str) -> Identity | None:
    """The identity of the file at ``path`` now (``None``: no file there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def file_problem(f: IndexFile) -> str | None:
    """Why ``f`` cannot answer every key it holds (``None``: it can): its size and header
    and, once per opened file, its slots and chains (kept in ``f.chain_problem``)."""
    problem = f.problem()
    if problem is None and f.chain_problem == UNCHECKED:
        f.chain_problem = f.check_chains()
    return problem or f.chain_problem


class DamageVerdicts:
    """The verdicts of one process on the index files found damaged, by path, each with the
    identity of the file it was reached on (see the module docstring)."""

    def __init__(self) -> None:
        self._verdicts: dict[str, tuple[Identity, str]] = {}
        self._said: set[tuple[str, Identity]] = set()

    def settled(self, path: str) -> bool:
        """Whether a verdict holds for the file at ``path`` now (the same identity)."""
        kept = self._verdicts.get(path)
        return kept is not None and kept[0] == identity(path)

    def keep(self, f: IndexFile, problem: str) -> None:
        """Keep ``problem`` as the verdict on ``f`` (reached with no builder at work) and say
        it in the log, once for each identity."""
        now = identity(f.path)
        if now is None:
            return
        self._verdicts[f.path] = (now, problem)
        if (f.path, now) not in self._said:
            self._said.add((f.path, now))
            log.warning("index file %s is damaged (%s): a query walks the CommitLog records "
                        "it held instead (slower) until `rmq repair` or a writable open "
                        "rebuilds the index", f.path, problem)

    def forget(self) -> None:
        """Drop every verdict (this process set files aside or rewrote them)."""
        self._verdicts.clear()


def trusted_and_gaps(files: list[IndexFile], problems: dict[str, str]
                     ) -> tuple[list[IndexFile], list[tuple[int, int]]]:
    """The files (oldest first) a lookup can trust, and the CommitLog ranges the damaged
    ones (named in ``problems``) held: from the last record of the sound file before each
    (the log's start when none) to the first record of the sound file after it (the log's
    end, :data:`LOG_END`, when none), so a query walks them instead."""
    trusted: list[IndexFile] = []
    gaps: list[tuple[int, int]] = []
    open_gap = False
    for f in files:
        if f.name in problems:
            if not open_gap:
                ends = [g.end_phy_offset for g in trusted if g.end_phy_offset >= 0]
                gaps.append((ends[-1] if ends else 0, LOG_END))
            open_gap = True
        elif f.index_count > 1:
            trusted.append(f)
            if open_gap:
                gaps[-1] = (gaps[-1][0], f.header()[2])
            open_gap = False
    return trusted, gaps
