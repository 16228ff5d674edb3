"""Opening the store a command names: rmq's own writable, a RocketMQ broker's read-only."""

from __future__ import annotations

import os

import click


def open_store(path: str, *, create: bool | None = None):
    """The store at ``path``: writable for an rmq store; read-only (nothing written, not a
    byte) for a directory Apache RocketMQ wrote.

    ``create``: ``True`` makes a new store where none is; ``False`` (a command that has
    ``--create``) refuses a path holding no store with a usage error saying so; ``None`` (a
    command that never creates) raises :class:`store.StoreNotFoundError`.  A served store's
    URL is refused (:func:`refuse_url` names what to use instead, per command).
    """
    from store import MessageStore, StoreGroup, StoreNotFoundError, StoreReader, is_store_group

    refuse_url(path, "this command", "run it on the server's host with --store DIR")
    if is_store_group(path):
        members = ", ".join(f"{n} ({p})" for n, p in StoreGroup.members(path))
        raise click.UsageError(f"{path} is a store group; `rmq stats` and `rmq lag` take a "
                               f"group, this command takes one of its stores: {members}")
    if not _holds_store(path):
        try:
            reader = StoreReader.open(path)
        except (StoreNotFoundError, OSError):
            reader = None
        if reader is not None and not reader.written_by_rmq:
            return reader
        if reader is not None:
            reader.close()
        if not create:
            if create is None:
                raise StoreNotFoundError(
                    f"{path} is not an rmq store (no config/store.json); check the path (`rmq "
                    f"send --create --store {path}` or `rmq demo --store {path}` makes one)")
            require_store(path, create)
    return MessageStore.open(path)


def _holds_store(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config", "store.json"))


def require_store(path: str, create: bool) -> None:
    """For a command that writes (``--create``): a path holding no rmq store (nor a store
    group) is a usage error naming it, unless ``create``; a typo never becomes a new, empty
    store."""
    from store import is_store_group

    if create or _holds_store(path) or is_store_group(path):
        return
    what = ("does not exist" if not os.path.exists(path) else
            "holds no rmq store (no config/store.json)")
    raise click.UsageError(f"--store {path} {what}; check the path, or pass --create to make "
                           "a new store there")


def open_writable_store(path: str, why: str = "rmq only reads it", *,
                        create: bool | None = None):
    """:func:`open_store` for a command that writes: a directory Apache RocketMQ wrote is
    refused with a usage error ending in ``why``."""
    store = open_store(path, create=create)
    if getattr(store, "read_only", False):
        store.close()
        raise click.UsageError(f"{path} was written by Apache RocketMQ; {why}")
    return store


# --------------------------------------------------------------------------- served stores
def refuse_url(path: str, command: str, instead: str) -> None:
    """A usage error when ``path`` is a served store's URL (``rmq://``): ``command`` works
    on a store directory only; ``instead`` says what to use."""
    from store import is_remote

    if is_remote(path):
        raise click.UsageError(f"{command} works on a store directory, not on a served "
                               f"store's URL ({path}); {instead}")


def remote_options(command):
    """``--token-file`` and ``--token``: the shared secret of a served store, for a command
    whose ``--store`` may be a URL (:func:`open_target`)."""
    command = click.option(
        "--token", default=None,
        help="The served store's shared secret (with --store rmq://...); --token-file keeps "
             "it out of the process list and the shell history.")(command)
    return click.option(
        "--token-file", type=click.Path(dir_okay=False), default=None,
        help="A file whose first line is the served store's shared secret (with --store "
             "rmq://HOST:PORT).")(command)


def check_no_token(path: str, token: str | None, token_file: str | None) -> None:
    """A usage error for a token given with a directory: it goes with a URL only."""
    if token is not None or token_file is not None:
        raise click.UsageError(f"--token and --token-file go with a served store's URL "
                               f"(--store rmq://HOST:PORT); {path} is a directory")


def open_target(path: str, token: str | None = None, token_file: str | None = None, *,
                create: bool | None = None, why: str | None = "rmq only reads it"):
    """The store ``--store`` names, for a command that also works on a served store: a
    :class:`store.remote.flight_client.RemoteStore` for an ``rmq://`` / ``rmqs://`` URL (its token
    from ``token`` or ``token_file``), else :func:`open_writable_store`'s (``why`` None:
    :func:`open_store`'s, for a command that only reads)."""
    from store import InvalidConfigError, connect, is_remote

    if not is_remote(path):
        check_no_token(path, token, token_file)
        if why is None:  # a command that only reads: a RocketMQ broker's directory too
            return open_store(path, create=create)
        return open_writable_store(path, why, create=create)
    if create:
        raise click.UsageError(f"--create makes a store directory; {path} is a served store, "
                               "which its server made: leave --create out")
    try:
        return connect(path, token=token, token_file=token_file)
    except InvalidConfigError as exc:
        raise click.UsageError(f"--store {path}: {exc}") from None


def store_members(store_path: str) -> list[tuple[str | None, str]]:
    """``[(store name, directory)]`` of a store group, or ``[(None, path)]`` for one store."""
    from store import StoreGroup, is_store_group

    if is_store_group(store_path):
        return StoreGroup.members(store_path)
    return [(None, store_path)]


def keyed_by_store(store_path: str, results: dict):
    """One store's result as it is; a group's as ``{"group", "stores": {name: result}}``."""
    if None in results:
        return results[None]
    return {"group": os.path.abspath(store_path), "stores": results}
