"""A compiled loop over whole batches of records: record assembly with the body CRCs.

JIT-compiled with numba (``cache=True``: compiled once per installation and machine, then
loaded from the cache in every process, Spark workers included), by :mod:`store.kernels.jit`, which
imports numba in the background and runs small batches through the same loops as Python
until they are loaded.

:func:`assemble_records` writes whole CommitLog records into one output buffer: the fixed
header (:data:`store.formats.codec.HEADER_DTYPE`, already filled but for the CRC), the body, the
topic (length byte and name), the properties length (2 bytes, big-endian) and the
properties (the row's string, then an optional suffix such as delay routing), each run
copied from the column buffers with C's ``memcpy`` (:func:`memcpy_function`), with no Python
object per record; RocketMQ's BODYCRC (zlib's CRC32) of each body comes from the C function
of :func:`store.formats.crc.crc_function` (ISA-L's, or the slice-by-16 loop here compiled).  Both
functions are passed in as arguments, so the kernels stay in numba's cache.

Record layout (big-endian, :mod:`store.formats.codec`)::

    offset          field
    0               the fixed header, HEADER_SIZE bytes, BODYCRC at CRC_OFFSET
    HEADER_SIZE     body (BODYLENGTH bytes, the header's last field)
    ...             TOPICLENGTH (1 byte), TOPIC
    ...             PROPERTIESLENGTH (2 bytes), PROPERTIES (row string + suffix)

Why numba: a Python loop (or ``map(zlib.crc32, ...)`` plus ``b"".join`` over five pieces per
record) costs about 1 us per 100-byte record; these loops run at memory speed.  The cost is
numba's import (about 0.2 s) and, on the first use after an install, the compilation
(about 1 s, then cached), both paid off the caller's path (:mod:`store.kernels.jit`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import InvalidMessageError
from .jit import c_function, kernel_set

CRC_POLY = 0xEDB88320


def _crc_tables() -> np.ndarray:
    """The 16 x 256 tables of slice-by-16 CRC32 (zlib's reflected polynomial)."""
    t = np.zeros((16, 256), dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ CRC_POLY if c & 1 else c >> 1
        t[0, i] = c
    for i in range(256):
        c = int(t[0, i])
        for k in range(1, 16):
            c = int(t[0, c & 0xFF]) ^ (c >> 8)
            t[k, i] = c
    return t


CRC_TABLES = _crc_tables()


def _crc32(data, start, end, t):
    """CRC32 of ``data[start:end]``, 16 bytes per step (slice-by-16: 1.4x slice-by-8 here)."""
    crc = np.uint32(0xFFFFFFFF)
    i = start
    while i + 16 <= end:
        lo = crc ^ (np.uint32(data[i]) | (np.uint32(data[i + 1]) << 8)
                    | (np.uint32(data[i + 2]) << 16) | (np.uint32(data[i + 3]) << 24))
        crc = (t[15, lo & 0xFF] ^ t[14, (lo >> 8) & 0xFF] ^ t[13, (lo >> 16) & 0xFF]
               ^ t[12, lo >> 24] ^ t[11, data[i + 4]] ^ t[10, data[i + 5]]
               ^ t[9, data[i + 6]] ^ t[8, data[i + 7]] ^ t[7, data[i + 8]]
               ^ t[6, data[i + 9]] ^ t[5, data[i + 10]] ^ t[4, data[i + 11]]
               ^ t[3, data[i + 12]] ^ t[2, data[i + 13]] ^ t[1, data[i + 14]]
               ^ t[0, data[i + 15]])
        i += 16
    while i < end:
        crc = t[0, (crc ^ data[i]) & 0xFF] ^ (crc >> 8)
        i += 1
    return crc ^ np.uint32(0xFFFFFFFF)


#: The plain-Python CRC loop (compiled as the C fallback of :func:`store.formats.crc.crc_function`).
crc32_loop = _crc32


def crc32_call(data, start, end, crc):
    """CRC32 of ``data[start:end]`` (a contiguous uint8 array) by the C function ``crc``
    (:func:`store.formats.crc.crc_function`); other kernel modules compile it as their helper."""
    return crc(np.uint32(0), data.ctypes.data + start, np.uint64(end - start))


def _assemble_records(out, positions, headers, crc_at, body_data, body_starts, body_ends,
                      topic_data, topic_offsets, topic_ids, props_data, props_starts,
                      props_ends, suffix_data, suffix_starts, suffix_ends, given_crcs, crc, mc):
    """Write records ``i`` at ``out[positions[i]:]`` (see the module doc for the layout).

    ``headers`` is the ``(n, HEADER_SIZE)`` uint8 view of the filled headers; record ``i``'s
    body is ``body_data[body_starts[i]:body_ends[i]]``, its properties and suffix likewise.
    The body CRC (masked to 31 bits, as RocketMQ stores it) is computed while the body is
    copied and written big-endian at ``crc_at``, unless ``given_crcs[i] >= 0`` (known to the
    caller: computed with zlib for a large body, or kept from a copied record); ``crc``
    computes it (:func:`store.formats.crc.crc_function`).
    """
    n, hsize = headers.shape
    # base addresses taken once: each copy is one call of C's memcpy (a helper function per
    # copy measured 3x slower over the whole loop)
    po = out.ctypes.data
    ph = headers.ctypes.data
    pb = body_data.ctypes.data
    pt = topic_data.ctypes.data
    pp = props_data.ctypes.data
    ps = suffix_data.ctypes.data
    for i in range(n):
        p = positions[i]
        mc(po + p, ph + i * hsize, hsize)
        b0, b1 = body_starts[i], body_ends[i]
        if given_crcs[i] >= 0:
            value = np.uint32(given_crcs[i]) & np.uint32(0x7FFFFFFF)
        else:
            value = crc(np.uint32(0), pb + b0, np.uint64(b1 - b0)) & np.uint32(0x7FFFFFFF)
        out[p + crc_at] = (value >> 24) & 0xFF
        out[p + crc_at + 1] = (value >> 16) & 0xFF
        out[p + crc_at + 2] = (value >> 8) & 0xFF
        out[p + crc_at + 3] = value & 0xFF
        p += hsize
        if b1 > b0:
            mc(po + p, pb + b0, b1 - b0)
        p += b1 - b0
        k = topic_ids[i]
        t0, t1 = topic_offsets[k], topic_offsets[k + 1]
        out[p] = t1 - t0
        if t1 > t0:
            mc(po + p + 1, pt + t0, t1 - t0)
        p += 1 + t1 - t0
        r0, r1 = props_starts[i], props_ends[i]
        s0, s1 = suffix_starts[i], suffix_ends[i]
        plen = (r1 - r0) + (s1 - s0)
        out[p] = (plen >> 8) & 0xFF
        out[p + 1] = plen & 0xFF
        p += 2
        if r1 > r0:
            mc(po + p, pp + r0, r1 - r0)
        p += r1 - r0
        if s1 > s0:
            mc(po + p, ps + s0, s1 - s0)


def _put_be(data, p, value, width):
    """Write ``value`` big-endian in ``width`` bytes at ``data[p:]``."""
    for k in range(width):
        data[p + width - 1 - k] = (value >> (8 * k)) & 0xFF


def _patch_placed(data, starts, queue_ids, queue_offsets, offsets, store_timestamp, at):
    """Write queue id (i32), queue offset, CommitLog offset and store time (i64) of record
    ``i`` at ``starts[i] + at[0..3]``."""
    for i in range(len(starts)):
        p = starts[i]
        _put_be(data, p + at[0], queue_ids[i], 4)
        _put_be(data, p + at[1], queue_offsets[i], 8)
        _put_be(data, p + at[2], offsets[i], 8)
        _put_be(data, p + at[3], store_timestamp, 8)


def _complete_staged(data, starts, sizes, prepared, staged_magic, magic, at, min_size):
    """Check and complete records staged by the sink (:mod:`store.sink.halves`): record
    ``i`` at ``starts[i]`` must hold ``sizes[i]`` in TOTALSIZE and ``staged_magic`` in
    MAGICCODE; it gets ``magic`` and PREPAREDTRANSACTIONOFFSET ``prepared[i]`` (``at``: the
    byte offsets of MAGICCODE and PREPAREDTRANSACTIONOFFSET).  Returns the first record
    failing the checks (nothing of it or after it changed), or -1."""
    for i in range(len(starts)):
        p = starts[i]
        total = ((np.int64(data[p]) << 24) | (np.int64(data[p + 1]) << 16)
                 | (np.int64(data[p + 2]) << 8) | np.int64(data[p + 3]))
        q = p + at[0]
        found = ((np.int64(data[q]) << 24) | (np.int64(data[q + 1]) << 16)
                 | (np.int64(data[q + 2]) << 8) | np.int64(data[q + 3]))
        if total != sizes[i] or total < min_size or found != staged_magic:
            return i
        _put_be(data, q, magic, 4)
        _put_be(data, p + at[1], prepared[i], 8)
    return -1


_kernels = kernel_set(globals(), helpers=("_put_be",),
                    kernels=("_assemble_records", "_patch_placed", "_complete_staged"))


@functools.lru_cache(maxsize=None)
def memcpy_function():
    """C's ``memcpy`` as a ``ctypes`` function pointer: the record kernel copies a record's
    runs (header, body, topic, properties) with it, taking it as an argument as it takes
    :func:`store.formats.crc.crc_function`.  Measured on a million records: assembling took 0.30 s
    against 0.33-0.36 s with numba's slice assignments (which build two array views per
    copy) and 0.51 s with byte loops.  Each call costs tens of nanoseconds, so it does not
    pay for runs of a few bytes: the properties join (:mod:`store.kernels.property_join`) was 3.4x
    slower with it and keeps its loops."""
    fn = ctypes.CDLL(None).memcpy
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return c_function(fn)


def patch_placed_fields(data: np.ndarray, starts: np.ndarray, queue_ids, queue_offsets,
                        offsets, store_timestamp_ms: int, at: np.ndarray) -> None:
    """:func:`_patch_placed`, compiled: the four fields a placement decides, written into
    assembled records (``at``: their byte offsets in a record, as int64)."""
    if len(starts):
        c, i8 = np.ascontiguousarray, np.int64
        _kernels(len(starts))["_patch_placed"](data, c(starts, dtype=i8), c(queue_ids, dtype=i8),
                                    c(queue_offsets, dtype=i8), c(offsets, dtype=i8),
                                    int(store_timestamp_ms), at)


def complete_staged(data: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                    prepared: np.ndarray, staged_magic: int, magic: int, at: np.ndarray,
                    min_size: int) -> int:
    """:func:`_complete_staged`, compiled."""
    if not len(starts):
        return -1
    c, i8 = np.ascontiguousarray, np.int64
    return int(_kernels(len(starts))["_complete_staged"](
        data, c(starts, dtype=i8), c(sizes, dtype=i8), c(prepared, dtype=i8),
        int(staged_magic) & 0xFFFFFFFF, int(magic) & 0xFFFFFFFF, c(at, dtype=i8),
        int(min_size)))


def assemble_records(*args):
    """:func:`_assemble_records`, compiled (same arguments)."""
    return _kernels(len(args[1]))["_assemble_records"](*args)


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
