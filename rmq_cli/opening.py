"""Opening the store a command names: rmq's own writable, a RocketMQ broker's read-only."""

from __future__ import annotations

import os

import click


def open_store(path: str, *, must_exist: bool = True):
    """The store at ``path``: writable for an rmq store; read-only (nothing written, not a
    byte) for a directory Apache RocketMQ wrote."""
    from store import MessageStore, StoreGroup, StoreNotFoundError, StoreReader, is_store_group

    if is_store_group(path):
        members = ", ".join(f"{n} ({p})" for n, p in StoreGroup.members(path))
        raise click.UsageError(f"{path} is a store group; `rmq stats` and `rmq lag` take a "
                               f"group, this command takes one of its stores: {members}")
    if must_exist and not os.path.isfile(os.path.join(path, "config", "store.json")):
        try:
            reader = StoreReader.open(path)
        except (StoreNotFoundError, OSError):
            reader = None
        if reader is not None and not reader.written_by_rmq:
            return reader
        if reader is not None:
            reader.close()
        raise StoreNotFoundError(
            f"{path} is not an rmq store (no config/store.json); run `rmq send` or `rmq demo "
            f"--store {path}` first")
    return MessageStore.open(path)


def open_writable_store(path: str, why: str = "rmq only reads it"):
    """:func:`open_store` for a command that writes: a directory Apache RocketMQ wrote is
    refused with a usage error ending in ``why``."""
    store = open_store(path)
    if getattr(store, "read_only", False):
        store.close()
        raise click.UsageError(f"{path} was written by Apache RocketMQ; {why}")
    return store


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
