"""The ``checkpoint`` file: a 4096-byte shared mapping of store-wide positions.

Layout (big-endian i64 fields).  Bytes 0..39 are RocketMQ's ``StoreCheckpoint`` (4.x sets
0..23, 5.x also 24..39); bytes 40.. are rmq's own, where no RocketMQ version writes::

    off  size  field                  RocketMQ name
    0    8     physic_msg_timestamp   physicMsgTimestamp: store time of the last flushed record
    8    8     logics_msg_timestamp   logicsMsgTimestamp: same for the ConsumeQueues
    16   8     index_msg_timestamp    indexMsgTimestamp (no key index here: 0)
    24   8     flushed_phy_offset     masterFlushedOffset: CommitLog and queues durable up to here
    32   8     confirm_phy_offset     confirmPhyOffset: end of the last record written and
                                      dispatched; readers never look past it
    40   8     write_in_progress      rmq: CommitLog offset a writer started at, -1 when idle;
                                      a value left behind means that writer died mid-append
    48   8     write_generation       rmq: +1 per append; lets other processes see new data
    56   8     last_append_offset     rmq: where the last append began; a clean open re-checks
                                      the records from there on
    64   8     layout_version         rmq: :data:`LAYOUT_MAGIC`: rmq wrote the fields above
    72   8     index_phy_offset       rmq: the message-key index holds every record below
                                      this CommitLog offset (a record boundary; 0 in a store
                                      of an earlier layout: the index is walked from the
                                      start, records already in it are skipped)
    80   8     index_commit_pending   rmq: CommitLog offset of a commit marker published but
                                      whose ConsumeQueue entries may not all be written
                                      (:mod:`store.core.index_commit`); 0 when none (a
                                      marker never lies at 0: its records precede it)

Every process maps the file shared, so a field written by one is seen by all at once; each
field is an aligned 8-byte store.

**Trust.** rmq's own fields (40..63 and 72..87) mean something only when rmq wrote them: the file then
carries :data:`LAYOUT_MAGIC` at byte 64.  A checkpoint without it is either an rmq store of an
earlier layout (a full 4096-byte file in a directory with ``config/store.json`` whose fields
read like rmq's: a positive ``write_generation`` and ordered offsets; they are trusted and the
magic is added, an upgrade a crash cannot tear, since it is one aligned store)
or a file rmq did not write: Apache RocketMQ's own checkpoint (zeros after byte 23 or 39), a
short, empty or damaged file.  Then :attr:`StoreCheckpoint.trusted` is False: nothing in it
may limit recovery (its zeros would say "an append in progress at offset 0"), so the store
recovers by validating every CommitLog record, keeps every record that passes the checks, and
writes a trusted checkpoint afterwards.  A read-only open never creates, extends or writes the
file.
"""

from __future__ import annotations

import mmap
import os
import struct

from .fileio import allocate

CHECKPOINT_FIELDS = (
    "physic_msg_timestamp",
    "logics_msg_timestamp",
    "index_msg_timestamp",
    "flushed_phy_offset",
    "confirm_phy_offset",
    "write_in_progress",
    "write_generation",
    "last_append_offset",
    "layout_version",
    "index_phy_offset",
    "index_commit_pending",
)
CHECKPOINT_LAYOUT = struct.Struct(">" + "q" * len(CHECKPOINT_FIELDS))
CHECKPOINT_FIELD = struct.Struct(">q")
#: ``write_in_progress`` and ``write_generation``, adjacent: what a writer checks on locking.
WRITER_STATE = struct.Struct(">qq")
CHECKPOINT_FILE_SIZE = 4096
#: ``layout_version`` of a checkpoint rmq wrote ("RMQCKPT" and layout 1).
LAYOUT_MAGIC = int.from_bytes(b"RMQCKPT\x01", "big")
_OFFSET = {name: i * CHECKPOINT_FIELD.size for i, name in enumerate(CHECKPOINT_FIELDS)}
# the offsets every append writes, as constants (a dict lookup each cost a send 25 ns)
_PHYSIC_MSG_TIMESTAMP = _OFFSET["physic_msg_timestamp"]
_CONFIRM_PHY_OFFSET = _OFFSET["confirm_phy_offset"]
_WRITE_IN_PROGRESS = _OFFSET["write_in_progress"]
_WRITE_GENERATION = _OFFSET["write_generation"]
_LAST_APPEND_OFFSET = _OFFSET["last_append_offset"]
_pack_field = CHECKPOINT_FIELD.pack_into
_unpack_field = CHECKPOINT_FIELD.unpack_from
#: rmq's own fields and what they mean when the file cannot be trusted.
_UNTRUSTED_DEFAULTS = {"write_in_progress": -1, "write_generation": 0, "last_append_offset": -1,
                       "layout_version": 0, "index_phy_offset": 0, "index_commit_pending": 0}


