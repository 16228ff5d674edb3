"""A lease on the store's append ``flock``: a process sending single records keeps it.

Every append takes the store's ``flock`` so that processes sharing a store never interleave
their writes.  Taking and giving it back costs two system calls, about 1.2 µs on the 2-core
VM the benchmarks run on: an eighth of a single ``send``.  A process that sends single
records again and again (the one-record path,
:meth:`~store.core.appender.Appender.append_one`) may instead keep the lock for a short
**lease** and pay for it once.  Larger appends (batches, tables, the
sink, delivery) gain nothing from it and take no lease; they use one that is held.

* a lease lasts at most ``append_lock_lease_ms`` (1 ms by default) and at most
  :data:`LEASE_APPENDS` appends; a daemon thread gives back a lease that outlives its time
  while the process is idle, so another process waits at most about that long;
* a lease pays only when it covers many appends: each one wakes that thread (a GIL hand-off
  and two context switches, tens of µs on a loaded machine, against about 8 µs of CPU a
  lease saves each append: two ``flock`` calls, a ``stat`` and their Python).  A lease whose time ran out before it covered :data:`SPARSE_APPENDS`
  appends tells that this process sends too sparsely (a network endpoint answering a send
  every few hundred µs; a producer sending now and then): it takes no lease for
  :data:`SPARSE_NS` (1 s), every append taking and giving back the lock, and then tries one
  again (measured with ``bench/bench_grpc.py``'s load, 64 clients in flight: the gRPC
  endpoint's CPU a send went from 848-1,204 µs, a lease per one or two sends, to 644-732
  µs, what leases turned off cost: 597-809 µs in the same runs);
* a process that finds the lock taken says so before it waits: it writes the time it started
  waiting into the ``lock`` file (below).  A process that had to wait, or that sees a recent
  waiter when it would take a lease, takes no lease for :data:`SHARED_NS` (1 s): while
  several processes append at once, every append takes and gives back the lock, as before
  leases existed (measured with ``bench/bench_lock_lease.py``: leases that let a waiter go
  first doubled two busy processes' total rate but cut three processes' on two cores to
  0.6x; with 100 ms here instead of 1 s, three processes ran at 0.92x of no leases);
* the lock itself is unchanged (the same ``flock`` on the same file), so mutual exclusion
  never depends on the hint, only fairness does; a process that dies holding a lease loses
  the lock with its file descriptors, as it would in the middle of an append.

``append_lock_lease_ms=0`` turns leases off (every outermost append takes and gives back the
lock).

Layout of the store's ``lock`` file (big-endian; RocketMQ writes the text ``lock`` at its
start, which stays untouched):

======  ====  =======  ==========================================================
offset  size  type     field
======  ====  =======  ==========================================================
0       8     -        free (RocketMQ's ``lock`` text)
8       8     int64    ``waiting_since_ns``: ``CLOCK_MONOTONIC`` of the last process
                       that started to wait for the lock; 0 when none
======  ====  =======  ==========================================================
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import time

#: The waiter hint: ``CLOCK_MONOTONIC`` ns at which a process began to wait for the lock.
WAITING_SINCE = struct.Struct(">q")
WAITING_SINCE_OFFSET = 8
LOCK_FILE_BYTES = WAITING_SINCE_OFFSET + WAITING_SINCE.size

#: Appends one lease covers at most (then the lock is given back and taken again).
LEASE_APPENDS = 128

#: A hint older than this is left over by a waiter that died or gave up (or one that waits
#: behind a long append): it is ignored.
STALE_HINT_NS = 100_000_000

#: After a process found the lock taken, or saw another process wait for it, it takes no
#: lease for this long: processes that append at the same time take and give back the lock
#: on every append, as they would without leases.
SHARED_NS = 1_000_000_000

#: A lease that ran out of time before covering this many appends was not worth its
#: releasing thread's wake-up: no lease for :data:`SPARSE_NS` after it.
SPARSE_APPENDS = LEASE_APPENDS // 8
SPARSE_NS = 1_000_000_000


class LockLease:
    """The append ``flock`` of one open store and its lease (see the module doc).

    ``thread_lock`` is the store's re-entrant thread lock: the lease's fields change only
    under it (the releasing thread takes it too).
    """

    def __init__(self, fd: int, lease_ms: int, thread_lock: threading.RLock) -> None:
        self.fd = fd
        self.configured_ns = self.lease_ns = lease_ms * 1_000_000
        self.thread_lock = thread_lock
        #: Whether this process holds the lock between appends (read by the append path).
        self.held = False
        #: Appends left in the current lease.
        self.left = 0
        self.deadline_ns = 0
        #: No lease before this time (another process appended lately).
        self.shared_until_ns = 0
        #: No lease before this time either (this process's last lease covered too few
        #: appends to pay for itself: :data:`SPARSE_APPENDS`).
        self.sparse_until_ns = 0
        self._hint = self._map_hint(fd)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()  # set by close; the releasing thread sleeps on it
        st = os.fstat(fd)
        self._file = (st.st_dev, st.st_ino)  # which store: see _register
        _register(self)

    @staticmethod
    def _map_hint(fd: int) -> mmap.mmap | None:
        try:
            if os.fstat(fd).st_size < LOCK_FILE_BYTES:
                os.ftruncate(fd, LOCK_FILE_BYTES)  # zeros: nobody waiting
            return mmap.mmap(fd, LOCK_FILE_BYTES)
        except (OSError, ValueError):  # a file system without shared mappings: no hints
            return None

    # ------------------------------------------------------------------ taking the lock
    def acquire(self, lease: bool = True) -> None:
        """Take the ``flock`` for an outermost append; with ``lease``, keep it as a lease
        unless other processes append too.

        Called under the thread lock, when :attr:`held` is false.
        """
        fd = self.fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._wait()
            self.shared_until_ns = time.monotonic_ns() + SHARED_NS  # others append too
            return
        if not (lease and self.lease_ns):
            return
        now = time.monotonic_ns()
        if now < self.shared_until_ns:
            return  # others appended lately: this append only, as without leases
        if now < self.sparse_until_ns:
            return  # leases did not pay lately: this append only
        if self._someone_waits(now):
            self.shared_until_ns = now + SHARED_NS
            return
        self.held = True
        self.left = LEASE_APPENDS
        self.deadline_ns = now + self.lease_ns
        if self._thread is None:
            self._start_releaser()
        self._wake.set()

    def _wait(self) -> None:
        hint = self._hint
        mine = time.monotonic_ns()
        if hint is not None:
            WAITING_SINCE.pack_into(hint, WAITING_SINCE_OFFSET, mine)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        if hint is not None and WAITING_SINCE.unpack_from(hint, WAITING_SINCE_OFFSET)[0] == mine:
            WAITING_SINCE.pack_into(hint, WAITING_SINCE_OFFSET, 0)  # served (unless another
            # waiter wrote after us: then its hint stays)

    def _someone_waits(self, now: int) -> bool:
        """Whether a process wrote that it waits for the lock, lately (a hint older than
        :data:`STALE_HINT_NS` is left over by a waiter that died or gave up)."""
        hint = self._hint
        if hint is None:
            return False
        since = WAITING_SINCE.unpack_from(hint, WAITING_SINCE_OFFSET)[0]
        return since != 0 and now - since < STALE_HINT_NS

    def release(self) -> None:
        """Give the ``flock`` back (and end the lease, if one is held); under the thread
        lock."""
        self.held = False
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ the releasing thread
    def _start_releaser(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rmq-append-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Give back a lease that outlived its time while the process does not append."""
        wake = self._wake
        while True:
            wake.wait()
            if self._closing.is_set():
                return
            delay = self.deadline_ns - time.monotonic_ns()
            if delay > 0:
                self._closing.wait(delay / 1e9)
                continue
            # Only when no append of this process is in progress: a busy process gives its
            # lease back itself, after LEASE_APPENDS appends (waiting here for the thread
            # lock would make every long append hand the interpreter over twice).
            if not self.thread_lock.acquire(blocking=False):
                self._closing.wait(self.lease_ns / 1e9 or 0.001)
                continue
            try:
                if self._closing.is_set():
                    return
                now = time.monotonic_ns()
                if self.held and now >= self.deadline_ns:
                    if LEASE_APPENDS - self.left < SPARSE_APPENDS:  # (left: see locking)
                        self.sparse_until_ns = now + SPARSE_NS
                    try:
                        self.release()
                    except OSError:  # the store was closed under us
                        self.held = False
                if not self.held:
                    wake.clear()
            finally:
                self.thread_lock.release()

    def close(self) -> None:
        """End the lease and stop the releasing thread (before the lock file is closed)."""
        _unregister(self)
        with self.thread_lock:
            self._closing.set()
            if self.held:
                self.release()
            self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if self._hint is not None:
            try:
                self._hint.close()
            except (BufferError, ValueError):
                pass
            self._hint = None


# ---------------------------------------------------------------------- one process, two handles
# Two open handles of one store in one process would wait for each other's lease (a lease is
# given back by a thread of the holder, not when another handle asks), so leases are off while
# a process has the store open more than once.
_HANDLES: dict[tuple[int, int], list[LockLease]] = {}
_HANDLES_LOCK = threading.Lock()


def _register(lease: LockLease) -> None:
    with _HANDLES_LOCK:
        handles = _HANDLES.setdefault(lease._file, [])
        handles.append(lease)
        _set_leases(handles)


def _unregister(lease: LockLease) -> None:
    with _HANDLES_LOCK:
        handles = _HANDLES.get(lease._file, [])
        if lease in handles:
            handles.remove(lease)
        if not handles:
            _HANDLES.pop(lease._file, None)
        _set_leases(handles)


def _set_leases(handles: list[LockLease]) -> None:
    alone = len(handles) == 1
    for h in handles:
        h.lease_ns = h.configured_ns if alone else 0
        if not alone:
            h.left = 0  # a lease held now ends at its next append (or by its thread)
