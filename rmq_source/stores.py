"""Opening stores from the data source: the one place ``rmq_source`` opens a store.

Readers (the driver's planning and the executors' tasks) open a
:class:`store.StoreReader`: no lock, no recovery, no writes.  Writers (due delivery, the
check loop, the ``end_transaction`` writer) open a :class:`store.MessageStore`, but only
after a read-only open succeeded, so that a mistyped path fails instead of creating a new,
empty store there.  Every failure becomes an error of this package naming the option or the
action and what is allowed.

A path may also be a served store's URL (``rmq://HOST:PORT``, ``rmqs://``, ``rmq serve
--listen``): then every open returns a client of that server (:func:`store.connect`), built in
the process that uses it (gRPC is not fork-safe), and no store file is opened here.  How to
reach it (token, TLS roots, time bound) comes from the query's options
(:class:`~rmq_source.options.RemoteAccess`), recorded in every process they reach.
"""

from __future__ import annotations

from store import (
    MessageStore,
    StoreError,
    StoreGroup,
    StoreNotFoundError,
    StoreReader,
    connect,
    is_remote,
    is_store_group,
)

from .errors import InvalidOptionError, RmqSourceError
from .options import remote_access


def _open_remote(path: str, what: str):
    access = remote_access(path)
    store = connect(path, **({} if access is None else access.connect_options()))
    try:
        store.info()  # reachable, and the token accepted
    except StoreError as exc:
        store.close()
        raise InvalidOptionError(f"{what}={path!r}: {exc}") from None
    return store

_ALLOWED = "allowed: the directory of an existing rmq store"


def open_reader(path: str) -> StoreReader:
    """Open the store at ``path`` read-only; a bad path is an :class:`InvalidOptionError`."""
    if is_remote(path):
        return _open_remote(path, "option path")
    if is_store_group(path):
        raise InvalidOptionError(
            f"option path={path!r} is a store group; this works on one store only; allowed: "
            "the directory of one of its stores (see group.json for their paths)")
    try:
        return StoreReader.open(path)
    except StoreNotFoundError as exc:
        raise InvalidOptionError(f"option path={path!r}: {exc}; {_ALLOWED}") from None
    except NotADirectoryError:
        raise InvalidOptionError(f"option path={path!r}: not a directory; {_ALLOWED}") from None
    except (OSError, StoreError) as exc:
        raise InvalidOptionError(
            f"option path={path!r}: cannot be read ({type(exc).__name__}: {exc}); {_ALLOWED}"
        ) from None


def is_rmq_store(path: str) -> bool:
    """Whether rmq created the store at ``path`` (a RocketMQ broker's directory is read only)."""
    reader = open_reader(path)
    try:
        return reader.written_by_rmq
    finally:
        reader.close()


def open_writer(path: str, *, needs: str, error: type[RmqSourceError] = RmqSourceError,
                hint: str = "") -> MessageStore:
    """Open the existing store at ``path`` for writing.

    Parameters
    ----------
    needs : str
        What needs the writable store, for the message (e.g. ``"option deliverDue=true"``).
    error : type
        The :class:`RmqSourceError` subclass raised when the writable open fails.
    hint : str
        Appended to the "allowed" part of that message (another way out, if any).
    """
    if is_remote(path):  # the server writes
        return _open_remote(path, f"{needs}: path")
    open_reader(path).close()  # a writable open would create a store at a mistyped path
    try:
        return MessageStore.open(path)
    except (OSError, StoreError) as exc:
        raise error(
            f"{needs} needs to open the store {path!r} for writing, which failed "
            f"({type(exc).__name__}: {exc}); allowed: a writable store directory{hint}"
        ) from None


def open_group_writer(path: str, *, needs: str,
                      error: type[RmqSourceError] = RmqSourceError) -> StoreGroup:
    """Open the existing store group at ``path`` (every member) for writing."""
    access = remote_access(path)
    try:
        return StoreGroup.open(path, remote=None if access is None else access.connect_options())
    except (OSError, StoreError) as exc:
        raise error(
            f"{needs} needs to open the store group {path!r} for writing, which failed "
            f"({type(exc).__name__}: {exc}); allowed: a writable store group directory"
        ) from None


def open_writable(path: str, *, needs: str, error: type[RmqSourceError] = RmqSourceError):
    """:func:`open_group_writer` for a store group's path, else :func:`open_writer`: what a
    writer of messages or transaction ends opens (both have ``sink``, ``producer``,
    ``end_transactions`` and ``close``)."""
    if is_store_group(path):
        return open_group_writer(path, needs=needs, error=error)
    return open_writer(path, needs=needs, error=error)


def ensure_store(path: str) -> None:
    """Create a store at ``path`` when nothing is there yet (a write may start a new store;
    an existing store or store group is only checked to be readable)."""
    import os

    if is_remote(path):
        open_reader(path).close()
        return
    if is_store_group(path):
        for _, member in store_members(path):
            open_reader(member).close()
        return
    if os.path.isdir(path) and os.listdir(path):
        open_reader(path).close()
        return
    try:
        MessageStore.open(path).close()
    except (OSError, StoreError) as exc:
        raise InvalidOptionError(
            f"option path={path!r}: cannot create a store there ({type(exc).__name__}: "
            f"{exc}); allowed: an existing rmq store or a new (or empty) directory") from None


def store_members(path: str) -> list[tuple[str, str]]:
    """``[(store name, directory)]`` of what ``path`` names: the members of a store group
    (:class:`store.StoreGroup`), or ``[("", path)]`` for one store."""
    if not is_store_group(path):
        return [("", path)]
    try:
        return StoreGroup.members(path)
    except StoreError as exc:
        raise InvalidOptionError(f"option path={path!r}: {exc}") from None
