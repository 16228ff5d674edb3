"""``config/index.seal``: which message-key index files a writing process checked and found
sound, byte for byte, so that another process need not check them again.

A process checks an index file the first time it uses it
(:meth:`~store.files.index_file.IndexFile.check_chains`: one compiled pass over every slot
and entry, about 0.6 s of CPU for a full file of RocketMQ's default sizing).  A file that
was sound when it was checked can since have changed only by a builder's put (which moves
its header), a recovery's cut, or damage on disk; so a writing process, holding the
builders' lock (no put under way), records each file it found sound with a CRC32 of every
byte a lookup can read (:func:`file_crc`: the header, the slots and the entries up to the
newest one a slot or the header names) and the number of those bytes.  Another process's
first use computes the same CRC (hardware CRC32, about 0.1 s per GB; a full default file is
420 MB) and takes the file as sound only when size, length and CRC all match; any byte
changed, a file cut short or grown, a record missing or a seal file damaged, and the full
check runs as before (a bad seal costs a check, never a skipped one).

Written by: a builder when a file fills (it never changes by puts again), a writable open
after its check of every file, and a clean close (the newest file too); always atomically
(temp file, fsync, rename) under the builders' lock.  Records of files no longer in
``index/`` are dropped at the next write.  Kept in ``config/``, not ``index/``: RocketMQ's
broker takes every file of ``index/`` for an index file.

Layout (big-endian)::

    header, at 0 (16 bytes)
    off  size  type  field
    0    8     i64   magic     :data:`MAGIC`
    8    4     i32   count     records that follow
    12   4     i32   crc       CRC32 of the records' bytes (as a signed int)

    record i, at 16 + 32 i (32 bytes)
    0    8     i64   name      the index file's name (17 digits) as a number
    8    8     i64   size      the file's size in bytes
    16   8     i64   covered   bytes from the file's start the CRC covers
    24   8     i64   crc       CRC32 of those bytes

A file shorter than its header and records, of another magic or whose records' CRC fails is
no seal at all.
"""

from __future__ import annotations

import os

import numpy as np

from ..base.crc import crc32
from ..formats.binary_layout import layout
from .fileio import atomic_write
from .index_file import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexFile

SEAL_HEADER_FIELDS = (
    ("magic", ">i8"),  # MAGIC
    ("count", ">i4"),  # records that follow
    ("crc", ">i4"),  # CRC32 of the records' bytes, signed
)
SEAL_RECORD_FIELDS = (
    ("name", ">i8"),  # the index file's name as a number
    ("size", ">i8"),  # its size in bytes
    ("covered", ">i8"),  # bytes from its start the CRC covers
    ("crc", ">i8"),  # CRC32 of those bytes
)
SEAL_HEADER, SEAL_HEADER_SIZE, _SEAL_HEADER_DTYPE = layout(SEAL_HEADER_FIELDS).exports()
SEAL_RECORD, SEAL_RECORD_SIZE, _SEAL_RECORD_DTYPE = layout(SEAL_RECORD_FIELDS).exports()
#: The seal's first field ("rmqidxs1" as a number).
MAGIC = int.from_bytes(b"rmqidxs1", "big")
#: Where the seal is kept, from the store directory.
SEAL_PATH = os.path.join("config", "index.seal")

#: ``name -> (size, covered, crc)``
Records = dict[str, tuple[int, int, int]]


def covered_bytes(f: IndexFile) -> int:
    """Bytes from the start of ``f`` that a lookup can read: the header, the slots and the
    entries up to the newest one the header or a slot head names."""
    heads = f._slots()
    top = int(heads.max(initial=0)) if len(heads) else 0
    last = min(max(f.index_count - 1, top), f.entry_count - 1)
    return HEADER_SIZE + SLOT_SIZE * f.slot_count + ENTRY_SIZE * (last + 1)


def file_crc(f: IndexFile) -> tuple[int, int]:
    """``(covered, crc)``: :func:`covered_bytes` of ``f`` and the CRC32 of those bytes."""
    covered = covered_bytes(f)
    f._read_ahead(0, covered)
    view = memoryview(f._mm)
    try:
        return covered, crc32(view[:covered])
    finally:
        view.release()


def read_seal(root: str) -> Records:
    """The records of the store's seal (empty: none, or a damaged one)."""
    try:
        with open(os.path.join(root, SEAL_PATH), "rb") as fh:
            data = fh.read()
    except OSError:
        return {}
    if len(data) < SEAL_HEADER_SIZE:
        return {}
    magic, count, crc = SEAL_HEADER.unpack_from(data, 0)
    body = data[SEAL_HEADER_SIZE:]
    if (magic != MAGIC or count < 0 or len(body) != count * SEAL_RECORD_SIZE
            or np.int32(np.uint32(crc32(body))) != crc):
        return {}
    records: Records = {}
    for i in range(count):
        name, size, covered, file_crc_ = SEAL_RECORD.unpack_from(body, i * SEAL_RECORD_SIZE)
        records[f"{name:017d}"] = (size, covered, file_crc_)
    return records


def write_seal(root: str, records: Records) -> None:
    """Replace the store's seal with ``records`` (atomically)."""
    body = b"".join(SEAL_RECORD.pack(int(name), *record)
                    for name, record in sorted(records.items()))
    head = SEAL_HEADER.pack(MAGIC, len(records), int(np.int32(np.uint32(crc32(body)))))
    os.makedirs(os.path.join(root, "config"), exist_ok=True)
    atomic_write(os.path.join(root, SEAL_PATH), head + body)


def seal_holds(f: IndexFile, record: tuple[int, int, int] | None) -> bool:
    """Whether ``record`` (a seal's, for ``f``'s name) matches ``f`` as it is now, byte for
    byte over what a lookup can read."""
    if record is None or f._mm is None or f.actual_size != f.size or record[0] != f.size:
        return False
    return file_crc(f) == record[1:]
