"""The compiled loops over whole batches (numba, imported by :mod:`store.base.jit` only)."""
