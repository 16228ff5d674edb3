"""The store's settings: one dataclass with RocketMQ's defaults, units in the names.

Settings that shape the files on disk (:data:`LAYOUT_FIELDS`) are recorded in
``config/store.json`` when a store is created; reopening with other values uses the recorded
ones (a warning-free, documented choice) unless ``strict_layout=True`` asks for an error.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from .errors import InvalidConfigError

GIB = 1024 * 1024 * 1024
MIB = 1024 * 1024

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

#: Settings that decide how bytes on disk are read; recorded at creation.
LAYOUT_FIELDS = (
    "commitlog_file_size_bytes",
    "consume_queue_file_entries",
    "default_queue_count",
    "message_delay_level",
    "timer_precision_ms",
    "timer_wheel_slots",
    "timer_log_file_size_bytes",
    "max_hash_slot_num",
    "max_index_num",
)

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL_RE = re.compile(r"^(\d+)([smhd])$")


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """Parse RocketMQ's ``messageDelayLevel`` string into delays in milliseconds.

    >>> parse_delay_levels("1s 5m 2h")
    (1000, 300000, 7200000)
    """
    parts = text.split()
    if not parts:
        raise InvalidConfigError(
            f"message_delay_level={text!r} is empty; give space-separated delays such as '1s 5m 2h'"
        )
    out = []
    for part in parts:
        m = _LEVEL_RE.match(part)
        if not m or int(m.group(1)) <= 0:
            raise InvalidConfigError(
                f"message_delay_level={text!r}: {part!r} is not a positive number followed by "
                "one of the units s, m, h, d"
            )
        out.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    return tuple(out)


@dataclass(frozen=True)
class StoreConfig:
    """Settings of a :class:`~store.MessageStore` (RocketMQ's names in snake_case).

    Parameters
    ----------
    commitlog_file_size_bytes : int
        Size of one CommitLog segment file (``mappedFileSizeCommitLog``), 1 GiB.
    consume_queue_file_entries : int
        20-byte entries per ConsumeQueue file, 300,000 (6,000,000 bytes).
    flush_disk_type : str
        ``"ASYNC_FLUSH"`` (flushed every ``flush_interval_commitlog_ms``) or ``"SYNC_FLUSH"``
        (a send returns only after the record is on disk).
    flush_interval_commitlog_ms : int
        Period of the asynchronous flush, 500 ms.
    default_queue_count : int
        Queues of an auto-created topic, 4.
    max_message_size_bytes : int
        Largest body (``maxMessageSize``), 4 MiB; also the largest batch.
    file_reserved_time_hours : int
        CommitLog segments older than this are deleted by
        :meth:`~store.MessageStore.clean_expired_files`, 72.
    delete_when : str
        Hours (local time, ``;``-separated, RocketMQ's ``deleteWhen``) in which a running
        :class:`~store.operations.server.StoreServer` deletes expired segments, ``"04"``.
    disk_max_used_space_ratio : int
        Disk use (percent) above which the server deletes expired segments at any hour, 75.
    disk_space_clean_forcibly_ratio : int
        Disk use (percent) above which the server deletes segments whatever their age
        (never one a pending delayed or open half message needs), 85.
    clean_resource_interval_ms : int
        How often the server looks at retention, 10000 ms.
    message_delay_level : str
        The 4.x delay-level table.
    timer_precision_ms : int
        Timer wheel slot width: 100, 200, 500 or 1000 (other values are refused).
    timer_wheel_slots : int
        Slots in the ``timerwheel`` file (RocketMQ: 2 × 604800).
    timer_roll_window_slots : int
        Delays reaching this many slots ahead are rolled (re-enqueued) instead of placed.
    timer_max_delay_ms : int
        Longest accepted delay, 400 days (RocketMQ: 3 days).
    timer_log_file_size_bytes : int
        Size of one ``timerlog`` segment, 100 MiB.
    timer_congest_num_each_slot : int
        Per-slot flow-control limit; 2**31 - 1 turns it off, as in RocketMQ.
    transaction_timeout_ms : int
        Immunity of a half message before the first check, 6000 ms.
    transaction_check_max : int
        Checks before a half message is discarded, 15.
    transaction_check_interval_ms : int
        Period of the check loop when run by a service, 30000 ms.
    schedule_min_interval_ms : int
        The shortest ``every_ms`` a recurring schedule may have, 1000 ms (not a RocketMQ
        setting: its schedules are rmq's own); a shorter one is refused with
        :class:`~store.base.errors.ScheduleIntervalError`.  Checked when a schedule is added, so
        schedules a store already holds keep firing.
    append_lock_lease_ms : int
        How long a process that sends single messages in a loop may keep the store's append
        lock between them, 1 ms (not a RocketMQ setting: its broker is the one writer); a process
        that finds the lock taken waits at most about this long.  0 gives the lock back
        after every append.
    message_index_enable : bool
        Keep RocketMQ's message-key index (``index/``, ``messageIndexEnable``): every
        record's ``UNIQ_KEY`` and ``KEYS``, for :meth:`~store.MessageStore.query_messages`
        by key and :meth:`~store.MessageStore.view_message` by unique key.  False by default
        (RocketMQ's is True): the index is built on the send path today and costs single
        sends and ``send_table`` 1.4-1.9x (``bench/bench_index.py``); turned on later, the
        next writable open builds it from the CommitLog.
    max_hash_slot_num : int
        Hash slots of one index file (``maxHashSlotNum``), 5,000,000.
    max_index_num : int
        Entries of one index file (``maxIndexNum``), 20,000,000; a file is
        ``40 + 4 x slots + 20 x entries`` bytes (420,000,040 by default), preallocated sparse.
        Both are recorded in ``config/store.json`` when a store is created (readers size the
        files by them); a file of another size is not this store's index: a writable open
        sets it aside and rebuilds the index from the CommitLog.
    """

    commitlog_file_size_bytes: int = GIB
    consume_queue_file_entries: int = 300_000
    flush_disk_type: str = "ASYNC_FLUSH"
    flush_interval_commitlog_ms: int = 500
    default_queue_count: int = 4
    max_message_size_bytes: int = 4 * MIB
    max_properties_size_bytes: int = 32767
    file_reserved_time_hours: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    disk_space_clean_forcibly_ratio: int = 85
    clean_resource_interval_ms: int = 10_000
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    timer_precision_ms: int = 1000
    timer_wheel_slots: int = 2 * 604_800
    timer_roll_window_slots: int = 172_800
    timer_max_delay_ms: int = 400 * 86_400_000
    timer_log_file_size_bytes: int = 100 * MIB
    timer_congest_num_each_slot: int = 2**31 - 1
    transaction_timeout_ms: int = 6000
    transaction_check_max: int = 15
    transaction_check_interval_ms: int = 30_000
    schedule_min_interval_ms: int = 1000
    append_lock_lease_ms: int = 1
    strict_layout: bool = False
    message_index_enable: bool = False
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000

    def __post_init__(self) -> None:
        ints = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.type == "int"}
        for name, value in ints.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidConfigError(f"{name}={value!r} must be an int")
        _positive = (
            "commitlog_file_size_bytes", "consume_queue_file_entries",
            "flush_interval_commitlog_ms", "default_queue_count", "max_message_size_bytes",
            "max_properties_size_bytes", "file_reserved_time_hours", "timer_wheel_slots",
            "timer_roll_window_slots", "timer_max_delay_ms", "timer_log_file_size_bytes",
            "timer_congest_num_each_slot", "transaction_timeout_ms", "transaction_check_max",
            "transaction_check_interval_ms", "clean_resource_interval_ms",
            "schedule_min_interval_ms", "max_hash_slot_num",
        )
        for name in _positive:
            if ints[name] <= 0:
                raise InvalidConfigError(f"{name}={ints[name]} must be > 0")
        if self.commitlog_file_size_bytes < 4096:
            raise InvalidConfigError(
                f"commitlog_file_size_bytes={self.commitlog_file_size_bytes} is too small; "
                "allowed: >= 4096"
            )
        if self.commitlog_file_size_bytes > 2 * GIB - 1:
            raise InvalidConfigError(
                f"commitlog_file_size_bytes={self.commitlog_file_size_bytes} is too large; "
                "allowed: < 2 GiB"
            )
        if self.default_queue_count > 1024:
            raise InvalidConfigError(
                f"default_queue_count={self.default_queue_count}; allowed: 1 to 1024"
            )
        if self.flush_disk_type not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise InvalidConfigError(
                f"flush_disk_type={self.flush_disk_type!r}; allowed: 'ASYNC_FLUSH', 'SYNC_FLUSH'"
            )
        if self.timer_precision_ms not in (100, 200, 500, 1000):
            raise InvalidConfigError(
                f"timer_precision_ms={self.timer_precision_ms}; allowed: 100, 200, 500, 1000"
            )
        if not 2 <= self.timer_roll_window_slots < self.timer_wheel_slots:
            raise InvalidConfigError(
                f"timer_roll_window_slots={self.timer_roll_window_slots}; allowed: 2 to "
                f"timer_wheel_slots - 1 ({self.timer_wheel_slots - 1})"
            )
        if self.timer_log_file_size_bytes < 1024:
            raise InvalidConfigError(
                f"timer_log_file_size_bytes={self.timer_log_file_size_bytes}; allowed: >= 1024"
            )
        parse_delay_levels(self.message_delay_level)
        if not 2 <= self.max_index_num <= 2**31 - 1:
            raise InvalidConfigError(
                f"max_index_num={self.max_index_num}; allowed: 2 to 2**31 - 1 (entry 0 is "
                "never used)")
        if not 0 <= self.append_lock_lease_ms <= 1000:
            raise InvalidConfigError(
                f"append_lock_lease_ms={self.append_lock_lease_ms}; allowed: 0 (no lease) to "
                "1000")
        for name in ("disk_max_used_space_ratio", "disk_space_clean_forcibly_ratio"):
            if not 1 <= ints[name] <= 100:
                raise InvalidConfigError(f"{name}={ints[name]}; allowed: 1 to 100 (percent)")
        hours = self.delete_when.split(";") if isinstance(self.delete_when, str) else None
        if not hours or not all(h.strip().isdigit() and 0 <= int(h) <= 23 for h in hours):
            raise InvalidConfigError(
                f"delete_when={self.delete_when!r}; allowed: hours 0-23 separated by ';', "
                "e.g. '04' or '02;14'")

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """The delay of each level in ms (level L is ``delay_levels_ms[L - 1]``)."""
        return parse_delay_levels(self.message_delay_level)

    @property
    def file_reserved_time_ms(self) -> int:
        return self.file_reserved_time_hours * 3_600_000

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "StoreConfig":
        """Build a config from a mapping, refusing unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InvalidConfigError(
                f"unknown StoreConfig field(s) {unknown}; allowed: {sorted(known)}"
            )
        return cls(**values)

    def layout(self) -> dict[str, Any]:
        """The settings recorded on disk when a store is created."""
        return {name: getattr(self, name) for name in LAYOUT_FIELDS}

    def replace(self, **changes: Any) -> "StoreConfig":
        return dataclasses.replace(self, **changes)


