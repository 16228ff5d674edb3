"""``group.json``: the member list of a store group (several stores read and written as one).

A *store group* is a directory holding ``group.json`` and, usually, its member stores as
subdirectories.  Each member is a complete store of its own (CommitLog, ConsumeQueues, lock,
timer and transaction state), like one RocketMQ broker, and is known by its name (RocketMQ's
``brokerName``).  The file is JSON, written atomically (the previous copy kept as ``.bak``)::

    {"format": "rmq-store-group", "version": 1,
     "stores": [{"name": "broker-a", "path": "broker-a"},
                {"name": "broker-b", "path": "/mnt/disk2/rmq/broker-b"}]}

=========  ========================================================================
field      meaning
=========  ========================================================================
format     always ``"rmq-store-group"`` (tells a group from any other JSON file)
version    layout version of this file, 1
stores     the members in their fixed order: ``name`` (letters, digits, ``-``, ``_``;
           at most 64 characters; unique) and ``path`` (relative paths are relative to
           the group directory; an absolute one puts a member on another disk; an
           ``rmq://HOST:PORT`` URL names a store served on another host)
=========  ========================================================================

The order of ``stores`` is part of the group: rows routed by a hash (the Spark sink, sharding
keys) go to the member at ``hash % len(stores)``, so members are never reordered or removed
once written to.  Adding members is not supported by this version (a reader would route
sharding keys differently than the writers before it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..base.errors import InvalidGroupError
from .fileio import read_json, write_json_atomic
from ..base.remote_address import is_remote

GROUP_FILE = "group.json"
GROUP_FORMAT = "rmq-store-group"
GROUP_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME_RULE = "letters, digits, '-' and '_', 1 to 64 characters, unique in the group"


@dataclass(frozen=True)
class GroupLayout:
    """The members of a group: ``names`` in their fixed order and each one's directory."""

    root: str
    names: tuple[str, ...]
    paths: tuple[str, ...]

    def path(self, name: str) -> str:
        """The directory of member ``name``."""
        try:
            return self.paths[self.names.index(name)]
        except ValueError:
            raise InvalidGroupError(f"store {name!r} is not a member of the group {self.root}; "
                                    f"allowed: {', '.join(self.names)}") from None

    def members(self) -> list[tuple[str, str]]:
        """``[(name, directory)]`` in the group's order."""
        return list(zip(self.names, self.paths))


def is_group(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a store group directory (it holds ``group.json``)."""
    return os.path.isfile(os.path.join(os.fspath(path), GROUP_FILE))


def validate_names(names) -> tuple[str, ...]:
    """Check member names (see :data:`_NAME_RULE`); return them as a tuple."""
    names = tuple(names)
    if not names:
        raise InvalidGroupError(f"a store group needs at least one store; allowed: {_NAME_RULE}")
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidGroupError(f"store name {name!r}; allowed: {_NAME_RULE}")
    if len(set(names)) != len(names):
        raise InvalidGroupError(f"store names {list(names)} repeat a name; allowed: {_NAME_RULE}")
    return names


def _valid(data: object) -> bool:
    return (isinstance(data, dict) and data.get("format") == GROUP_FORMAT
            and isinstance(data.get("stores"), list))


def read_group(path: str | os.PathLike) -> GroupLayout:
    """Read the ``group.json`` of the group at ``path``.

    Raises
    ------
    InvalidGroupError
        No readable ``group.json`` there (nor its ``.bak``), another version, or a member
        list that breaks the rules above.
    """
    root = os.path.abspath(os.fspath(path))
    file = os.path.join(root, GROUP_FILE)
    data = read_json(file, _valid)
    if data is None:
        raise InvalidGroupError(f"{file} is missing or not a store group's member list; "
                                "allowed: a directory made by StoreGroup.create")
    if data.get("version") != GROUP_VERSION:
        raise InvalidGroupError(f"{file} has version {data.get('version')!r}; allowed: "
                                f"{GROUP_VERSION} (written by a newer rmq?)")
    stores = data["stores"]
    if not all(isinstance(s, dict) and isinstance(s.get("path"), str) and s["path"]
               for s in stores):
        raise InvalidGroupError(f"{file}: every entry of 'stores' needs a name and a path")
    names = validate_names(s.get("name") for s in stores)
    paths = tuple(s["path"] if is_remote(s["path"])
                  else os.path.normpath(os.path.join(root, s["path"])) for s in stores)
    return GroupLayout(root, names, paths)


def write_group(path: str | os.PathLike, names, paths=None) -> GroupLayout:
    """Write a new group's ``group.json`` (members in ``names`` order, each in
    ``paths[i]`` or, by default, the subdirectory of its name); refuses to overwrite one."""
    root = os.path.abspath(os.fspath(path))
    names = validate_names(names)
    paths = list(paths) if paths is not None else list(names)
    if len(paths) != len(names):
        raise InvalidGroupError(f"{len(names)} store names but {len(paths)} paths were given")
    if is_group(root):
        raise InvalidGroupError(f"{root} is a store group already; open it with "
                                "StoreGroup.open")
    os.makedirs(root, exist_ok=True)
    if os.path.isdir(os.path.join(root, "commitlog")):
        raise InvalidGroupError(f"{root} is a store; allowed: a new or empty directory for the "
                                "group (its stores go into subdirectories)")
    entries = [{"name": n, "path": os.fspath(p)} for n, p in zip(names, paths)]
    write_json_atomic(os.path.join(root, GROUP_FILE),
                      {"format": GROUP_FORMAT, "version": GROUP_VERSION, "stores": entries})
    return read_group(root)
