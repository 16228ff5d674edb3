"""Byte-range work on segment files: zero-padded copies, in-place repair, zeroing a tail.

Helpers of :mod:`store.files.mapped_file` for damaged or cut segments.  A segment here is anything
with ``path``, ``size``, ``fd()``, ``buffer()`` and ``write(position, data)`` (a
:class:`~store.files.mapped_file.MappedFile`).  Zeroing always writes zeros, never ``ftruncate``:
another process may have the file mapped, and shrinking a mapped file makes its reads fault.
"""

from __future__ import annotations

import errno
import mmap
import os

from typing import Protocol

import numpy as np

from .fileio import allocate, fsync_dir, move_aside

_ZERO_CHUNK = 4 * 1024 * 1024

__all__ = ["data_extents", "padded_copy", "repair_in_place", "zero_tail"]


class Segment(Protocol):
    """What these helpers use of a segment (a :class:`~store.files.mapped_file.MappedFile`)."""

    size: int

    def fd(self) -> int: ...

    def buffer(self) -> mmap.mmap: ...

    def write(self, position: int, data: bytes) -> None: ...


def _prefix_chunks(fh, size: int):
    """``(position, bytes)`` of the first ``size`` bytes of the open file ``fh``, in chunks."""
    pos = 0
    while pos < size:
        chunk = fh.read(min(_ZERO_CHUNK, size - pos))
        if not chunk:
            return
        yield pos, chunk
        pos += len(chunk)


def padded_copy(path: str, size: int) -> mmap.mmap:
    """An anonymous mapping of ``size`` bytes holding the first bytes of ``path`` (the rest
    zeros: untouched anonymous pages cost no memory)."""
    m = mmap.mmap(-1, size)
    with open(path, "rb") as fh:
        for pos, chunk in _prefix_chunks(fh, size):
            m[pos:pos + len(chunk)] = chunk
    return m


def repair_in_place(path: str, size: int) -> str:
    """Move the damaged segment at ``path`` aside and put a ``size``-byte copy of its first
    bytes (zero-padded) in its place; returns where the original went."""
    aside = move_aside(path)
    tmp = path + ".tmp"
    with open(aside, "rb") as src, open(tmp, "wb") as dst:
        dst.truncate(size)
        allocate(dst.fileno(), min(size, os.fstat(src.fileno()).st_size), tmp)
        for pos, chunk in _prefix_chunks(src, size):
            if np.frombuffer(chunk, dtype=np.uint8).any():  # zeros stay a hole
                os.pwrite(dst.fileno(), chunk, pos)
        os.fdatasync(dst.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
    return aside


def data_extents(f: Segment, position: int):
    """``(start, end)`` ranges of ``f`` from ``position`` on that may hold data.

    Holes of the sparse segment are skipped with ``SEEK_DATA``/``SEEK_HOLE``, so a mostly
    unwritten 1 GiB segment is not read page by page; without that support the whole rest
    of the file is one range.
    """
    fd = f.fd()
    pos = position
    while pos < f.size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but holes from here on
                return
            start, end = pos, f.size
        if start >= f.size:
            return
        end = min(end, f.size)
        yield start, end
        pos = end


def zero_tail(f: Segment, position: int) -> None:
    """Overwrite the non-zero bytes of ``f`` from ``position`` to its end with zeros."""
    buf = f.buffer()
    for start, end in data_extents(f, position):
        pos = start
        while pos < end:
            n = min(_ZERO_CHUNK, end - pos)
            if np.frombuffer(buf, dtype=np.uint8, count=n, offset=pos).any():
                f.write(pos, bytes(n))
            pos += n
