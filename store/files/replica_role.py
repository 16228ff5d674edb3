"""``config/replica.role``: a replica set member's role as its server shares it with the worker
processes of its gRPC endpoint (``rmq serve --grpc-processes N``, :mod:`store.proxy.processes`).

One small file, memory-mapped by the server (the **primary**, which alone writes it) and by
each worker (which only reads it).  Big-endian, 56 bytes, every field an 8-byte word at an
8-byte aligned offset:

======  ====  ======  ==================================================================
offset  size  type    field
======  ====  ======  ==================================================================
0       8     bytes   magic ``RMQROLE1``
8       8     uint64  generation: even while the fields below are whole, odd while the
                      primary writes them (a sequence lock)
16      8     int64   epoch: the replica's current term
24      8     int64   leading: 1 while the replica leads and takes writes, else 0
32      8     int64   lease_until_ms: ``CLOCK_MONOTONIC`` milliseconds (one clock for every
                      process of a Linux host) until which a worker may append and
                      acknowledge; the primary moves it forward every
                      :data:`RENEW_MS` while it leads
40      8     int64   acked_end: the CommitLog end ``min_insync_replicas`` replicas hold in
                      this term (-1: none known; unused with asynchronous replication)
48      8     uint64  check: CRC32 of bytes 8 to 47 (the generation and the four fields)
======  ====  ======  ==================================================================

**Reading whole fields.**  The primary writes under a lock of its own: the generation made
odd, the four fields and the check, the generation made even again.  A reader copies bytes
8 to 55 at once and keeps the fields only when the generation is even, the check is the
CRC32 of what it copied, and the generation read again after the copy is the same (else it
reads again): a sequence lock, so that no reader combines an epoch with another term's
acknowledged end.  The check makes a torn copy visible without any promise on the order in
which the primary's stores reach another process (Python places no memory barrier, and a
weakly ordered CPU such as ARM64 may show them out of order): a copy mixing two writes
passes only if its CRC32 matches by chance (2^-32), besides the generation's check.  A
writer that died in the middle (an odd generation that never moves) reads, after
:data:`MAX_READ_WAIT_S`, as a replica that does not lead.

**Recovery.**  None: the file is state of a running server, not data.  The primary
creates it (temp file, ``os.replace``) saying *not leading* before any worker starts, and
every worker ends with its primary (their standard input closes), so a file left by a
crash is never read by a worker of a later run.  A file shorter than the layout or
with another magic is refused (:class:`~store.base.errors.StoreError`).
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass

from ..base.errors import StoreError
from .fileio import atomic_write

ROLE_FILE = os.path.join("config", "replica.role")
MAGIC = b"RMQROLE1"

#: The whole file (see the module docstring's table).
LAYOUT = struct.Struct(
    ">8s"  # magic
    "Q"    # generation (sequence lock)
    "q"    # epoch
    "q"    # leading (1 or 0)
    "q"    # lease_until_ms (CLOCK_MONOTONIC)
    "q"    # acked_end (-1: none known)
    "Q"    # check: CRC32 of the generation and the four fields
)
#: The generation word alone, and where it sits.
GENERATION = struct.Struct(">Q")
GENERATION_OFFSET = struct.calcsize(">8s")
#: The four fields a reader takes whole, and where they start.
FIELDS = struct.Struct(">qqqq")
FIELDS_OFFSET = GENERATION_OFFSET + GENERATION.size
#: The check word, and where it sits (right after the fields).
CHECK = struct.Struct(">Q")
CHECK_OFFSET = FIELDS_OFFSET + FIELDS.size
#: What a reader copies at once: the generation, the fields and the check.
WHOLE = struct.Struct(">Qqqqq" "Q")
assert CHECK_OFFSET + CHECK.size == LAYOUT.size == GENERATION_OFFSET + WHOLE.size

#: How often the primary moves the lease forward while it leads (ms).
RENEW_MS = 100
#: How far ahead of now each renewal sets the lease (ms): a primary frozen or killed leaves
#: its workers acknowledging for this long at most.
LEASE_MS = 500
#: Reads of a generation caught odd before a reader sleeps between reads, and how long it
#: reads before it takes the replica for not leading (its writer died mid-write; s).
SPINS = 100
MAX_READ_WAIT_S = 0.1


def monotonic_ms() -> int:
    """``CLOCK_MONOTONIC`` in milliseconds (the clock of :attr:`ReplicaRole.lease_until_ms`)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000_000


