"""Byte-string columns over NumPy buffers: what the compiled loops read and write.

:class:`ByteColumn` holds variable-length strings side by side (an Arrow binary array's
buffers, not copied); :class:`ByteSlices` holds strings anywhere in one buffer (bodies read in
place from a mapped segment).  :func:`checked_offsets` refuses offsets a compiled loop would
follow out of its buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..base.errors import InvalidMessageError


def one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``values`` as one Arrow array: a chunked array of one chunk gives that chunk, with no
    copy (``ChunkedArray.combine_chunks`` copies even then: 0.1 s for the records of 1M
    messages); several chunks are combined."""
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values


def checked_offsets(offsets: np.ndarray, limit: int, what: str) -> np.ndarray:
    """``offsets`` (an Arrow array's, ``n + 1`` of them) when they stay inside the ``limit``
    bytes or entries they index: the first >= 0, never falling, the last <= ``limit``.

    A compiled loop trusts the offsets it is handed; an array built by hand
    (``pa.Array.from_buffers``) or read from a stream Arrow validated only cheaply may hold
    any, and one past its buffer would read (or copy into a message) whatever memory follows.
    One vectorised pass, no copy of the offsets.
    """
    if len(offsets) and (offsets[0] < 0 or offsets[-1] > limit
                         or (len(offsets) > 1 and bool((offsets[1:] < offsets[:-1]).any()))):
        raise InvalidMessageError(
            f"{what}: Arrow offsets outside their buffer (first {int(offsets[0])}, last "
            f"{int(offsets[-1])}, buffer {limit}) or falling; allowed: offsets rising from 0 "
            "to at most the buffer's length (a valid Arrow array)")
    return offsets


def _check_buffers(arr: pa.Array) -> None:
    """:func:`checked_offsets` of a (large) binary or string array's own buffers."""
    buffers = arr.buffers()
    if len(buffers) < 3 or buffers[1] is None:
        return
    wide = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    item = 8 if wide else 4
    n = len(arr) + arr.offset + 1
    if buffers[1].size < n * item:
        raise InvalidMessageError(f"a {arr.type} array of {len(arr)} rows has "
                                  f"{buffers[1].size} bytes of offsets; allowed: {n * item}")
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32,
                            count=n)[arr.offset:]
    checked_offsets(offsets, 0 if buffers[2] is None else buffers[2].size, f"a {arr.type} array")


def _numpy_owned(data: np.ndarray) -> bool:
    """Whether ``data`` is, or views, an array that owns its memory (no outside buffer)."""
    while isinstance(data.base, np.ndarray):
        data = data.base
    return data.base is None


@dataclass(frozen=True, slots=True)
class ByteColumn:
    """Variable-length byte strings side by side: ``data[offsets[i]:offsets[i + 1]]``.

    ``data`` is uint8, ``offsets`` (``n + 1`` of them) int64, or int32 as an Arrow binary or
    string array holds them (read-only, not copied).  Built from such an array without
    copying bytes or offsets, or from a list of ``bytes`` with one join.  Sums of int32
    offsets stay below 2**31 (one Arrow array's bytes); anything adding to one (a limit, a
    position elsewhere) widens it first.
    """

    data: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def starts(self) -> np.ndarray:
        return self.offsets[:-1]

    @property
    def ends(self) -> np.ndarray:
        return self.offsets[1:]

    @classmethod
    def of(cls, values) -> ByteColumn | ByteSlices:
        """A column of ``values``: a ByteColumn or ByteSlices (as is), an Arrow (chunked)
        binary/string array, or a sequence of bytes-like objects."""
        if isinstance(values, (ByteColumn, ByteSlices)):
            return values
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            return cls.from_arrow(values)
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.frombuffer(b"".join(values), dtype=np.uint8), offsets)

    @classmethod
    def from_arrow(cls, arr) -> ByteColumn:
        arr = one_array(arr)
        _check_buffers(arr)  # before any Arrow kernel (cast, fill_null) copies by them
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            arr = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type)
                           else pa.binary())
        if arr.null_count:
            arr = arr.fill_null(b"")
        n = len(arr)
        _, off_buf, data_buf = arr.buffers()[:3]
        wide = pa.types.is_large_binary(arr.type)
        # Arrow's own offsets, not copied: widening them cost 16 MB of fresh memory per
        # column of 2M rows, a third of the page faults of a 2M-row send_table
        offsets = np.frombuffer(off_buf, dtype=np.int64 if wide else np.int32,
                                count=arr.offset + n + 1)[arr.offset:]
        data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
                else np.zeros(0, np.uint8))
        return cls(data, offsets)

    def slice(self, lo: int, hi: int) -> ByteColumn:
        """Rows ``[lo, hi)`` (shares ``data``)."""
        return ByteColumn(self.data, self.offsets[lo:hi + 1])

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def to_arrow(self, type_: pa.DataType = pa.binary(), *, copy: bool = True) -> pa.Array:
        """An Arrow binary (or string) array of the rows: one copy of the bytes, or with
        ``copy=False`` none when the rows are the whole of ``data`` and ``data`` is NumPy's
        own memory (not a view of an Arrow buffer or a mapped segment); the caller no longer
        writes to it, and the Arrow array keeps it alive."""
        lo, hi = int(self.offsets[0]), int(self.offsets[-1])
        offsets = (self.offsets - lo).astype(np.int32)
        data = self.data[lo:hi]
        if copy or lo != 0 or hi != len(self.data) or not _numpy_owned(self.data):
            data = data.copy()
        return pa.Array.from_buffers(type_, len(self), [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])


@dataclass(frozen=True, slots=True)
class ByteSlices:
    """Byte strings anywhere in one buffer: row ``i`` is ``data[starts[i]:ends[i]]``.

    Rows may be apart, overlap or come in any order (the bodies of records read in place
    from a mapped segment, say); used wherever a :class:`ByteColumn` is.
    """

    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def lengths(self) -> np.ndarray:
        return self.ends - self.starts


EMPTY = ByteColumn(np.zeros(1, np.uint8), np.zeros(1, np.int64))


def empty_column(n: int) -> ByteColumn:
    """``n`` empty strings."""
    return ByteColumn(EMPTY.data, np.zeros(n + 1, np.int64))
