"""Which store a process has open: the store id, and the directory it opened.

A store directory can be removed or replaced while a process has it open (``rm -rf`` and a
new store made at the same path, a restored backup moved into place).  The process still
holds the old files: without a check it would go on appending to deleted segments
(acknowledging messages nobody will read) and write its progress files (timer checkpoint,
delay-level offsets, queue table) into the *new* store's ``config/``, where they describe
another store's CommitLog.  Two things guard against that:

* **the store id**: a random 128-bit id written into ``config/store.json`` when the store is
  created (a store of an older version gets one at its next writable open).  Progress files
  carry it (or a 64-bit tag derived from it, in the binary ones); a progress file that names
  another store is never adopted: it is rebuilt from the CommitLog, as a damaged one is.
* **the directory's identity**: the device and inode of the store's ``lock`` file, taken
  when the process opened it.  :meth:`DirectoryIdentity.problem` compares them with what the
  path holds now (one ``stat`` call); the append lock checks it each time it
  takes the file lock, so a process notices a removed or replaced store at its next append,
  delivery step or service write, and stops writing to it
  (:class:`~store.base.errors.StoreReplacedError`).
"""

from __future__ import annotations

import os
import uuid

LOCK_NAME = "lock"


def new_store_id() -> str:
    """A fresh store id: 32 lowercase hex digits."""
    return uuid.uuid4().hex


def is_store_id(value: object) -> bool:
    """Whether ``value`` is a store id as :func:`new_store_id` makes them."""
    if not isinstance(value, str) or len(value) != 32:
        return False
    try:
        int(value, 16)
    except ValueError:
        return False
    return value == value.lower()


def store_tag(store_id: str) -> int:
    """The signed 64-bit tag of ``store_id`` kept in binary progress files (never 0: a file
    whose tag is 0 was written before stores had ids, or by RocketMQ)."""
    tag = int(store_id[:16], 16)
    if tag >= 1 << 63:
        tag -= 1 << 64
    return tag or 1


class DirectoryIdentity:
    """The device and inode of a store's ``lock`` file, as opened (a removed or replaced
    store directory, or a store moved away, leaves another file or none at that path).

    Parameters
    ----------
    root : str
        The store directory.
    lock_fd : int
        The open file descriptor of ``root/lock`` (the append lock this process holds).
    """

    def __init__(self, root: str, lock_fd: int) -> None:
        self.root = root
        self.lock_path = os.path.join(root, LOCK_NAME)
        st = os.fstat(lock_fd)
        self._lock = (st.st_dev, st.st_ino)

    def problem(self) -> str | None:
        """``None`` while the path still holds the lock file this process opened; otherwise
        what happened to the store, in words ("was removed", ...)."""
        try:
            st = os.stat(self.lock_path)
        except FileNotFoundError:
            try:
                os.stat(self.root)
            except FileNotFoundError:
                return "was removed"
            return "lost its lock file"
        if (st.st_dev, st.st_ino) != self._lock:
            return "was replaced by another store (its lock file is another file now)"
        return None
