"""A compiled loop over whole batches of records: record assembly with the body CRCs.

JIT-compiled with numba (``cache=True``: compiled once per installation and machine, then
loaded from the cache in every process, Spark workers included), by :mod:`store.base.jit`, which
imports numba in the background and runs small batches through the same loops as Python
until they are loaded.

:func:`assemble_records` writes whole CommitLog records into one output buffer: the fixed
header (:data:`store.formats.record_codec.HEADER_DTYPE`, already filled but for the CRC), the body, the
topic (length byte and name), the properties length (2 bytes, big-endian) and the
properties (the row's string, then an optional suffix such as delay routing), each run
copied from the column buffers with C's ``memcpy`` (:func:`memcpy_function`), with no Python
object per record; RocketMQ's BODYCRC (zlib's CRC32) of each body comes from the C function
of :func:`store.base.crc.crc_function` (ISA-L's, or the compiled slice-by-16 loop).  Both
functions are passed in as arguments, so the kernels stay in numba's cache.

Record layout (big-endian, :mod:`store.formats.record_codec`)::

    offset          field
    0               the fixed header, HEADER_SIZE bytes, BODYCRC at CRC_OFFSET
    HEADER_SIZE     body (BODYLENGTH bytes, the header's last field)
    ...             TOPICLENGTH (1 byte), TOPIC
    ...             PROPERTIESLENGTH (2 bytes), PROPERTIES (row string + suffix)

Why numba: a Python loop (or ``map(zlib.crc32, ...)`` plus ``b"".join`` over five pieces per
record) costs about 1 us per 100-byte record; these loops run at memory speed.  The cost is
numba's import (about 0.2 s) and, on the first use after an install, the compilation
(about 1 s, then cached), both paid off the caller's path (:mod:`store.base.jit`).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..base.jit import c_function, kernel_set


def crc32_call(data, start, end, crc):
    """CRC32 of ``data[start:end]`` (a contiguous uint8 array) by the C function ``crc``
    (:func:`store.base.crc.crc_function`); other kernel modules compile it as their helper."""
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
    computes it (:func:`store.base.crc.crc_function`).
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
    """Check and complete records staged by the sink (:mod:`store.sink.staging`): record
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
    :func:`store.base.crc.crc_function`.  Measured on a million records: assembling took 0.30 s
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
