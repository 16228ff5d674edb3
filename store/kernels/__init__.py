"""The compiled loops over whole batches (numba, imported by :mod:`store.kernels.jit` only)."""
