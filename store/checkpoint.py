"""The ``checkpoint`` file: a 4096-byte shared mapping of store-wide positions.

Layout (big-endian i64 fields, RocketMQ's StoreCheckpoint plus three of ours)::

    off  size  field
    0    8     physic_msg_timestamp   store time of the last flushed CommitLog record
    8    8     logics_msg_timestamp   store time of the last flushed ConsumeQueue entry
    16   8     index_msg_timestamp    unused (no key index), 0
    24   8     flushed_phy_offset     CommitLog *and* ConsumeQueues durable up to here
    32   8     confirm_phy_offset     end of the last record written and dispatched;
                                      readers never look past it
    40   8     write_in_progress      CommitLog offset a writer started at, -1 when idle;
                                      a value left behind means that writer died mid-append
    48   8     write_generation       +1 per append; lets other processes see new data
    56   8     last_append_offset     where the last append began; a clean open re-checks
                                      the records from there on (RocketMQ's normal
                                      recovery, limited to what the last writer touched)

Every process maps the file shared, so a field written by one is seen by all at once; each
field is an aligned 8-byte store.  Recovery reads ``flushed_phy_offset`` and rescans the
CommitLog from there; a missing or short file is recreated with zeros (rescan from 0).
"""

from __future__ import annotations

import mmap
import os
import struct

CHECKPOINT_FIELDS = (
    "physic_msg_timestamp",
    "logics_msg_timestamp",
    "index_msg_timestamp",
    "flushed_phy_offset",
    "confirm_phy_offset",
    "write_in_progress",
    "write_generation",
    "last_append_offset",
)
CHECKPOINT_LAYOUT = struct.Struct(">" + "q" * len(CHECKPOINT_FIELDS))
CHECKPOINT_FIELD = struct.Struct(">q")
CHECKPOINT_FILE_SIZE = 4096
_OFFSET = {name: i * CHECKPOINT_FIELD.size for i, name in enumerate(CHECKPOINT_FIELDS)}


class StoreCheckpoint:
    """Typed access to the shared checkpoint mapping."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < CHECKPOINT_FILE_SIZE:
                fresh = os.fstat(fd).st_size == 0
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
                if fresh:
                    os.pwrite(fd, CHECKPOINT_FIELD.pack(-1), _OFFSET["write_in_progress"])
            self._map = mmap.mmap(fd, CHECKPOINT_FILE_SIZE, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)

    def get(self, name: str) -> int:
        return CHECKPOINT_FIELD.unpack_from(self._map, _OFFSET[name])[0]

    def set(self, name: str, value: int) -> None:
        CHECKPOINT_FIELD.pack_into(self._map, _OFFSET[name], value)

    def snapshot(self) -> dict[str, int]:
        return dict(zip(CHECKPOINT_FIELDS, CHECKPOINT_LAYOUT.unpack_from(self._map, 0)))

    def flush(self) -> None:
        self._map.flush()

    def close(self) -> None:
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass
