"""``deliverDue``: move due delayed messages into their topics when a query plans.

Delayed messages (delay levels and the timer wheel) become visible in their real topic only
when something calls ``MessageStore.deliver_due()``, which appends, so it needs a writable
store.  A streaming query's driver-side runner is a long-lived process: it keeps one writable
store per path open in this module (never in a reader object, which must pickle) and calls
``deliver_due()`` at every trigger.  A batch query delivers once, in its planner, and closes.
The store's write lock makes concurrent deliverers (several queries, a producer's own process)
safe: each due message is delivered exactly once.

A streaming trigger delivers at most :data:`TRIGGER_DELIVERY_MESSAGES` itself
(``deliver_due(max_messages=...)``), so that a large burst falling due at once does not hold
the trigger (and the rows already delivered) back until the whole burst is in its topics.
When that step was full, a thread of the runner process goes on delivering in steps of the
same size while Spark reads the batch just planned; the next trigger plans what has arrived
by then.  A trigger that finds that thread still at work leaves the delivering to it; an
error it met is raised by the next trigger.
"""

from __future__ import annotations

import logging
import threading

from store import MessageStore, warm_up

from .errors import InvalidOptionError
from .stores import is_rmq_store, open_writer

_lock = threading.Lock()
log = logging.getLogger("rmq_source")


def _foreign(path: str) -> bool:
    """A store rmq did not create (a RocketMQ broker's): queries read it and never write."""
    if is_rmq_store(path):
        return False
    log.warning("deliverDue: %s was not written by rmq (no config/store.json); due delayed "
                "messages are not delivered, the store is only read", path)
    return True


def _open_writable(path: str) -> MessageStore:
    return open_writer(path, needs="option deliverDue=true", error=InvalidOptionError,
                       hint=", or deliverDue=false (due delayed messages then stay pending)")


def deliver_due_once(path: str) -> int:
    """Open ``path`` writable, deliver every due delayed message, close; return how many."""
    if _foreign(path):
        return 0
    store = _open_writable(path)
    try:
        return store.deliver_due()
    finally:
        store.close()


#: Due messages one step delivers (a trigger's own step, then each background step).
TRIGGER_DELIVERY_MESSAGES = 131_072


class _Deliverer:
    """A writable store kept open for one path, and the thread that drains a due burst."""

    def __init__(self, store: MessageStore, step: int) -> None:
        self.store = store
        self.step = step
        self.lock = threading.Lock()  # one deliver_due at a time on this store object
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.closed = False

    def trigger(self) -> int:
        """One trigger's step; starts the background drain when more may be due."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if self.thread is not None and self.thread.is_alive():
            return 0  # the drain is delivering
        with self.lock:
            n = self.store.deliver_due(max_messages=self.step)
        if n >= self.step:
            self.thread = threading.Thread(target=self._drain, daemon=True,
                                           name="rmq-deliver-due")
            self.thread.start()
        return n

    def _drain(self) -> None:
        try:
            while not self.closed:
                with self.lock:
                    if self.closed:
                        return
                    n = self.store.deliver_due(max_messages=self.step)
                if n < self.step:
                    return
        except BaseException as exc:  # noqa: BLE001 - raised by the next trigger
            self.error = exc

    def close(self) -> None:
        self.closed = True
        thread = self.thread
        if thread is not None:
            thread.join()
        self.store.close()


_deliverers: dict[str, _Deliverer] = {}
_foreign_paths: set[str] = set()


def deliver_due_kept_open(path: str, max_messages: int | None = TRIGGER_DELIVERY_MESSAGES
                          ) -> int:
    """Deliver due messages through a writable store kept open in this process.

    With ``max_messages`` (a streaming trigger), delivers at most that many now and leaves
    the rest of a burst to a background thread (see the module docstring); ``None`` delivers
    every due message before returning (after any background drain has finished).
    """
    with _lock:
        if path in _foreign_paths:
            return 0
        deliverer = _deliverers.get(path)
        if deliverer is None:
            if _foreign(path):
                _foreign_paths.add(path)
                return 0
            step = max_messages or TRIGGER_DELIVERY_MESSAGES
            warm_up(background=True)  # numba loaded beside the first triggers (store.base.jit)
            deliverer = _deliverers[path] = _Deliverer(_open_writable(path), step)
    if max_messages is not None:
        return deliverer.trigger()
    if deliverer.thread is not None:
        deliverer.thread.join()
    with deliverer.lock:
        return deliverer.store.deliver_due()


def close_kept_open(path: str) -> None:
    """Close the store :func:`deliver_due_kept_open` keeps for ``path`` (if any)."""
    with _lock:
        deliverer = _deliverers.pop(path, None)
    if deliverer is not None:
        deliverer.close()
