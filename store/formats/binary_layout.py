"""One field list per binary layout: the ``struct.Struct`` and the NumPy dtype are built from it.

Every fixed-size on-disk layout (the CommitLog record header, a ConsumeQueue entry, a timer
wheel slot, a TimerLog unit) is declared once as ``(name, type)`` pairs in big-endian NumPy
notation (``">i4"``, ``">i8"``, ``"V4"`` for 4 raw bytes).  :func:`layout` turns the list into
the ``struct.Struct`` used for single records and the structured dtype used to decode many at
once, so the two can never disagree.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

_STRUCT_CODES = {">i1": "b", ">u1": "B", ">i2": "h", ">i4": "i", ">i8": "q"}


class Layout(NamedTuple):
    """A binary layout: its field list, ``struct.Struct``, NumPy dtype and field offsets."""

    fields: tuple[tuple[str, str], ...]
    struct: struct.Struct
    dtype: np.dtype
    offsets: dict[str, int]

    def exports(self) -> tuple[struct.Struct, int, np.dtype]:
        """``(struct, size, dtype)``: what a format module publishes of a layout (as ``X``,
        ``X_SIZE``, ``X_DTYPE``); both sizes agree (:func:`layout` checks)."""
        return self.struct, self.struct.size, self.dtype


def layout(fields: tuple[tuple[str, str], ...]) -> Layout:
    """Build a big-endian :class:`Layout` from ``(name, type)`` pairs (see the module docstring)."""
    codes = []
    for name, kind in fields:
        if kind.startswith("V"):
            codes.append(f"{int(kind[1:])}s")
        elif kind in _STRUCT_CODES:
            codes.append(_STRUCT_CODES[kind])
        else:  # pragma: no cover - a programming error in a layout table
            raise ValueError(f"field {name!r} has type {kind!r}; allowed: "
                             f"{sorted(_STRUCT_CODES)} or V<n>")
    packed = struct.Struct(">" + "".join(codes))
    dtype = np.dtype(list(fields))
    if dtype.itemsize != packed.size:  # pragma: no cover - padding cannot happen for '>'
        raise ValueError(f"layout {fields!r}: struct {packed.size} != dtype {dtype.itemsize}")
    return Layout(tuple(fields), packed, dtype,
                  {name: dtype.fields[name][1] for name, _ in fields})
