"""Crash-safe small-file writes: the one atomic-replace helper of the store.

Every metadata file (``config/*.json``, ``config/timercheck``, the transaction index snapshot)
is replaced with :func:`atomic_write`: the new content goes to a temporary file in the same
directory, is ``fsync``-ed, renamed over the old file (``os.replace`` is atomic on POSIX) and
the directory is synced, so a crash at any point leaves either the old or the new file, never a
torn one.  JSON files also keep the previous version as ``NAME.bak``; :func:`read_json` falls
back to it when the main file is missing or unreadable.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from typing import IO, Callable

from ..base.errors import DiskFullError

__all__ = ["atomic_write", "fsync_dir", "read_json", "write_json_atomic"]


def allocate(fd: int, size: int, path: str, *, offset: int = 0) -> bool:
    """Reserve the blocks of ``size`` bytes from ``offset`` of an open file
    (``posix_fallocate``; blocks already there cost nothing).  Returns whether they are
    reserved (``False``: the filesystem cannot reserve blocks).

    Files written through a writable ``mmap`` must be allocated first: a store on a full (or
    too small) filesystem would otherwise die of SIGBUS on the first write to a hole.
    Raises :class:`DiskFullError` when the space is not there; a filesystem that cannot
    allocate (EOPNOTSUPP, EINVAL) is left as it is.
    """
    try:
        os.posix_fallocate(fd, offset, size)
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                exc.errno, f"{path}: no space left to allocate {size} bytes "
                f"({os.strerror(exc.errno)}); allowed: a filesystem with room for the store "
                "(free some space, or open the store elsewhere)") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        return False


def disk_full(exc: OSError, path: str, what: str) -> OSError:
    """``exc`` as a :class:`DiskFullError` when it is ENOSPC / EDQUOT, else ``exc``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(exc.errno, f"{path}: {what} failed, the disk is full "
                             f"({os.strerror(exc.errno)}); nothing past the last complete "
                             "append is kept; allowed: free some space and write again")
    return exc


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a rename, a new file) durable; best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, content: bytes | Callable[[IO[bytes]], None], *,
                 keep_backup: bool = False, sync: bool = True) -> None:
    """Replace ``path`` with ``content`` so that a crash never leaves a torn file.

    Parameters
    ----------
    path : str
        The file to replace (created when missing).
    content : bytes or callable
        The new bytes, or a function that writes them to the binary file object it is given.
    keep_backup : bool
        Keep the previous file as ``path + ".bak"`` (read back by :func:`read_json`).
    sync : bool
        ``fsync`` the file and its directory (``False`` only for files that are rebuilt
        anyway after a crash).
    """
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise disk_full(exc, path, "replacing the file") from None
    if keep_backup and os.path.exists(path):
        _keep_backup(path)
    os.replace(tmp, path)
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def _keep_backup(path: str) -> None:
    """Make ``path + ".bak"`` the current ``path`` while ``path`` itself stays in place (a
    hard link, renamed over the old backup): a crash at any point leaves ``path`` readable
    (renaming ``path`` to the backup would leave a moment with no ``path`` at all, and a
    reader of that moment would take the file for missing)."""
    link = f"{path}.bak.tmp.{os.getpid()}"
    try:
        try:
            os.unlink(link)
        except FileNotFoundError:
            pass
        os.link(path, link)
        os.replace(link, path + ".bak")
        return
    except OSError:  # a file system without hard links: a copy
        pass
    try:
        shutil.copyfile(path, link)
        os.replace(link, path + ".bak")
    except OSError:
        pass  # no backup this time; the file itself is replaced atomically all the same


def write_json_atomic(path: str, data: object) -> None:
    """Write ``data`` as JSON with :func:`atomic_write`, keeping the previous file as ``.bak``."""
    text = json.dumps(data, indent=1, sort_keys=True).encode("utf-8")
    atomic_write(path, text, keep_backup=True)


def read_json(path: str, valid: Callable[[object], bool] | None = None) -> object | None:
    """Read a JSON file written by :func:`write_json_atomic`, falling back to its ``.bak``.

    ``valid`` (optional) checks the shape: a file of readable JSON that fails it counts as
    unreadable.  Returns ``None`` when neither file is readable (valid) JSON.
    """
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            continue
        if valid is None or valid(data):
            return data
    return None


def move_aside(path: str) -> str:
    """Rename a damaged file or directory to ``<path>.damaged-<n>`` (the first free ``n``),
    so a rebuild can start afresh without destroying anything; returns the new name."""
    n = 1
    while os.path.exists(f"{path}.damaged-{n}"):
        n += 1
    target = f"{path}.damaged-{n}"
    os.replace(path, target)
    fsync_dir(os.path.dirname(path) or ".")
    return target
