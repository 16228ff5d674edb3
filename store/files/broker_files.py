"""Broker config files under the store root, read and written as RocketMQ's fastjson does.

A RocketMQ broker keeps its settings next to its store as JSON text written by fastjson:
``config/topics.json``, ``config/delayOffset.json``, ``consumerOffset.json``,
``subscriptionGroup.json`` and others.  fastjson's pretty format is tab-indented, writes
``"name":value`` with no space, and writes the integer keys of a map unquoted
(``{1:8,2:7}``), which is not strict JSON.

rmq maintains two of these files (``topics.json`` and ``delayOffset.json``), so a broker and
rmq can each open what the other wrote:

* :func:`read_lenient_json` accepts fastjson's unquoted integer keys, and falls back to the
  ``.bak`` copy as RocketMQ's ``ConfigManager`` does;
* :func:`dumps_fastjson` writes the same text fastjson would (integer keys of a ``dict``
  unquoted, every other key quoted and sorted);
* :func:`write_config` replaces a file atomically, keeping the previous one as ``.bak``
  (RocketMQ keeps a ``.bak`` too), and keeps every top-level field rmq does not know, so a
  broker's other settings survive; a file that cannot be read even leniently is moved aside
  (``<name>.damaged-<n>``), never overwritten.

The other broker files are never written.
"""

from __future__ import annotations

import json
import logging
import os
import re

from .fileio import atomic_write, move_aside

log = logging.getLogger("store")

_BARE_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def parse_lenient(text: str) -> object | None:
    """JSON text, accepting fastjson's unquoted integer keys; ``None`` when unreadable."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:  # the regex runs only for text json refuses (fastjson's bare keys); split, not
        # sub: sub expands its template in Python once per key (seconds for 100,000)
        parts = _BARE_KEY.split(text)
        parts[2::4] = [f'"{key}"' for key in parts[2::4]]
        return json.loads("".join(parts))
    except ValueError:
        return None


def _read_one(path: str) -> object | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_lenient(fh.read())
    except (OSError, UnicodeDecodeError):  # missing, unreadable or not text
        return None


def read_lenient_json(path: str, valid=None) -> object | None:
    """Read a config file (or its ``.bak``), accepting fastjson's unquoted integer keys;
    with ``valid``, a file of another shape counts as unreadable."""
    for candidate in (path, path + ".bak"):
        data = _read_one(candidate)
        if data is not None and (valid is None or valid(data)):
            return data
    return None


def dumps_fastjson(data: object, indent: int = 0) -> str:
    """``data`` as fastjson's pretty format writes it (see the module docstring)."""
    pad = "\t" * (indent + 1)
    if isinstance(data, dict):
        if not data:
            return "{}"
        ints = [k for k in data if isinstance(k, int) and not isinstance(k, bool)]
        keys = sorted(ints) + sorted((k for k in data if k not in ints), key=str)
        items = [f"{pad}{k if k in ints else json.dumps(str(k), ensure_ascii=False)}:"
                 f"{dumps_fastjson(data[k], indent + 1)}" for k in keys]
        return "{\n" + ",\n".join(items) + "\n" + "\t" * indent + "}"
    if isinstance(data, (list, tuple)):
        if not data:
            return "[]"
        items = [pad + dumps_fastjson(v, indent + 1) for v in data]
        return "[\n" + ",\n".join(items) + "\n" + "\t" * indent + "]"
    return json.dumps(data, ensure_ascii=False)


def write_config(path: str, data: dict) -> None:
    """Replace the config file at ``path`` with ``data`` merged over its current top-level
    fields (fastjson's text, atomically, the previous file kept as ``.bak``).

    The caller holds the store's write lock.
    """
    current = None
    if os.path.exists(path):
        current = _read_one(path)
        if not isinstance(current, dict):
            moved = move_aside(path)
            log.warning("%s is not readable JSON; kept as %s and written afresh", path, moved)
            current = None
    if current is None:
        backup = _read_one(path + ".bak")
        current = backup if isinstance(backup, dict) else {}
    merged = {**current, **data}
    atomic_write(path, dumps_fastjson(merged).encode("utf-8"), keep_backup=True)


__all__ = ["dumps_fastjson", "parse_lenient", "read_lenient_json", "write_config"]
