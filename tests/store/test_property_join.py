"""store.property_join against simple Python models: the properties strings of whole tables
and the plain-keys check."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from store.errors import InvalidMessageError
from store.message import keys_value
from store.property_join import join_properties, plain_keys
from store.record_kernels import ByteColumn

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _model(user: bytes, tag, keys, msg_id: bytes) -> bytes:
    out = user
    if tag is not None:
        out += b"TAGS\x01" + tag.encode() + b"\x02"
    if keys:
        out += b"KEYS\x01" + keys.encode() + b"\x02"
    return out + b"UNIQ_KEY\x01" + msg_id + b"\x02"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=20), st.none() | _text, st.none() | _text),
                min_size=1, max_size=30),
       st.booleans(), st.booleans(), st.integers(0, 3), st.booleans())
def test_rows_are_the_parts_in_order(rows, with_tags, with_keys, chunk_at, sliced):
    n = len(rows)
    users = ByteColumn.of([u for u, _, _ in rows])
    tags = pa.array([t for _, t, _ in rows], pa.string()) if with_tags else None
    keys = pa.array([k for _, _, k in rows], pa.string()) if with_keys else None
    if keys is not None and sliced:  # an array that starts inside its buffers
        keys = pa.concat_arrays([pa.array(["pad"], pa.string()), keys]).slice(1)
    if tags is not None and 0 < chunk_at < n:
        tags = pa.chunked_array([tags.slice(0, chunk_at), tags.slice(chunk_at)])
    ids = np.frombuffer(b"".join(b"%032X" % (i * 7919) for i in range(n)), np.uint8)
    got = join_properties(users, tags, keys, ids.reshape(n, 32))
    for i, (user, tag, key) in enumerate(rows):
        expected = _model(user, tag if with_tags else None, key if with_keys else None,
                          b"%032X" % (i * 7919))
        assert got.data[got.offsets[i]:got.offsets[i + 1]].tobytes() == expected
    assert got.offsets[-1] == len(got.data)


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