class StoreCheckpoint:
    """Typed access to the shared checkpoint mapping (see the module docstring).

    Parameters
    ----------
    path : str
        The ``checkpoint`` file.
    writable : bool
        Open for writing (creating or extending the file as needed); a read-only checkpoint
        never touches the file and reads a missing or short one as untrusted zeros.
    legacy_layout : bool
        The directory is an rmq store of an earlier layout (it has ``config/store.json``), so a
        full-size checkpoint without the magic was written by rmq and is trusted.
    """

    def __init__(self, path: str, *, writable: bool = True, legacy_layout: bool = False) -> None:
        self.path = path
        self.writable = writable
        self._map: mmap.mmap | bytes
        if writable:
            self._open_writable(legacy_layout)
        else:
            self._open_read_only(legacy_layout)

    def _open_writable(self, legacy_layout: bool) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
            allocate(fd, CHECKPOINT_FILE_SIZE, self.path)  # written through mmap
            self._map = mmap.mmap(fd, CHECKPOINT_FILE_SIZE, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self._live = True
        magic = self._raw("layout_version") == LAYOUT_MAGIC
        self.created = size == 0
        self.trusted = magic or (legacy_layout and size >= CHECKPOINT_FILE_SIZE
                                 and self._plausible_legacy())
        if self.created:
            self.set("write_in_progress", -1)
            self.set("last_append_offset", -1)
        if self.trusted and not magic:
            self.set("layout_version", LAYOUT_MAGIC)  # upgrade of an earlier rmq layout

    def _open_read_only(self, legacy_layout: bool) -> None:
        self.created = False
        self._live = False
        self._map_if_full()
        if not self._live:
            self._reload()
        self.trusted = self._raw("layout_version") == LAYOUT_MAGIC or (
            legacy_layout and self._live and self._plausible_legacy())

    def _map_if_full(self) -> None:
        """Map the file read-only and shared once it has its full size (every process's
        writes then show at once)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            if os.fstat(fd).st_size >= CHECKPOINT_FILE_SIZE:
                self._map = mmap.mmap(fd, CHECKPOINT_FILE_SIZE, access=mmap.ACCESS_READ)
                self._live = True
        finally:
            os.close(fd)

    def trusted_now(self) -> bool:
        """:attr:`trusted`, looked at again while it is not: a read-only process that opened
        the store before its creator (or a recovering writer) made the checkpoint rmq's
        follows the checkpoint from then on, rather than validating the records itself for
        as long as it stays open (a walk that races the writers' appends)."""
        if not self.trusted and not self.writable:
            if not self._live:
                self._map_if_full()
            self.get("layout_version")  # (sets trusted once the file carries the magic)
        return self.trusted

    def _plausible_legacy(self) -> bool:
        """Whether the fields read like an earlier rmq layout's (not zeros or garbage).

        rmq bumps ``write_generation`` with every append and keeps the offsets ordered, so a
        zeroed or damaged file fails here and is recovered without trust.
        """
        confirm = self._raw("confirm_phy_offset")
        in_progress = self._raw("write_in_progress")
        last = self._raw("last_append_offset")
        return (self._raw("write_generation") > 0 and confirm >= 0
                and 0 <= self._raw("flushed_phy_offset") <= confirm
                and (in_progress == -1 or 0 <= in_progress <= confirm)
                and -1 <= last <= confirm)

    def _raw(self, name: str) -> int:
        return CHECKPOINT_FIELD.unpack_from(self._map, _OFFSET[name])[0]

    def get(self, name: str) -> int:
        if not self.writable and not self._live:
            self._reload()  # a short or missing file: read it as it is now
        if not self.trusted:
            if self._raw("layout_version") != LAYOUT_MAGIC:
                return _UNTRUSTED_DEFAULTS.get(name, self._raw(name))
            self.trusted = True  # a writer recovered the store and wrote a trusted file
        return self._raw(name)

    def _reload(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(CHECKPOINT_FILE_SIZE)
        except FileNotFoundError:
            data = b""
        self._map = data.ljust(CHECKPOINT_FILE_SIZE, b"\0")

    def set(self, name: str, value: int) -> None:
        if not self.writable:
            raise PermissionError(f"checkpoint {self.path} was opened read-only")
        CHECKPOINT_FIELD.pack_into(self._map, _OFFSET[name], value)

    def writer_state(self) -> tuple[int, int]:
        """``(write_in_progress, write_generation)`` in one read (what a writer checks when
        it takes the append lock)."""
        if self.trusted and self._live:
            return WRITER_STATE.unpack_from(self._map, _WRITE_IN_PROGRESS)
        return self.get("write_in_progress"), self.get("write_generation")

    def begin_append(self, offset: int) -> None:
        """Mark an append that starts at ``offset`` (``write_in_progress`` and
        ``last_append_offset``)."""
        if not self.writable:
            raise PermissionError(f"checkpoint {self.path} was opened read-only")
        m = self._map
        _pack_field(m, _WRITE_IN_PROGRESS, offset)
        _pack_field(m, _LAST_APPEND_OFFSET, offset)

    def publish_append(self, store_timestamp_ms: int, confirm: int) -> int:
        """Confirm an append up to ``confirm``: the store time of its last record, the
        confirmed end, the next ``write_generation`` (returned), then no append in progress,
        in that order."""
        if not self.writable:
            raise PermissionError(f"checkpoint {self.path} was opened read-only")
        m = self._map
        _pack_field(m, _PHYSIC_MSG_TIMESTAMP, store_timestamp_ms)
        _pack_field(m, _CONFIRM_PHY_OFFSET, confirm)
        generation = (_unpack_field(m, _WRITE_GENERATION)[0]
                      if self.trusted else self.get("write_generation")) + 1
        _pack_field(m, _WRITE_GENERATION, generation)
        _pack_field(m, _WRITE_IN_PROGRESS, -1)
        return generation

    def mark_trusted(self) -> None:
        """Record that rmq's fields now hold rmq's values (after a validating recovery)."""
        self.set("layout_version", LAYOUT_MAGIC)
        self.trusted = True

    def flush(self) -> None:
        if self.writable:
            self._map.flush()

    def close(self) -> None:
        if not self.writable and not self._live:
            return
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass
