"""CRC32 of large buffers (RocketMQ's BODYCRC polynomial: zlib's), at hardware speed.

ISA-L's CRC32 (the ``isal`` package) uses carry-less multiplication where the CPU has it:
11.3 GB/s on one core of the development machine against 2.2 GB/s for ``zlib.crc32`` over
256 MiB, the same values.  It pays for large buffers: a sink half of megabytes (staged by
every Spark task, checked again by the commit) and any body of
:data:`LARGE_BODY_BYTES` or more.  Per call it costs as much as zlib (about 0.17 µs), so
small bodies keep the compiled record kernel's loop (no call per body).

Without ``isal`` (a platform it has no wheel for) :func:`crc32` is ``zlib.crc32``: same
results, slower.
"""

from __future__ import annotations

import zlib

try:
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover - exercised only where isal is not installed
    _fast_crc32 = None

#: The CRC32 function used for large buffers.
crc32 = _fast_crc32 or zlib.crc32
#: Whether :func:`crc32` is ISA-L's.
HARDWARE_CRC = _fast_crc32 is not None
#: Bodies from this size on get their CRC from :func:`crc32` rather than the record kernel.
LARGE_BODY_BYTES = 1024 if HARDWARE_CRC else 16 * 1024