@dataclass(frozen=True, slots=True)
class ReplicaRole:
    """One whole reading of the file (see the module docstring)."""

    epoch: int
    leading: bool
    lease_until_ms: int
    acked_end: int

    def takes_writes(self, now_ms: int) -> bool:
        """Whether a worker may append and acknowledge at ``now_ms``."""
        return self.leading and now_ms < self.lease_until_ms


#: What a file whose writer died in the middle of a write reads as.
NOT_LEADING = ReplicaRole(-1, False, 0, -1)


class RoleFile:
    """The mapped file of the store at ``root``: :meth:`create` (the primary) or
    :meth:`open` (a worker, read only)."""

    def __init__(self, path: str, fd: int, writable: bool) -> None:
        self.path = path
        try:
            size = os.fstat(fd).st_size
            if size < LAYOUT.size:
                raise StoreError(f"the replica role file {path} holds {size} bytes; allowed: "
                                 f"{LAYOUT.size} (it is written by the replica's server)")
            self._map = mmap.mmap(fd, LAYOUT.size, access=mmap.ACCESS_WRITE if writable
                                  else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        if self._map[:len(MAGIC)] != MAGIC:
            self._map.close()
            raise StoreError(f"the replica role file {path} does not start with {MAGIC!r}")
        self._lock = threading.Lock()
        self._generation = GENERATION.unpack_from(self._map, GENERATION_OFFSET)[0] & ~1

    @classmethod
    def create(cls, root: str) -> RoleFile:
        """Make the file of the store at ``root`` anew, saying *not leading*, and map it for
        writing."""
        path = os.path.join(root, ROLE_FILE)
        fields = GENERATION.pack(0) + FIELDS.pack(0, 0, 0, -1)
        atomic_write(path, MAGIC + fields + CHECK.pack(zlib.crc32(fields)), sync=False)
        return cls(path, os.open(path, os.O_RDWR), True)

    @classmethod
    def open(cls, root: str) -> RoleFile:
        """Map the file of the store at ``root`` for reading (its server made it)."""
        path = os.path.join(root, ROLE_FILE)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise StoreError(f"cannot open the replica role file {path}: {exc}; it is made "
                             "by the replica's server before its worker processes start") \
                from None
        return cls(path, fd, False)

    def write(self, epoch: int, leading: bool, lease_until_ms: int, acked_end: int) -> None:
        """Publish a whole new role (the primary; see the module docstring)."""
        with self._lock:
            odd = self._generation + 1
            fields = FIELDS.pack(epoch, 1 if leading else 0, lease_until_ms, acked_end)
            GENERATION.pack_into(self._map, GENERATION_OFFSET, odd)
            self._map[FIELDS_OFFSET:CHECK_OFFSET] = fields
            CHECK.pack_into(self._map, CHECK_OFFSET,
                            zlib.crc32(GENERATION.pack(odd + 1) + fields))
            GENERATION.pack_into(self._map, GENERATION_OFFSET, odd + 1)
            self._generation = odd + 1

    def read(self) -> ReplicaRole:
        """The role as last published, whole."""
        m = self._map
        give_up = None
        for attempt in itertools.count():
            copy = m[GENERATION_OFFSET:LAYOUT.size]
            generation, epoch, leading, lease, acked, check = WHOLE.unpack(copy)
            if (not generation & 1 and zlib.crc32(copy[:CHECK_OFFSET - GENERATION_OFFSET])
                    == check
                    and GENERATION.unpack_from(m, GENERATION_OFFSET)[0] == generation):
                return ReplicaRole(epoch, leading == 1, lease, acked)
            if attempt >= SPINS:  # (the writer was stopped mid-write: let it run)
                if give_up is None:
                    give_up = time.monotonic() + MAX_READ_WAIT_S
                elif time.monotonic() > give_up:
                    return NOT_LEADING
                time.sleep(0.0001)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self._map.close()


__all__ = ["GENERATION", "LAYOUT", "LEASE_MS", "NOT_LEADING", "RENEW_MS", "ROLE_FILE",
           "ReplicaRole", "RoleFile", "monotonic_ms"]
