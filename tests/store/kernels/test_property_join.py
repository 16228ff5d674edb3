"""store.kernels.property_join and store.produce.table_properties against simple Python models: the
properties strings of whole tables, the user pairs of a map column and the plain-keys check."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from store.base.errors import InvalidMessageError
from store.formats.message import Message, keys_value, validate_message
from store.kernels.property_join import join_properties, plain_keys, property_parts
from store.produce.table_properties import user_property_pairs

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _model(user: bytes, tag, keys, msg_id: bytes) -> bytes:
    out = user
    if tag is not None:
        out += b"TAGS\x01" + tag.encode() + b"\x02"
    if keys:
        out += b"KEYS\x01" + keys.encode() + b"\x02"
    return out + b"UNIQ_KEY\x01" + msg_id + b"\x02"


_MAP = pa.map_(pa.string(), pa.string())
_name = st.text(st.sampled_from(list("abcXYZ_9é")), min_size=1, max_size=6)
_value = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
                 max_size=8).filter(lambda v: v.strip() != "")


def _user_pairs(maps: list, sliced: bool):
    """``user_property_pairs`` of a table whose properties column holds ``maps`` (a list of
    dicts or None), optionally as a slice of a longer column."""
    col = pa.array([None if m is None else list(m.items()) for m in maps], _MAP)
    if sliced:  # a column that starts inside its parent's entries
        pad = pa.array([[("pad", "x")], [("pad", "\x01")]], _MAP)
        col = pa.concat_arrays([pad, col]).slice(2)
    pairs = user_property_pairs(pa.table({"properties": col}))
    assert pairs is not None
    return pairs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.none() | st.dictionaries(_name, _value, max_size=3),
                          st.none() | _text, st.none() | _text),
                min_size=1, max_size=30),
       st.booleans(), st.booleans(), st.integers(0, 3), st.booleans())
def test_rows_are_the_parts_in_order(rows, with_tags, with_keys, chunk_at, sliced):
    n = len(rows)
    users = _user_pairs([m for m, _, _ in rows], sliced)
    tags = pa.array([t for _, t, _ in rows], pa.string()) if with_tags else None
    keys = pa.array([k for _, _, k in rows], pa.string()) if with_keys else None
    if keys is not None and sliced:  # an array that starts inside its buffers
        keys = pa.concat_arrays([pa.array(["pad"], pa.string()), keys]).slice(1)
    if tags is not None and 0 < chunk_at < n:
        tags = pa.chunked_array([tags.slice(0, chunk_at), tags.slice(chunk_at)])
    ids = np.frombuffer(b"".join(b"%032X" % (i * 7919) for i in range(n)), np.uint8)
    got = join_properties(users, tags, keys, ids.reshape(n, 32))
    alone = join_properties(users)
    lo, hi = n // 3, n - n // 4  # parts joined a slice at a time, as send_table's chunks
    part = property_parts(users, tags, keys, ids.reshape(n, 32)).slice(lo, hi)
    assert part.lengths().tolist() == got.lengths()[lo:hi].tolist()
    assert part.column().to_arrow().to_pylist() == got.to_arrow().to_pylist()[lo:hi]
    for i, (user, tag, key) in enumerate(rows):
        pairs = b"".join(f"{k}\x01{v}\x02".encode() for k, v in (user or {}).items())
        expected = _model(pairs, tag if with_tags else None, key if with_keys else None,
                          b"%032X" % (i * 7919))
        assert got.data[got.offsets[i]:got.offsets[i + 1]].tobytes() == expected
        assert alone.data[alone.offsets[i]:alone.offsets[i + 1]].tobytes() == pairs
    assert got.offsets[-1] == len(got.data)


def _refused(maps: list, sliced: bool = False) -> bool:
    col = pa.array(maps, _MAP)
    if sliced:
        col = pa.concat_arrays([pa.array([[("ok", "fine")]], _MAP), col]).slice(1)
    return user_property_pairs(pa.table({"properties": col})) is None


@pytest.mark.parametrize("pair", [
    ("a\x01", "v"), ("a", "v\x02"), ("a", ""), ("a", " "), ("a", "\t\n"), ("a", "\x1c"),
    ("a", "\u3000"), ("a", " \u00a0 "), ("", "v"), (" ", "v"), ("\u2003", "v"), ("KEYS", "v"),
    ("UNIQ_KEY", "v"), ("__RMQ_x", "v"), ("TIMER_DELIVER_MS", "v"),
])
def test_a_pair_single_sends_refuse_takes_the_per_row_path(pair):
    assert _refused([[("ok", "fine"), pair]])
    assert _refused([[pair]], sliced=True)
    with pytest.raises(InvalidMessageError):
        validate_message(Message("t", b"x", properties=dict([pair])), 1 << 20)


def test_pairs_single_sends_take_pass():
    assert not _refused([[("a", "\u3000x"), ("b", "é"), ("c", " v "), ("d", "x\x7f")],
                         None, []], sliced=True)
    for text in ("\u3000x", "é", " v ", "x\x7f"):
        validate_message(Message("t", b"x", properties={"a": text}), 1 << 20)


def test_a_name_twice_in_one_row_takes_the_per_row_path():
    assert _refused([[("a", "1"), ("b", "2"), ("a", "3")]])
    assert not _refused([[("a", "1")], [("a", "2")]])  # once per row is fine


def test_entries_outside_the_column_or_under_a_null_map_are_not_written():
    # the null map's entries hold a pair of their own (Arrow allows it), never written
    col = pa.MapArray.from_arrays(pa.array([0, 1, 2, 3, 4], pa.int32()),
                                  pa.array(["pad", "a", "hidden", "b"]),
                                  pa.array(["\x01", "1", "x", "2"]),
                                  mask=pa.array([False, False, True, False])).slice(1)
    pairs = user_property_pairs(pa.table({"properties": col}))
    joined = join_properties(pairs)
    assert joined.to_arrow().to_pylist() == [b"a\x011\x02", b"", b"b\x012\x02"]


def _unchanged_by_single_sends(value) -> bool:
    try:
        return value is None or (keys_value(value) or "") == value
    except InvalidMessageError:
        return False


_keys_text = st.text(st.sampled_from(list("ab \t\x01\x02\x03é\u3000\u00a0\x7f")), max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | _keys_text, min_size=1, max_size=20))
@example(["a  b", " a", "a ", "a\tb", "\u3000", "é  b", "a\x7fb", "ok b", ""])
def test_plain_keys_never_passes_what_single_sends_would_change_or_refuse(values):
    verdict = plain_keys(pa.array(values, pa.string()))
    for value, v in zip(values, verdict.tolist()):
        if v == 0:
            assert _unchanged_by_single_sends(value), value
        if value is not None and value.isascii() and _unchanged_by_single_sends(value) \
                and all(32 < ord(c) < 127 or c == " " for c in value):
            assert v == 0, value  # plain ASCII keys take the fast path
        if value is not None and not value.isascii() and v != 2:
            assert v == 1, value
