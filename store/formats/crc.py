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

from ..kernels.jit import c_function

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
    :mod:`store.kernels.jit`), a callback into ``zlib.crc32``.
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
    """The slice-by-16 loop (:func:`store.kernels.record_kernels.crc32_loop`) as a C callback with
    the signature of :func:`crc_function` (compiled by numba on first use, then cached)."""
    from numba import carray, cfunc, njit, types

    from ..kernels.record_kernels import CRC_TABLES, crc32_loop

    loop = njit(crc32_loop)
    tables = CRC_TABLES

    @cfunc(types.uint32(types.uint32, types.voidptr, types.uint64), cache=True, nogil=True)
    def crc_loop(init, buf, length):  # pragma: no cover - runs compiled
        return loop(carray(buf, (length,), np.uint8), 0, length, tables)

    return c_function(crc_loop.ctypes)
