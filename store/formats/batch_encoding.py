"""Messages as columns: whole-column validation and the properties strings of many messages.

Shared by :meth:`Producer.send_batch <store.produce.producer.Producer.send_batch>` (lists of
:class:`~store.formats.message.Message`) and :mod:`store.produce.table_producer` (tables).  Each check runs over
a whole column instead of per message, and the properties strings are built with ``map`` and
``str.join`` over the columns, byte for byte what :func:`store.formats.record_codec.encode_properties` makes of
the dict a single send builds.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from itertools import chain, repeat
from operator import itemgetter
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from ..base.errors import InvalidMessageError
from .message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    check_tags,
    check_user_properties,
    keys_value,
)
from .byte_columns import ByteColumn

# keys the fast path takes as they are: single inner spaces only, no other whitespace
_WHITESPACE_BUT_SPACE = re.compile(r"[^\S ]")

def validated_columns(bodies: Sequence, tags: Sequence, keys: Sequence, properties: Sequence,
                      max_body: int, flags: Sequence | None = None):
    """Validate messages given as columns; return bodies, tags, KEYS values and user
    properties (encoded, without the trailing system properties).

    Each check runs over a whole column (distinct tags, one scan of all keys, the set of
    property names) rather than per message.  When a column is not plainly valid, raises
    :class:`InvalidMessageError` or ``TypeError``; the caller then validates row by row to
    name the first bad one (as single sends would).  Keys may be strings or lists of strings.
    """
    key_types = set(map(type, keys))
    if not key_types <= {str, type(None)}:  # lists of keys (or something to refuse)
        keys = [_joined_keys(k) for k in keys]
    pairs = _PropertyColumns.of(properties)
    if pairs is None or not _columns_plainly_valid(bodies, tags, keys, pairs,
                                                   flags if flags is not None else (0,),
                                                   max_body):
        raise InvalidMessageError("a message of the batch is not valid")
    return list(bodies), list(tags), [k or None for k in keys], pairs.users(properties)


def normalized_columns(bodies: Sequence, tags: Sequence, keys: Sequence, properties: Sequence):
    """What :func:`validated_columns` returns, row by row, for messages already validated
    one by one (bodies of any bytes-like type, keys as lists, unusual spacing)."""
    return ([bytes(b) for b in bodies], list(tags), [keys_value(k) for k in keys],
            [user_properties_text(p) if p else "" for p in properties])


def _is_list(value: object) -> bool:
    return isinstance(value, (list, tuple))


def _joined_keys(keys):
    """A list of keys as one KEYS string; a key with a space is left for the check to refuse."""
    if not _is_list(keys):
        return keys
    parts = [k for k in keys if k]
    if not all(isinstance(k, str) and " " not in k for k in parts):
        raise InvalidMessageError(f"keys {keys!r}: each key must be a str without spaces")
    return " ".join(parts) or None


class OnePair(NamedTuple):
    """User properties of a batch where every message has one pair, all with one name."""

    name: str
    values: list[str]


class _PropertyColumns(NamedTuple):
    """The user properties of a batch as columns: pair counts, distinct names, all values."""

    counts: set[int]
    names: set
    values: list

    @classmethod
    def of(cls, properties: Sequence) -> "_PropertyColumns | None":
        if set(map(type, properties)) != {dict}:
            return None
        counts = set(map(len, properties))
        if counts == {0}:
            return cls(counts, set(), [])
        names = set().union(*properties)
        if counts == {1} and len(names) == 1:  # the common shape: one lookup per message
            return cls(counts, names, list(map(itemgetter(next(iter(names))), properties)))
        return cls(counts, names, list(chain.from_iterable(map(dict.values, properties))))

    def users(self, properties: Sequence[dict]) -> "list[str] | OnePair":
        """:func:`user_properties_text` of every dict, or a :class:`OnePair` (the common
        shape, formatted later in the same pass as the rest of the properties string)."""
        if self.counts == {0}:
            return [""] * len(properties)
        if self.counts == {1} and len(self.names) == 1:
            return OnePair(next(iter(self.names)), self.values)
        if self.counts == {1}:
            return [f"{k}\x01{v}\x02" for p in properties for k, v in p.items()]
        return [user_properties_text(p) if p else "" for p in properties]


def _columns_plainly_valid(bodies, tags, keys, pairs: "_PropertyColumns", flags,
                           max_body: int) -> bool:
    """True when every message of the columns is valid; False when unsure (or invalid)."""
    if set(map(type, bodies)) != {bytes}:
        return False
    lengths = list(map(len, bodies))
    if min(lengths) < 1 or max(lengths) > max_body:
        return False
    for f in set(flags):
        if type(f) is not int or not -(2**31) <= f < 2**31:
            return False
    for t in set(tags):
        check_tags(t)
    if not set(map(type, keys)) <= {str, type(None)}:
        return False
    text_keys = list(filter(None, keys))
    if text_keys:
        joined = "\x02".join(text_keys)
        if (joined.count("\x02") != len(text_keys) - 1 or "\x01" in joined or "  " in joined
                or " \x02" in joined or "\x02 " in joined or joined[0] == " "
                or joined[-1] == " " or _WHITESPACE_BUT_SPACE.search(joined)):
            return False
    if pairs.values:
        for name in pairs.names:
            if type(name) is not str:
                return False
            check_user_properties({name: "x"})  # the name alone: values come next
        values = pairs.values
        if set(map(type, values)) != {str}:
            return False
        joined = "\x02".join(values)
        if ("\x01" in joined or joined.count("\x02") != len(values) - 1
                or not all(map(str.strip, values))):
            return False
    return True


def user_properties_text(properties: dict) -> str:
    """``name 0x01 value 0x02 ...`` of a message's (validated) user properties."""
    return "\x02".join(map("\x01".join, properties.items())) + "\x02"


