"""The ``abort`` marker and the lock files: how processes sharing a store tell a crash.

``abort`` holds ``"{pid} {boot id}"``: it is written by every process that opens the store for
writing and removed by the last one to close it cleanly, so a sole opener that finds it knows
the previous writer crashed.  The boot id (Linux's ``/proc/sys/kernel/random/boot_id``) tells
a crash of a process from a crash of the machine: only after a reboot may the page cache have
lost writes the checkpoint describes.  ``lock`` (appends) and ``open.lock`` (who has the store
open) are empty files used only with ``flock``.
"""

from __future__ import annotations

import fcntl
import os

MARKER_FILE = "abort"


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


#: Identifies this boot of the machine (Linux); empty where unknown.
BOOT_ID = _read_text("/proc/sys/kernel/random/boot_id").strip()


def written_this_boot(path: str) -> bool:
    """Whether the marker at ``path`` was written since the machine last booted."""
    return bool(BOOT_ID) and _read_text(path).split()[1:] == [BOOT_ID]


def write_marker(path: str) -> None:
    """Write this process's marker (pid and boot id)."""
    with open(path, "w", encoding="ascii") as fh:
        fh.write(f"{os.getpid()} {BOOT_ID}")


def try_flock(fd: int, flags: int) -> bool:
    """``flock(fd, flags | LOCK_NB)``; False when another holder has it."""
    try:
        fcntl.flock(fd, flags | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
