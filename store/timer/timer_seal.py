"""``config/timercheck.seal``: what a clean close left of the timer's files, so that the next
process need not check them unit by unit.

A process's first use of the timer checks the wheel and the TimerLog against each other and
the CommitLog (:func:`store.timer.validation.timer_files_problem`): about 2 µs per TimerLog
unit, most of it reading each pending unit's record, so tens of seconds for ten million
pending messages.  Files that a process wrote and closed cleanly were right when it closed;
what can change them since is damage on disk (bits flipped, ranges zeroed, a file restored
from elsewhere) or another process.  At a clean close (no delivery run under way, the
checkpoint on disk the one this process saved or loaded last) the timer service writes this
seal: CRC32s of the checkpoint's bytes, of the whole wheel and of the TimerLog from its first
file to the checkpointed end.  The next first use computes the same CRCs (hardware CRC32:
about 0.1 s per GB) and skips the unit-by-unit check only when every one matches: any byte
changed in those ranges, the checkpoint saved again (a delivery run, a rebuild), TimerLog
files deleted or added, make it run as before.

Layout (big-endian, 48 bytes, written atomically: temp file, fsync, rename)::

    off  size  type  field
    0    8     i64   magic           :data:`MAGIC`
    8    8     i64   checkpoint_crc  CRC32 of config/timercheck's bytes as saved
    16   8     i64   log_min         offset of the TimerLog's first file
    24   8     i64   log_end         the checkpointed TimerLog end (lastTimerLogFlushPos)
    32   8     i64   wheel_crc       CRC32 of the whole timerwheel
    40   8     i64   log_crc         CRC32 of the TimerLog from log_min to log_end

A seal that is missing, short, of another magic or that does not match is no seal: the check
runs (a damaged seal costs a check, never a skipped one).
"""

from __future__ import annotations

import os

from ..base.crc import crc32
from ..files.fileio import atomic_write
from ..formats.binary_layout import layout
from .timer_checkpoint import CHECKPOINT_FILE_SIZE
from .timer_log import TimerLog
from .wheel import TimerWheel

SEAL_FIELDS = (
    ("magic", ">i8"),  # MAGIC
    ("checkpoint_crc", ">i8"),  # CRC32 of the checkpoint file's bytes
    ("log_min", ">i8"),  # the TimerLog's first file
    ("log_end", ">i8"),  # the checkpointed TimerLog end
    ("wheel_crc", ">i8"),  # CRC32 of the wheel file
    ("log_crc", ">i8"),  # CRC32 of the TimerLog from log_min to log_end
)
SEAL, SEAL_SIZE, _SEAL_DTYPE = layout(SEAL_FIELDS).exports()
#: The seal's first field ("rmqseal1" as a number).
MAGIC = int.from_bytes(b"rmqseal1", "big")
#: The seal's name next to the checkpoint.
SEAL_SUFFIX = ".seal"


def _checkpoint_crc(checkpoint_path: str) -> int | None:
    try:
        with open(checkpoint_path, "rb") as fh:
            return crc32(fh.read(CHECKPOINT_FILE_SIZE))
    except OSError:
        return None


def _fields(checkpoint_path: str, wheel: TimerWheel, log: TimerLog,
            log_end: int) -> tuple[int, ...] | None:
    """The seal's fields for the files as they are (``None``: the checkpoint unreadable, or
    a TimerLog file missing below ``log_end``)."""
    checkpoint = _checkpoint_crc(checkpoint_path)
    if checkpoint is None:
        return None
    files = log.files.refresh()
    log_min = files[0].start if files else log_end
    log_crc = log.crc(log_min, log_end)
    if log_crc is None:
        return None  # a file missing between
    return (MAGIC, checkpoint, log_min, log_end, crc32(wheel.raw_bytes()), log_crc)


def seal_path(checkpoint_path: str) -> str:
    return checkpoint_path + SEAL_SUFFIX


def write_seal(checkpoint_path: str, wheel: TimerWheel, log: TimerLog, log_end: int) -> bool:
    """Seal the timer files as they are (the caller checked that they are this process's
    own, clean state); returns whether it did."""
    fields = _fields(checkpoint_path, wheel, log, log_end)
    if fields is None:
        return False
    atomic_write(seal_path(checkpoint_path), SEAL.pack(*fields))
    return True


def seal_holds(checkpoint_path: str, wheel: TimerWheel, log: TimerLog, log_end: int) -> bool:
    """Whether the seal matches the files byte for byte (the check may be skipped)."""
    try:
        with open(seal_path(checkpoint_path), "rb") as fh:
            data = fh.read(SEAL_SIZE + 1)
    except OSError:
        return False
    if len(data) != SEAL_SIZE:
        return False
    sealed = SEAL.unpack(data)
    if sealed[0] != MAGIC or sealed[3] != log_end:
        return False
    return _fields(checkpoint_path, wheel, log, log_end) == sealed


def remove_seal(checkpoint_path: str) -> None:
    """Drop the seal (the files are about to change)."""
    try:
        os.unlink(seal_path(checkpoint_path))
    except FileNotFoundError:
        pass
