"""``config/store.json``: the layout a store was created with, its id and its format version.

The file is JSON, written atomically twice (the first copy becomes ``config/store.json.bak``,
read when the file itself is damaged):

==================  ====================================================================
field               what it holds
==================  ====================================================================
``layout``          the layout settings of :class:`~store.base.config.StoreConfig`
                    (:data:`~store.base.config.LAYOUT_FIELDS`): segment and queue file
                    sizes, the timer wheel; they win over the settings a store is opened with
``layout_crc32``    CRC32 of the layout (sorted JSON), and of the store id and format
                    version when the file has them
``created_ms``      when the store was created (epoch ms)
``store_id``        the store's id (:mod:`store.core.identity`)
``format_version``  the on-disk format version (:mod:`store.core.format_version`)
==================  ====================================================================

A copy whose checksum or settings do not hold is not taken (the other one is); a store
without the file (one another system wrote, RocketMQ) has its layout read from the sizes of
its files (:func:`layout_from_files`).
"""

from __future__ import annotations

import json
import os
import zlib

from ..base.config import LAYOUT_FIELDS, StoreConfig
from ..base.errors import InvalidConfigError
from ..files.consume_queue import ENTRY_SIZE
from ..files.fileio import read_json, write_json_atomic
from .format_version import FORMAT_VERSION
from .identity import is_store_id, new_store_id


def layout_crc(layout: dict, store_id: object = None, format_version: object = None) -> int:
    """The checksum of ``config/store.json``: its layout and, when the file has them, its
    store id and format version (a flipped digit there must not pass for another store or
    a newer format: the ``.bak`` is read instead)."""
    text = json.dumps(layout, sort_keys=True)
    if store_id is not None or format_version is not None:
        text += f"|{store_id}|{format_version}"
    return zlib.crc32(text.encode("utf-8"))


def recorded_layout(data: object) -> bool:
    """``config/store.json`` as :func:`write_layout` writes it: a layout whose settings
    are valid and, when it carries one, match their checksum."""
    if not (isinstance(data, dict) and isinstance(data.get("layout"), dict)):
        return False
    crc = data.get("layout_crc32")
    if crc is not None and crc != layout_crc(data["layout"], data.get("store_id"),
                                             data.get("format_version")):
        return False
    values = {k: v for k, v in data["layout"].items() if k in LAYOUT_FIELDS}
    if isinstance(values.get("timer_wheel_slots"), int):  # a roll window inside that wheel
        values["timer_roll_window_slots"] = max(2, values["timer_wheel_slots"] // 4)
    try:
        StoreConfig().replace(**values)
    except (InvalidConfigError, TypeError, ValueError):
        return False
    return True


def write_layout(path: str, layout: dict, created_ms, store_id: str | None = None) -> None:
    """Write ``config/store.json`` and its ``.bak`` (the layout is read from either), with the
    store's id (:mod:`store.core.identity`; a new one when ``store_id`` is not one)."""
    store_id = store_id if is_store_id(store_id) else new_store_id()
    data = {"layout": layout, "layout_crc32": layout_crc(layout, store_id, FORMAT_VERSION),
            "created_ms": created_ms, "store_id": store_id, "format_version": FORMAT_VERSION}
    write_json_atomic(path, data)
    write_json_atomic(path, data)  # the first copy becomes the .bak


def ensure_store_id(root: str) -> str:
    """The id recorded in ``root``'s ``config/store.json``; a store of an older version (or
    whose file lost it) gets one now.  Called with the store's open lock held."""
    path = os.path.join(root, "config", "store.json")
    recorded = read_json(path, recorded_layout)
    if recorded is not None and is_store_id(recorded.get("store_id")):
        return recorded["store_id"]
    layout = recorded["layout"] if recorded is not None else None
    if layout is None:  # (the opening process recorded one; a damaged file: recorded again)
        return new_store_id()
    store_id = new_store_id()
    write_layout(path, layout, recorded.get("created_ms"), store_id)
    return store_id


def layout_from_files(root: str) -> dict[str, int]:
    """Segment and queue file sizes of a store directory without ``config/store.json``.

    RocketMQ preallocates every CommitLog segment and ConsumeQueue file at full size, so the
    files themselves say how large they are.  Returns the :class:`StoreConfig` fields found.
    """
    found: dict[str, int] = {}
    log_dir = os.path.join(root, "commitlog")
    try:
        segments = sorted(n for n in os.listdir(log_dir) if len(n) == 20 and n.isdigit())
    except OSError:
        segments = []
    for name in segments:
        size = os.path.getsize(os.path.join(log_dir, name))
        if size:
            found["commitlog_file_size_bytes"] = size
            break
    queue_root = os.path.join(root, "consumequeue")
    for topic in sorted(os.listdir(queue_root)) if os.path.isdir(queue_root) else ():
        for queue in sorted(os.listdir(os.path.join(queue_root, topic))):
            qdir = os.path.join(queue_root, topic, queue)
            files = sorted(os.listdir(qdir)) if os.path.isdir(qdir) else []
            sizes = [os.path.getsize(os.path.join(qdir, f)) for f in files[:1]]
            if sizes and sizes[0] and sizes[0] % ENTRY_SIZE == 0:
                found["consume_queue_file_entries"] = sizes[0] // ENTRY_SIZE
                return found
    return found