def properties_column(users: "list[str] | OnePair", tags: list, keys: list,
                      ids: list[str]) -> ByteColumn:
    """Each message's whole properties string: user properties, TAGS, KEYS, UNIQ_KEY, as one
    :class:`~store.formats.byte_columns.ByteColumn` (row ``i``: message ``i``'s string).

    The same order (and bytes) as :func:`store.formats.record_codec.encode_properties` of the dict a
    single send builds.  The string is cut into parts that are either the same for every
    message (a tag shared by all, the pair names, separators) or a column.  When every
    message has the same number of pairs (the usual batch), all the parts are joined and
    encoded at once and the rows are cut at every k-th 0x02 (validated names and values
    hold no 0x02, and UTF-8 never puts one inside a character); otherwise each message's
    string is one join over the columns.
    """
    n = len(ids)
    parts: list = []  # str: the same for every message; list: one value per message
    pairs = 1  # pairs per message (UNIQ_KEY); None: it varies
    if isinstance(users, OnePair):
        parts += [f"{users.name}\x01", users.values, "\x02"]
        pairs += 1
    elif any(users):
        parts.append(users)
        pairs = None
    distinct = set(tags)
    if len(distinct) == 1:
        tag = next(iter(distinct))
        if tag:
            parts.append(f"{PROPERTY_TAGS}\x01{tag}\x02")
            pairs = pairs and pairs + 1
    else:
        tag_part = {t: f"{PROPERTY_TAGS}\x01{t}\x02" if t else "" for t in distinct}
        parts.append(list(map(tag_part.__getitem__, tags)))
        pairs = pairs and (pairs + 1 if all(distinct) else None)
    missing = keys.count(None)
    if missing == 0:
        parts += [f"{PROPERTY_KEYS}\x01", keys, "\x02"]
        pairs = pairs and pairs + 1
    elif missing < len(keys):
        parts.append([f"{PROPERTY_KEYS}\x01{k}\x02" if k else "" for k in keys])
        pairs = None
    parts += [f"{PROPERTY_UNIQ_KEY}\x01", ids, "\x02"]
    columns: list = []
    for part in parts:
        if isinstance(part, str) and columns and isinstance(columns[-1], str):
            columns[-1] += part
        else:
            columns.append(part)
    if pairs:
        # every row's parts, row after row, in one join: no string per row
        flat: list = [None] * (len(columns) * n)
        for j, column in enumerate(columns):
            flat[j::len(columns)] = repeat(column, n) if isinstance(column, str) else column
        data = np.frombuffer("".join(flat).encode("utf-8"), dtype=np.uint8)
        ends = np.flatnonzero(data == 2)
        if len(ends) == pairs * n:
            offsets = np.zeros(n + 1, dtype=np.int64)
            offsets[1:] = ends[pairs - 1::pairs] + 1
            return ByteColumn(data, offsets)
    columns = [repeat(c, n) if isinstance(c, str) else c for c in columns]
    return ByteColumn.of(list(map(str.encode, map("".join, zip(*columns)))))


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is encoded.

    Encoding allocates a few objects per message and frees none of them in cycles; the
    collector would otherwise rescan the young objects again and again (a third of the time
    of a large table, measured).  Reference counting still frees everything at once.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
