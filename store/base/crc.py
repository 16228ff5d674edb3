"""CRC32 (RocketMQ's BODYCRC polynomial: zlib's) at hardware speed, for buffers and for the
compiled record loops.

ISA-L's CRC32 (the ``isal`` package) uses carry-less multiplication where the CPU has it:
11.3 GB/s on one core of the development machine against 2.2 GB/s for ``zlib.crc32`` over
256 MiB, the same values.  :func:`crc32` is it, for whole buffers (a sink half of megabytes,
staged by every Spark task and checked again by the commit).  The compiled record loops
(assembly, the CommitLog walks) call it once per body through a C function pointer,
:func:`crc_function`: from Python each call would cost about 0.17 µs, from the loops 24 ns
for a 100-byte body.

Without ``isal`` (a platform it has no wheel for) :func:`crc32` is ``zlib.crc32`` and the
loops call a compiled slice-by-16 loop, bodies of :data:`LARGE_BODY_BYTES` or more getting
zlib's CRC before the loop: same results, slower.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import zlib

import numpy as np

from .jit import c_function

try:
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover - exercised only where isal is not installed
    _fast_crc32 = None

#: The CRC32 function used for large buffers.
crc32 = _fast_crc32 or zlib.crc32
#: Whether :func:`crc32` is ISA-L's.
HARDWARE_CRC = _fast_crc32 is not None
#: Without ``isal``: bodies from this size on get their CRC from :func:`crc32` (zlib) rather
#: than from the record loop's compiled fallback.
LARGE_BODY_BYTES = 16 * 1024


# -- the CRC compiled kernels call, one body at a time --------------------------------------

_function_lock = threading.Lock()
_function: list = []


def crc_function():
    """The C function the compiled record kernels call for each body's CRC32:
    ``uint32 f(uint32 0, const void *buf, uint64 len)``, a ``ctypes`` function pointer the
    kernels take as an argument (so numba's on-disk cache of them still holds: the address is
    read at each call, never compiled in).

    ISA-L's ``crc32_gzip_refl`` where ``isal`` is installed: 24 ns for a 100-byte body
    against 72 ns for the slice-by-16 loop, measured over a million bodies on one core.
    Else that loop itself, compiled as a C callback (:func:`loop_function`); until a
    background thread has it (numba is never imported nor compiled on the caller's path,
    :mod:`store.base.jit`), a callback into ``zlib.crc32``.
    """
    if not _function:
        with _function_lock:
            if not _function:
                fn = _isal_function()
                if fn is None:
                    threading.Thread(target=_load_loop, name="rmq-crc-jit", daemon=True).start()
                    fn = _ZLIB_CALLBACK
                _function.append(c_function(fn))
    return _function[0]


def _load_loop() -> None:
    """Compile (or load) :func:`loop_function`, then serve it from :func:`crc_function`."""
    fn = loop_function()
    with _function_lock:
        _function[:] = [fn]


_CRC_TYPE = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)
#: zlib's CRC32 as a C function pointer (a call into Python: slow, correct, never compiled).
_ZLIB_CALLBACK = _CRC_TYPE(lambda init, address, length:
                           zlib.crc32(ctypes.string_at(address, length), init))


def _isal_function():
    """ISA-L's CRC32 out of the ``isal`` package's extension module, or ``None``."""
    if not HARDWARE_CRC:
        return None
    try:
        import isal.isal_zlib

        fn = ctypes.CDLL(isal.isal_zlib.__file__).crc32_gzip_refl
    except (ImportError, OSError, AttributeError):  # pragma: no cover - other isal builds
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64]
    if fn(0, b"123456789", 9) != zlib.crc32(b"123456789"):  # pragma: no cover
        return None
    return fn


@functools.lru_cache(maxsize=None)
def loop_function():
    """The slice-by-16 loop (:func:`store.base.crc.crc32_loop`) as a C callback with
    the signature of :func:`crc_function` (compiled by numba on first use, then cached)."""
    from numba import carray, cfunc, njit, types

    loop = njit(crc32_loop)
    tables = CRC_TABLES

    @cfunc(types.uint32(types.uint32, types.voidptr, types.uint64), cache=True, nogil=True)
    def crc_loop(init, buf, length):  # pragma: no cover - runs compiled
        return loop(carray(buf, (length,), np.uint8), 0, length, tables)

    return c_function(crc_loop.ctypes)


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


#: The plain-Python CRC loop (compiled as the C fallback of :func:`store.base.crc.crc_function`).
crc32_loop = _crc32
