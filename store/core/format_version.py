"""The on-disk format version of a store, and moving an older format forward.

``config/store.json`` records ``format_version`` when a store is created: the layout of every
file rmq writes (CommitLog records, ConsumeQueue entries, the timer's wheel, log and
checkpoint, the delay levels' offsets, the key table, the schedule book, the transaction
files).  A store without the field was written before the version was recorded; its files
have the layout of version 1 (fields added since, such as the store id, are read as absent).

* A store whose version is **newer** than this rmq's :data:`FORMAT_VERSION` is refused with
  :class:`~store.base.errors.StoreFormatError`, by writable and read-only opens alike: this rmq
  cannot know what the newer files mean, and guessing could deliver a message twice or lose
  one.
* A store whose version is **older** is moved forward by the steps in :data:`MIGRATIONS` at
  its next writable open, one version at a time, each step's files copied aside first
  (``config/format-v<N>/``: never rewritten in place without a copy), and the new version
  recorded last, so a crash in between redoes the step from its copies.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable

from ..base.errors import StoreFormatError

log = logging.getLogger("store")

#: The format this rmq writes and reads.
FORMAT_VERSION = 1

#: The version of a store that records none (written before versions were recorded).
UNRECORDED_VERSION = 1

#: A step from version ``N`` to ``N + 1``: ``(files it rewrites, relative to the store root;
#: the function that rewrites them, given the root)``.
Migration = tuple[tuple[str, ...], Callable[[str], None]]

#: ``N`` -> the step from ``N`` to ``N + 1`` (none yet: version 1 is the first).
MIGRATIONS: dict[int, Migration] = {}


def recorded_version(recorded: dict | None) -> int:
    """The format version in a parsed ``config/store.json`` (``None``: no file)."""
    version = (recorded or {}).get("format_version", UNRECORDED_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return UNRECORDED_VERSION  # (the layout record's checksum does not cover it)
    return version


def check_readable(root: str, version: int) -> None:
    """Raise :class:`~store.base.errors.StoreFormatError` for a store newer than this rmq."""
    if version > FORMAT_VERSION:
        raise StoreFormatError(
            f"store {root} has on-disk format version {version}; this rmq reads format "
            f"versions 1 to {FORMAT_VERSION}. Open it with the rmq release that wrote it, or "
            "a newer one; nothing was changed")


def migrate(root: str, version: int, migrations: dict[int, Migration] | None = None) -> int:
    """Move the store at ``root`` from ``version`` to :data:`FORMAT_VERSION` (see the module
    docstring); returns the version reached.  The caller records it."""
    steps = MIGRATIONS if migrations is None else migrations
    while version < FORMAT_VERSION:
        if version not in steps:
            raise StoreFormatError(
                f"store {root} has on-disk format version {version}, and this rmq has no "
                f"step from it to version {version + 1}; open it with an rmq release between")
        files, step = steps[version]
        aside = os.path.join(root, "config", f"format-v{version}")
        os.makedirs(aside, exist_ok=True)
        for name in files:
            src, dst = os.path.join(root, name), os.path.join(aside, name.replace(os.sep, "__"))
            if os.path.exists(src) and not os.path.exists(dst):  # a redo keeps the first copy
                shutil.copy2(src, dst)
        step(root)
        log.warning("store %s moved from format version %d to %d (the files it changed are "
                    "kept in %s)", root, version, version + 1, aside)
        version += 1
    return version
