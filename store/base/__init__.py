"""The ground floor: what every other folder may use, importing nothing of the store above it.

The typed errors (``errors``), the settings (``config``), the layer table (``layers``), the
compiled-loop machinery (``jit``: the only importer of numba), CRC32 (``crc``) and the
addresses of served stores (``remote_address``).
"""
