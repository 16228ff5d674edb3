"""``config/index.seal``: which message-key index files a writing process checked and found
sound, byte for byte, so that another process need not check them again.

A process checks an index file the first time it uses it
(:meth:`~store.files.index_file.IndexFile.check_chains`: one compiled pass over every slot
and entry, about 0.6 s of CPU for a full file of RocketMQ's default sizing).  A file that
was sound when it was checked can since have changed only by a builder's put (which moves
its header), a recovery's cut, or damage on disk; so a writing process, holding the
builders' lock (no put under way), records each file it found sound with the CRC32 of each
:data:`BLOCK_BYTES` block of what a lookup can read (:func:`file_seal`: the header, the
slots and the entries up to the newest one a slot or the header names).

What the seal proves.  A lookup (:meth:`~store.files.index_file.IndexFile.lookup`) reads
the header, one slot and the entries of one chain, and its answer depends on those bytes
only: when every block it read is the block a writer found in a sound file, its answer is
that sound file's answer, whatever the rest of the file holds.  So a reader that opens a
sealed file checks the header's block (:func:`blocks_hold`) and, at each lookup, the blocks
that lookup read (some tens of KiB: microseconds), rather than the whole file; a writer,
which puts into the file and seals it again, checks every block (:func:`seal_holds`).  Any
block changed, a file cut short or grown, a record missing or a seal file damaged, and the
full check runs as before (a bad seal costs a check, never a skipped one).

Written by: a builder when a file fills (it never changes by puts again), a writable open
after its check of every file, and a clean close (the newest file too); always atomically
(temp file, fsync, rename) under the builders' lock.  A file is sealed only as the sealing
process checked it: if its bytes changed since that process's check or its first use by the
seal, it is checked again first.  Records of files no longer in ``index/`` are dropped at the
next write.  Kept in ``config/``, not ``index/``: RocketMQ's broker takes every file of
``index/`` for an index file.

Layout (big-endian)::

    header, at 0 (20 bytes)
    off  size  type  field
    0    8     i64   magic        :data:`MAGIC`
    8    4     i32   count        records that follow
    12   4     i32   block_bytes  bytes a block CRC covers (:data:`BLOCK_BYTES` when written)
    16   4     i32   crc          CRC32 of the records' bytes (as a signed int)

    record, one after another (28 + 4 blocks bytes)
    0    8     i64   name         the index file's name (17 digits) as a number
    8    8     i64   size         the file's size in bytes
    16   8     i64   covered      bytes from the file's start the CRCs cover
    24   4     i32   blocks       ceil(covered / block_bytes)
    28   4 b   u32   crcs         CRC32 of each block (the last one: up to ``covered``)

A file shorter than its header, of another magic, whose records do not fill
it exactly or whose records' CRC fails is no seal at all.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ..base.crc import crc32
from ..formats.binary_layout import layout
from .fileio import atomic_write
from .index_file import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexFile

SEAL_HEADER_FIELDS = (
    ("magic", ">i8"),  # MAGIC
    ("count", ">i4"),  # records that follow
    ("block_bytes", ">i4"),  # bytes a block CRC covers
    ("crc", ">i4"),  # CRC32 of the records' bytes, signed
)
SEAL_RECORD_FIELDS = (
    ("name", ">i8"),  # the index file's name as a number
    ("size", ">i8"),  # its size in bytes
    ("covered", ">i8"),  # bytes from its start the CRCs cover
    ("blocks", ">i4"),  # block CRCs that follow
)
SEAL_HEADER, SEAL_HEADER_SIZE, _SEAL_HEADER_DTYPE = layout(SEAL_HEADER_FIELDS).exports()
SEAL_RECORD, SEAL_RECORD_SIZE, _SEAL_RECORD_DTYPE = layout(SEAL_RECORD_FIELDS).exports()
#: one block CRC (unsigned, big-endian)
BLOCK_CRC_DTYPE = np.dtype(">u4")
#: The seal's first field ("rmqidxs2" as a number; "rmqidxs1", one CRC per file, is no
#: seal to this code: its files are checked once and sealed again).
MAGIC = int.from_bytes(b"rmqidxs2", "big")
#: Bytes each CRC covers: a lookup's dozen blocks are some hundreds of KiB to check, a full
#: default file's record 26 KB.
BLOCK_BYTES = 1 << 16
#: Where the seal is kept, from the store directory.
SEAL_PATH = os.path.join("config", "index.seal")


class FileSeal(NamedTuple):
    """One file's record: its size, the bytes covered, the bytes of a block (the seal's) and
    the CRC32 of each block."""

    size: int
    covered: int
    block_bytes: int
    crcs: np.ndarray  # uint32, one per block


#: ``name -> FileSeal``
Records = dict[str, FileSeal]


def covered_bytes(f: IndexFile) -> int:
    """Bytes from the start of ``f`` that a lookup can read: the header, the slots and the
    entries up to the newest one the header or a slot head names."""
    heads = f._slots()
    top = int(heads.max(initial=0)) if len(heads) else 0
    last = min(max(f.index_count - 1, top), f.entry_count - 1)
    return HEADER_SIZE + SLOT_SIZE * f.slot_count + ENTRY_SIZE * (last + 1)


def _block_crcs(f: IndexFile, first: int, last: int, covered: int, block: int) -> np.ndarray:
    """CRC32 of the ``block``-byte blocks ``first`` to ``last`` (inclusive) of ``f``, the
    last cut at ``covered``."""
    begin, end = first * block, min(covered, (last + 1) * block)
    f._read_ahead(begin, end - begin)
    view = memoryview(f._mm)
    try:
        return np.fromiter((crc32(view[b:min(b + block, end)]) for b in range(begin, end, block)),
                           dtype=np.uint32, count=last - first + 1)
    finally:
        view.release()


def file_seal(f: IndexFile) -> FileSeal:
    """The record of ``f`` as it is now: :func:`covered_bytes` and each block's CRC32
    (blocks of :data:`BLOCK_BYTES`)."""
    covered, block = covered_bytes(f), BLOCK_BYTES
    return FileSeal(f.size, covered, block,
                    _block_crcs(f, 0, -(-covered // block) - 1, covered, block))


def seal_holds(f: IndexFile, record: FileSeal | None) -> bool:
    """Whether ``record`` (a seal's, for ``f``'s name) matches ``f`` as it is now, byte for
    byte over everything a lookup can read (every block: a writer's check)."""
    if not _same_file(f, record):
        return False
    last = len(record.crcs) - 1
    return (covered_bytes(f) == record.covered and np.array_equal(
        _block_crcs(f, 0, last, record.covered, record.block_bytes), record.crcs))


def blocks_hold(f: IndexFile, record: FileSeal | None, positions: list[tuple[int, int]]
                ) -> bool:
    """Whether the blocks of ``f`` holding the byte ranges ``positions`` (``(offset,
    length)`` each) are those ``record`` sealed (a reader's check of what it reads): each
    range inside what the record covers, each block's CRC the recorded one."""
    if not _same_file(f, record):
        return False
    block = record.block_bytes
    blocks = set()
    for offset, length in positions:
        if offset < 0 or offset + length > record.covered:
            return False
        blocks.update(range(offset // block, (offset + length - 1) // block + 1))
    return all(_block_crcs(f, b, b, record.covered, block)[0] == record.crcs[b]
               for b in sorted(blocks))


def _same_file(f: IndexFile, record: FileSeal | None) -> bool:
    return (record is not None and f._mm is not None and f.actual_size == f.size == record.size
            and record.block_bytes > 0
            and len(record.crcs) == -(-record.covered // record.block_bytes))


def read_seal(root: str) -> Records:
    """The records of the store's seal (empty: none, or a damaged one)."""
    try:
        with open(os.path.join(root, SEAL_PATH), "rb") as fh:
            data = fh.read()
    except OSError:
        return {}
    if len(data) < SEAL_HEADER_SIZE:
        return {}
    magic, count, block_bytes, crc = SEAL_HEADER.unpack_from(data, 0)
    body = memoryview(data)[SEAL_HEADER_SIZE:]
    if (magic != MAGIC or block_bytes <= 0 or count < 0
            or np.int32(np.uint32(crc32(body))) != crc):
        return {}
    records: Records = {}
    at = 0
    for _ in range(count):
        if at + SEAL_RECORD_SIZE > len(body):
            return {}
        name, size, covered, blocks = SEAL_RECORD.unpack_from(body, at)
        at += SEAL_RECORD_SIZE
        if blocks < 0 or at + 4 * blocks > len(body):
            return {}
        crcs = np.frombuffer(body, dtype=BLOCK_CRC_DTYPE, count=blocks, offset=at)
        records[f"{name:017d}"] = FileSeal(size, covered, block_bytes, crcs.astype(np.uint32))
        at += 4 * blocks
    return records if at == len(body) else {}


def write_seal(root: str, records: Records) -> None:
    """Replace the store's seal with ``records`` (atomically; those of another block size
    than :data:`BLOCK_BYTES` are left out: the next writer seals their files again)."""
    block = BLOCK_BYTES
    body = b"".join(SEAL_RECORD.pack(int(name), r.size, r.covered, len(r.crcs))
                    + np.asarray(r.crcs, dtype=BLOCK_CRC_DTYPE).tobytes()
                    for name, r in sorted(records.items()) if r.block_bytes == block)
    count = sum(r.block_bytes == block for r in records.values())
    head = SEAL_HEADER.pack(MAGIC, count, block,
                            int(np.int32(np.uint32(crc32(body)))))
    os.makedirs(os.path.join(root, "config"), exist_ok=True)
    atomic_write(os.path.join(root, SEAL_PATH), head + body)
