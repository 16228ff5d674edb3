"""Ordered appends of work prepared on two threads: the shape of every large columnar append.

A large append (a table of messages, a burst of due timer messages, a sink's commit) is cut
into chunks.  Preparing a chunk (reading sources, building headers and properties, encoding the
records with the compiled kernels: :meth:`StoreCore.assemble_encoded
<store.core.store_core.StoreCore.assemble_encoded>`) needs no lock and mostly runs in NumPy,
Arrow and numba code that releases the GIL; appending it (placing, patching four header
fields, ``pwrite``, queue entries) must happen in order on the thread that holds the write
lock.  :func:`prepared_in_order` runs the preparing on a helper thread and on the calling
thread, and hands the prepared chunks back in order, so that both cores prepare while one
appends: RocketMQ likewise encodes messages on the sending threads before its put lock.
``threads=1`` (a store's ``encode_threads``, which the ``rmq`` sink sets to 1 in its Spark
tasks) turns the helper off where the cores are busy already.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

#: The helper thread's name (a stopped run leaves none behind).
HELPER_NAME = "rmq-prepare"
#: Threads that prepare chunks by default: the caller and one helper.  ``1`` prepares every
#: chunk on the appending thread, for processes whose cores are already busy with work of
#: their own, such as Spark tasks: there a helper only competes for the same cores
#: (measured: two processes each sending a 500,000-row table at once took 1.3x as long with
#: the helper as without).
THREADS = 2


#: Chunks prepared at most ahead of the one the caller takes next: what a large append
#: holds in memory (16 MB of records for chunks of 2 MB) however fast it is encoded.
AHEAD = 8


def prepared_in_order(count: int, prepare: Callable[[int], T], *,
                      ahead: int = AHEAD, threads: int = THREADS) -> Iterator[T]:
    """``prepare(0)``, ..., ``prepare(count - 1)``, yielded in that order.

    With two chunks or more a helper thread takes the next unclaimed chunk whenever it is
    free, at most ``ahead`` chunks past the one the caller takes next; the calling thread,
    while the next chunk in order is not ready, prepares the next unclaimed one itself.
    ``prepare`` must be safe to run on two threads at once (it should only read shared
    state).  An error preparing chunk ``k`` (on either thread) is raised here after chunks
    ``0 .. k - 1`` were yielded, as a loop over the chunks would raise it, and no chunk is
    prepared after it; the helper has stopped when it is raised.  Closing the iterator early
    (an error while the caller appends) stops the helper too.
    """
    if count <= 1 or threads <= 1:
        for i in range(count):
            yield prepare(i)
        return
    ready: dict[int, tuple[bool, object]] = {}
    cond = threading.Condition()
    stop = threading.Event()  # set by an error, or when the caller stops early
    claimed = taken = 0  # chunks claimed, chunks taken by the caller (under cond)

    def claim(wait: bool) -> int | None:
        """The next chunk to prepare; ``None`` when none is left (or, without ``wait``,
        when the next is more than ``ahead`` past the caller's)."""
        nonlocal claimed
        with cond:
            while wait and claimed >= taken + ahead and not stop.is_set():
                cond.wait()
            if stop.is_set() or claimed >= count or claimed >= taken + ahead:
                return None
            claimed += 1
            return claimed - 1

    def work(i: int) -> None:
        try:
            outcome = (True, prepare(i))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's order of chunks
            outcome = (False, exc)
            stop.set()  # no chunk after it is needed
        with cond:
            ready[i] = outcome
            cond.notify_all()  # the caller waiting for it (or the helper, for a claim)

    def helper() -> None:
        # a claimed chunk is always prepared (the caller may be waiting for it): the stop
        # flag is checked before claiming, never between claiming and preparing
        while not stop.is_set():
            i = claim(True)
            if i is None:
                return
            work(i)

    thread = threading.Thread(target=helper, name=HELPER_NAME, daemon=True)
    thread.start()
    try:
        for i in range(count):
            while True:
                with cond:
                    if i in ready:
                        ok, value = ready.pop(i)
                        taken = i + 1
                        cond.notify_all()  # the helper may claim further
                        break
                # chunk i is claimed (claims go in order): prepare a later one meanwhile
                mine = claim(False)
                if mine is not None:
                    work(mine)
                    continue
                with cond:
                    while i not in ready:
                        cond.wait()
            if not ok:
                raise value
            yield value
    finally:
        stop.set()
        with cond:
            cond.notify_all()  # a helper waiting to claim
        thread.join()
