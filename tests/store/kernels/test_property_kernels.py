"""The compiled property kernels against plain-Python models (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from store.formats.record_codec import encode_properties
from store.kernels.property_scan import (
    distinct_values,
    format_int_pairs,
    hash_ranges,
    parse_int_ranges,
    scan_properties,
    strip_pairs,
    take_rows,
)
from store.formats.byte_columns import ByteColumn, ByteSlices

NAMES = ["A", "KEYS", "TAGS", "REAL_TOPIC", "TIMER_OUT_MS", "X" * 20, "é"]
names = st.sampled_from(NAMES)
values = st.text(st.characters(blacklist_characters="\x00\x01\x02",
                               blacklist_categories=("Cs",)), max_size=12)
rows = st.lists(st.lists(st.tuples(names, values), max_size=8), min_size=1, max_size=30)


def encode_row(pairs, last_separator: bool = True) -> bytes:
    """Properties with repeated names kept (a dict would merge them); RocketMQ leaves the
    last pair's separator out."""
    row = b"".join(k.encode() + b"\x01" + v.encode() + b"\x02" for k, v in pairs)
    return row if last_separator or not row else row[:-1]


def model_last_non_empty(pairs, name):
    found = [v for k, v in pairs if k == name and v]
    return found[-1].encode() if found else None


@settings(max_examples=60, deadline=None)
@given(rows, st.booleans())
def test_scan_finds_the_last_non_empty_value_of_each_name(data, last_separator):
    col = ByteColumn.of([encode_row(r, last_separator) for r in data])
    found, v0, v1 = scan_properties(col, NAMES)
    for i, pairs in enumerate(data):
        for k, name in enumerate(NAMES):
            want = model_last_non_empty(pairs, name)
            assert bool(found[k, i]) == (want is not None)
            if want is not None:
                assert col.data[v0[k, i]:v1[k, i]].tobytes() == want


@settings(max_examples=60, deadline=None)
@given(rows, st.data())
def test_strip_drops_exactly_the_chosen_pairs(data, draw):
    col = ByteColumn.of([encode_row(r) for r in data])
    drop = np.array([[draw.draw(st.booleans()) for _ in data] for _ in NAMES])
    out = strip_pairs(col, NAMES, drop)
    for i, pairs in enumerate(data):
        kept = [(k, v) for k, v in pairs if not drop[NAMES.index(k), i]]
        assert out.data[out.offsets[i]:out.offsets[i + 1]].tobytes() == encode_row(kept)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.integers(-2**63 + 1, 2**63 - 1),
                                   st.sampled_from([0, -5, 7, 10**12])),  # runs repeat values
                         min_size=3, max_size=3), min_size=1, max_size=20), st.data())
def test_format_writes_each_present_pair_in_decimal(matrix, draw):
    values = np.array(matrix, dtype=np.int64).T
    present = np.array([[draw.draw(st.booleans()) for _ in matrix] for _ in range(3)])
    out = format_int_pairs(["a", "bb", "ccc"], values, present)
    for i in range(len(matrix)):
        want = {k: str(int(values[j, i])) for j, k in enumerate(["a", "bb", "ccc"])
                if present[j, i]}
        got = out.data[out.offsets[i]:out.offsets[i + 1]].tobytes()
        assert got == encode_properties(want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(-2**63 + 1, 2**63 - 1).map(str),
                          st.text("0123456789-x ", max_size=21)), min_size=1, max_size=30))
def test_parse_accepts_exactly_the_decimal_int64s(texts):
    col = ByteColumn.of([t.encode() for t in texts])
    value, ok = parse_int_ranges(col.data, col.starts, col.ends)
    for t, v, good in zip(texts, value.tolist(), ok.tolist()):
        try:
            want = int(t) if t.lstrip("-").isdigit() and t.count("-") <= 1 else None
        except ValueError:
            want = None
        if want is not None and not (-2**63 < want < 2**63) or len(t.lstrip("-")) > 19:
            want = None
        assert good == (want is not None), t
        if good:
            assert v == want


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.lists(st.binary(max_size=6), min_size=1, max_size=40),
                 st.lists(st.binary(min_size=2, max_size=3), min_size=30, max_size=200)))
def test_distinct_values_groups_equal_bytes(items):  # few values (one pass) and many (hash)
    col = ByteColumn.of(items)
    values, inverse = distinct_values(col.data, col.starts, col.ends)
    assert sorted(values) == sorted(set(items))
    assert [values[j] for j in inverse.tolist()] == items


def test_distinct_values_survive_a_hash_collision(monkeypatch):
    import store.kernels.property_scan as pk

    monkeypatch.setattr(pk, "_FEW", 1)  # past the one-pass table
    monkeypatch.setattr(pk, "hash_ranges",
                        lambda data, a, b: np.zeros(len(a), dtype=np.uint64))
    col = ByteColumn.of([b"a", b"b", b"a", b"c"])
    values, inverse = pk.distinct_values(col.data, col.starts, col.ends)
    assert [values[j] for j in inverse.tolist()] == [b"a", b"b", b"a", b"c"]


def test_hash_differs_for_different_bytes_and_matches_for_equal():
    col = ByteColumn.of([b"topic-a", b"topic-b", b"topic-a", b""])
    h = hash_ranges(col.data, col.starts, col.ends)
    assert h[0] == h[2] and len({int(h[0]), int(h[1]), int(h[3])}) == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=20), min_size=1, max_size=20), st.data())
def test_take_picks_the_chosen_rows(items, draw):
    blob = b"".join(items)
    raw = np.frombuffer(blob, dtype=np.uint8)
    lengths = np.array([len(x) for x in items], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    pick = np.array(draw.draw(st.lists(st.integers(0, len(items) - 1), max_size=10)),
                    dtype=np.int64)
    taken = take_rows(ByteSlices(raw, starts, starts + lengths), pick)
    assert [taken.data[a:b].tobytes() for a, b in zip(taken.starts, taken.ends)] == \
        [items[i] for i in pick.tolist()]


def test_scan_reads_a_last_pair_without_its_separator_as_rocketmq_writes_it():
    col = ByteColumn.of([b"A\x011\x02TAGS\x01t", b"TAGS\x01x\x02", b"A\x011\x02TAGS"])
    found, v0, v1 = scan_properties(col, ["A", "TAGS"])
    assert found[0].tolist() == [True, False, True]
    assert found[1].tolist() == [True, True, False]  # row 2: a name without a value
    assert col.data[v0[1, 0]:v1[1, 0]].tobytes() == b"t"
    assert col.data[v0[1, 1]:v1[1, 1]].tobytes() == b"x"
