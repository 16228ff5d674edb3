"""The Flight server's store readers: a small pool, lent to one call at a time.

A :class:`~store.StoreReader` holds open files (its segments' mappings, the queues it read)
and is not shared between threads.  One per server thread, kept for the thread's life, grew
with every thread gRPC ever started (hundreds of files after a few bursts of calls).  Here a
call borrows a reader for as long as it reads (a ``DoGet`` stream: until its last batch is
sent or the stream is dropped) and gives it back; at most :data:`KEEP_IDLE` idle readers are
kept, any further one is closed when returned.  So open files stay bounded by the calls in
progress (which gRPC's own thread pool bounds) plus :data:`KEEP_IDLE` readers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..facade.store_reader import StoreReader

#: Idle readers kept for the next calls.
KEEP_IDLE = 4


class ReaderPool:
    """Readers of one store directory (see the module docstring)."""

    def __init__(self, open_reader: Callable[[], StoreReader], keep_idle: int = KEEP_IDLE
                 ) -> None:
        self._open = open_reader
        self._keep = int(keep_idle)
        self._idle: list[StoreReader] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def reader(self) -> Iterator[StoreReader]:
        """A reader for this call alone, given back when the block ends."""
        reader = self.borrow()
        try:
            yield reader
        finally:
            self.give_back(reader)

    def borrow(self) -> StoreReader:
        """A reader for one call alone; the caller gives it back (:meth:`give_back`)."""
        with self._lock:
            reader = self._idle.pop() if self._idle else None
        return reader if reader is not None else self._open()

    def give_back(self, reader: StoreReader) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(reader)
                return
        reader.close()

    def close(self) -> None:
        """Close the idle readers; a reader lent out is closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for reader in idle:
            reader.close()
