"""``deliverDue``: move due delayed messages into their topics when a query plans.

Delayed messages (delay levels and the timer wheel) become visible in their real topic only
when something calls ``MessageStore.deliver_due()``, which appends, so it needs a writable
store.  A streaming query's driver-side runner is a long-lived process: it keeps one writable
store per path open in this module (never in a reader object, which must pickle) and calls
``deliver_due()`` at every trigger.  A batch query delivers once, in its planner, and closes.
The store's write lock makes concurrent deliverers (several queries, a producer's own process)
safe: each due message is delivered exactly once.
"""

from __future__ import annotations

import threading

from store import MessageStore, StoreError

from .errors import InvalidOptionError

_lock = threading.Lock()
_open_stores: dict[str, MessageStore] = {}


def _open_writable(path: str) -> MessageStore:
    # a read-only open first: a writable open would create a store at a mistyped path
    try:
        MessageStore.open(path, read_only=True).close()
    except (OSError, StoreError) as exc:
        raise InvalidOptionError(f"option path={path!r}: {exc}; allowed: the directory of an "
                                 "existing rmq store") from None
    try:
        return MessageStore.open(path)
    except (OSError, StoreError) as exc:
        raise InvalidOptionError(
            f"option deliverDue=true needs to open the store {path!r} for writing, which "
            f"failed ({type(exc).__name__}: {exc}); allowed: a writable store directory, or "
            "deliverDue=false (due delayed messages then stay pending)") from None


def deliver_due_once(path: str) -> int:
    """Open ``path`` writable, deliver every due delayed message, close; return how many."""
    store = _open_writable(path)
    try:
        return store.deliver_due()
    finally:
        store.close()


def deliver_due_kept_open(path: str) -> int:
    """Deliver due messages through a writable store kept open in this process."""
    with _lock:
        store = _open_stores.get(path)
        if store is None:
            store = _open_stores[path] = _open_writable(path)
        return store.deliver_due()


def close_kept_open(path: str) -> None:
    """Close the store :func:`deliver_due_kept_open` keeps for ``path`` (if any)."""
    with _lock:
        store = _open_stores.pop(path, None)
    if store is not None:
        store.close()
