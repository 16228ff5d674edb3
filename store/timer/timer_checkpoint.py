"""``config/timercheck``: the timer's progress, a 4096-byte binary file.

Layout (big-endian i64 fields; the first seven are RocketMQ's TimerCheckpoint)::

    off  size  field
    0    8     lastReadTimeMs          the next slot time to deliver; slots before it are done
    8    8     lastTimerLogFlushPos    TimerLog end: units below it are valid and in the wheel
    16   8     lastTimerQueueOffset    next rmq_sys_wheel_timer ConsumeQueue offset to enqueue
    24   8     masterTimerQueueOffset  the same (single node)
    32   8     dataVersion.stateVersion
    40   8     dataVersion.timestamp   ms of the last save
    48   8     dataVersion.counter     +1 per save
    56   8     deliverMark             ours: CommitLog offset where an unfinished delivery run
                                       began, -1 when none (see store.timer.timer_service)
    64   8     precisionMs             ours: timer_precision_ms the wheel was built with
    72   8     wheelSlots              ours: timer_wheel_slots the wheel was built with
    80   8     slotDone                ours: units of the slot at lastReadTimeMs already
                                       handled, in append order (a bounded run stopped
                                       inside that slot); 0 otherwise
    88   8     storeTag                ours: the store it belongs to (store.core.identity's
                                       tag of the store id); 0 when written before stores
                                       had ids (or by RocketMQ)
    96   8     slotDoneFrom            ours: 1 + the CommitLog offset from which the
                                       last delivery run appended (where the delivered
                                       copies of the slot at lastReadTimeMs, if any, lie;
                                       written with a slotDone of 0 too; a hint for
                                       checking slotDone, see store.timer.validation);
                                       0: none (an earlier version's checkpoint)
    104   8     logCrcFrom              ours: 1 + the TimerLog offset from which logCrc
                                       covers the log; 0: none (a checkpoint of an
                                       earlier version)
    112   8     logCrc                  ours: CRC32 of the TimerLog's bytes from there to
                                       lastTimerLogFlushPos, extended by every append (the
                                       units below it need no unit-by-unit check after a
                                       crash when it matches, see store.timer.validation)
    120   8     savedEndFrom            ours: 1 + the CommitLog's confirmed end when this
                                       checkpoint was saved: a timer delivery appended
                                       after it (a copy with TIMER_DEQUEUE_MS) was made by
                                       a run this checkpoint does not know of (it is a stale
                                       copy: a restored backup, an older file), whose
                                       deliveries are then skipped as a dead run's are (see
                                       store.timer.timer_service); 0: none (an earlier
                                       version's checkpoint)
    128   8     tagsHashedTo            ours: 1 + the timer queue offset below which every
                                       entry's tagsCode is a tag hash (entries an earlier
                                       rmq indexed by fire time were rewritten, see
                                       store.timer.timer_queue.upgrade_tags_codes): the
                                       next open looks only at the entries from there on;
                                       0: not known (the whole queue is looked at)

The rest of the file is zero.  Unlike RocketMQ's mapped file, it is replaced atomically
(temp file, fsync, rename), so a crash leaves the old or the new checkpoint, never a mix; other
processes notice a new one by its inode and mtime.

``config/timercheck.rmq`` (the *owner mark*, a few bytes of text) is written once the file
holds a checkpoint rmq saved: from then on the timer files are rmq's, and a checkpoint that
lacks rmq's fields is damage (bytes zeroed), never a RocketMQ broker's to take over.  Only
the mark's presence counts; it is written after the first save (a crash in between leaves a
checkpoint with rmq's fields, which is rmq's anyway) and never removed.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from dataclasses import dataclass, fields

import numpy as np

from ..base.errors import ConfigMismatchError
from ..files.fileio import atomic_write
from .timer_log import UNIT_SIZE

CHECKPOINT_FIELDS = (
    "last_read_time_ms", "last_timer_log_flush_pos", "last_timer_queue_offset",
    "master_timer_queue_offset", "state_version", "timestamp", "counter",
    "deliver_mark", "precision_ms", "wheel_slots", "slot_done", "store_tag",
    "slot_done_from", "log_crc_from", "log_crc", "saved_end_from",
    "tags_hashed_to",
)
CHECKPOINT_LAYOUT = struct.Struct(">" + "q" * len(CHECKPOINT_FIELDS))
CHECKPOINT_FILE_SIZE = 4096


@dataclass
class TimerCheckpoint:
    """The fields of ``config/timercheck`` (see the module docstring)."""

    last_read_time_ms: int = 0
    last_timer_log_flush_pos: int = 0
    last_timer_queue_offset: int = 0
    master_timer_queue_offset: int = 0
    state_version: int = 0
    timestamp: int = 0
    counter: int = 0
    deliver_mark: int = -1
    precision_ms: int = 0
    wheel_slots: int = 0
    slot_done: int = 0
    store_tag: int = 0
    slot_done_from: int = 0
    log_crc_from: int = 0
    log_crc: int = 0
    saved_end_from: int = 0
    tags_hashed_to: int = 0

    def pack(self) -> bytes:
        """The checkpoint as its on-disk bytes."""
        data = CHECKPOINT_LAYOUT.pack(*(getattr(self, f.name) for f in fields(self)))
        return data + bytes(CHECKPOINT_FILE_SIZE - len(data))

    @classmethod
    def unpack(cls, data: bytes) -> TimerCheckpoint:
        """Read a checkpoint from its on-disk bytes."""
        return cls(*CHECKPOINT_LAYOUT.unpack_from(data, 0))

    def copy(self) -> TimerCheckpoint:
        return TimerCheckpoint(*(getattr(self, f.name) for f in fields(self)))


def file_stamp(path: str) -> tuple[int, int, int] | None:
    """What identifies one version of the file (changes whenever it is replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


_YEAR_2000_MS = 946_684_800_000


OWNER_MARK_SUFFIX = ".rmq"
_OWNER_MARK_TEXT = b"the timer files of this store are rmq's (see store.timer.timer_checkpoint)\n"


def owner_mark_path(path: str) -> str:
    """The owner mark of the checkpoint at ``path`` (see the module docstring)."""
    return path + OWNER_MARK_SUFFIX


def marked_as_rmqs(path: str) -> bool:
    """Whether rmq has saved the checkpoint at ``path`` before (its owner mark exists)."""
    return os.path.exists(owner_mark_path(path))


def mark_as_rmqs(path: str) -> None:
    """Write the owner mark of the checkpoint at ``path`` (after rmq saved it)."""
    if not marked_as_rmqs(path):
        atomic_write(owner_mark_path(path), _OWNER_MARK_TEXT)


def written_by_rocketmq(state: TimerCheckpoint, path: str | None = None) -> bool:
    """Whether a loaded checkpoint is a RocketMQ 5 broker's: it lacks rmq's fields (RocketMQ
    writes bytes 0..55 only), holds a broker's progress (a read time after 2000: a file of
    zeros, or one whose read time was zeroed, is damage) and, when the file's ``path`` is
    given, rmq never saved it (no owner mark): rmq's own checkpoint with its fields zeroed
    is damage, rebuilt from the CommitLog, never taken over as a broker's."""
    return state.precision_ms == 0 and state.wheel_slots == 0 and state.deliver_mark == 0 \
        and state.store_tag == 0 and state.last_read_time_ms >= _YEAR_2000_MS \
        and (path is None or not marked_as_rmqs(path))


def adopt_rocketmq(state: TimerCheckpoint, live_ticks: np.ndarray, precision_ms: int,
                   slots: int) -> TimerCheckpoint:
    """Take over a RocketMQ 5 broker's timer progress (its ``timercheck``, ``timerwheel``
    and ``timerlog``): the wheel goes on from the broker's read time and queue offset, so
    nothing it delivered is delivered again and nothing it holds is lost.

    The broker's precision is not recorded; under ``precision_ms`` its live slots
    (``live_ticks``: slot time / precision of every non-empty slot) must lie after 2000 and
    less than one wheel turn past its read time, and the read time must be a multiple of
    ``precision_ms`` (a precision off by a factor of 2 or more fails one of these).  Raises
    :class:`~store.base.errors.ConfigMismatchError` otherwise: rebuilding the wheel instead would
    deliver again what the broker already delivered.
    """
    check_broker_precision(state, live_ticks, precision_ms, slots)
    return dataclasses.replace(state, precision_ms=precision_ms, wheel_slots=slots,
                               deliver_mark=-1, slot_done=0, slot_done_from=0)


def check_broker_precision(state: TimerCheckpoint, live_ticks: np.ndarray, precision_ms: int,
                           slots: int) -> None:
    """Raise :class:`~store.base.errors.ConfigMismatchError` when a RocketMQ 5 broker's
    timer (its checkpoint ``state`` and the ``live_ticks`` of its wheel of ``slots`` slots)
    cannot have been written with ``precision_ms`` (see :func:`adopt_rocketmq`)."""
    read = state.last_read_time_ms
    times = live_ticks.astype(np.int64) * precision_ms
    span = slots * precision_ms
    if read % precision_ms or ((times < _YEAR_2000_MS) | (times >= read + span)).any():
        raise ConfigMismatchError(
            f"the timer files were written by a RocketMQ broker whose timerPrecisionMs is not "
            f"{precision_ms} (read time {read}, slot times {times[:3].tolist()}); open the store "
            "with StoreConfig(timer_precision_ms=<the broker's timerPrecisionMs>)")


def load(path: str) -> TimerCheckpoint | None:
    """Read the checkpoint, or ``None`` when the file is missing or too short."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(CHECKPOINT_FILE_SIZE)
    except FileNotFoundError:
        return None
    if len(data) < CHECKPOINT_LAYOUT.size:
        return None
    return TimerCheckpoint.unpack(data)


def foreign_or_impossible(state: TimerCheckpoint, *, store_tag: int, queue_end: int,
                          log_end: int, commitlog_end: int) -> str | None:
    """Why ``state`` cannot describe this store's timer, or ``None``.

    It names another store (a process that had a removed store open wrote it into the new
    one at that path), or a field points past what it derives from: the timer topic's
    queue (``queue_end``), the TimerLog's files (``log_end``) or the CommitLog
    (``commitlog_end``), or its read time lies after the time it was saved (bits flipped
    there would skip every slot between).  Such a checkpoint is never adopted: the timer is rebuilt from the
    timer topic's queue instead.
    """
    if state.store_tag not in (0, store_tag):
        return ("it names another store (written by a process that had a removed store "
                "open), or its store tag is damaged")
    if not 0 <= state.last_timer_queue_offset <= queue_end:
        return (f"its timer queue offset {state.last_timer_queue_offset} is not within the "
                f"timer queue (0 to {queue_end})")
    if not 0 <= state.last_timer_log_flush_pos <= log_end:
        return (f"its TimerLog end {state.last_timer_log_flush_pos} is past the TimerLog's "
                f"files (0 to {log_end})")
    if state.precision_ms > 0 and state.timestamp > 0 \
            and state.last_read_time_ms > state.timestamp + state.precision_ms:
        # (rmq's saves: the read time only moves to slots already due at the save's time)
        return (f"its read time {state.last_read_time_ms} is after its own save time "
                f"{state.timestamp}: slots not due yet cannot be done")
    if not 0 <= state.slot_done <= state.last_timer_log_flush_pos // UNIT_SIZE:
        # (a slot holds at most the units below the TimerLog's end; a small wrong count is
        # not found here)
        return (f"its count of handled units {state.slot_done} is more than the TimerLog "
                f"holds below its end {state.last_timer_log_flush_pos}")
    if state.deliver_mark > commitlog_end:
        return (f"its delivery mark {state.deliver_mark} is past the CommitLog's end "
                f"{commitlog_end}")
    return None


def save(path: str, checkpoint: TimerCheckpoint, *, sync: bool = True) -> None:
    """Replace the file atomically (temp file, fsync, rename)."""
    atomic_write(path, checkpoint.pack(), sync=sync)
