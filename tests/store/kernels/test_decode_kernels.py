"""The compiled gather of bodies and property columns (store.kernels.message_decode) against
the NumPy reference path of store.core.arrow_decode, on raw properties strings."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import MessageStore
from store.core import arrow_decode
from store.core.arrow_decode import read_queue_batch
from store.formats import record_codec as codec
from store.formats.arrow_properties import NAME_LOOKUP
from store.formats.record_codec import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, RecordSpec
from store.kernels import message_decode as decode_kernels
from store.base.jit import FALLBACK_MAX_WORK

# names: user ones, the special ones, other system names, and look-alikes of them
_names = st.sampled_from(["p", "order", "UNIQ_KEY", "TAGS", "KEYS", "__RMQ_DELIVER_MS",
                          "__transactionId__", "TAG", "KEYZ", "UNIQ_KEX", "", "é",
                          *NAME_LOOKUP[5:9]])
_values = st.one_of(st.text(st.sampled_from("ab 7\u00e9\x00\x01"), max_size=12),
                    st.from_regex(r"[0-9]{1,17}", fullmatch=True), st.just("+12"), st.just(" 5"))
_pair = st.tuples(_names, _values).map(lambda nv: f"{nv[0]}\x01{nv[1]}".encode())
_raw = st.one_of(
    st.lists(_pair, max_size=6).map(lambda ps: b"\x02".join(ps) + b"\x02"),
    st.lists(_pair, min_size=1, max_size=6).map(lambda ps: b"\x02".join(ps)),  # no last 0x02
    st.binary(max_size=40),  # anything at all: not UTF-8, separators anywhere
)
_record = st.tuples(st.binary(max_size=300), _raw, st.booleans())


def _decode(store, start, end, columns=None, *, reference):
    if reference:
        real = arrow_decode._gather
        arrow_decode._gather = lambda *args: None
        try:
            return _read(store, start, end, columns)
        finally:
            arrow_decode._gather = real
    return _read(store, start, end, columns)


def _read(store, start, end, columns):
    try:
        return read_queue_batch(store, "orders", 0, start, end, columns=columns)
    except Exception as exc:  # noqa: BLE001 - the same error both ways
        return type(exc), str(exc)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(records=st.lists(_record, min_size=1, max_size=30), data=st.data())
def test_the_compiled_gather_equals_the_reference_path(fresh_dir, small_config, monkeypatch,
                                                       records, data):
    raws = iter([raw for _, raw, _ in records])
    monkeypatch.setattr(codec, "encode_properties", lambda properties: next(raws))
    with MessageStore.open(str(fresh_dir("gather") / "s"), small_config) as store:
        store.append([RecordSpec("orders", body, {}, queue_id=0, sys_flag=(
            TRANSACTION_COMMIT_TYPE if commit else TRANSACTION_NOT_TYPE))
            for body, _, commit in records])
        end = store.max_offset("orders", 0)
        start = data.draw(st.integers(0, end - 1), label="start")
        columns = data.draw(st.sampled_from([None, ["body", "keys"], ["topic", "body"],
                                             ["properties", "transaction_id", "msg_id"]]),
                            label="columns")
        got = _decode(store, start, end, columns, reference=False)
        expected = _decode(store, start, end, columns, reference=True)
        if isinstance(expected, pa.RecordBatch):
            assert isinstance(got, pa.RecordBatch) and got.equals(expected), (
                got.to_pylist() if isinstance(got, pa.RecordBatch) else got,
                expected.to_pylist())
        else:
            assert got == expected


def test_the_gather_takes_the_usual_records_and_leaves_odd_ones(store, monkeypatch):
    """Ordinary records are read by the compiled gather; a deliver time with a sign, or a
    value that is not UTF-8, sends the block to the reference path (same rows)."""
    calls = []
    real = decode_kernels.gather_messages

    def spy(*args, **kwargs):
        row, out = real(*args, **kwargs)
        calls.append(row)
        return row, out

    monkeypatch.setattr(arrow_decode, "gather_messages", spy)
    specs = [RecordSpec("orders", b"b%d" % i, {"UNIQ_KEY": f"ID{i}", "TAGS": "t",
                                                 "KEYS": "k1 k2", "u": "v"}, queue_id=0)
             for i in range(3)]
    store.append(specs)
    batch = read_queue_batch(store, "orders", 0, 0, 3)
    assert calls == [-1]
    assert batch.column("keys").to_pylist() == [["k1", "k2"]] * 3
    assert batch.column("msg_id").to_pylist() == ["ID0", "ID1", "ID2"]
    store.append([RecordSpec("orders", b"x", {"__RMQ_DELIVER_MS": "+5"}, queue_id=0)])
    with pytest.raises(Exception) as compiled:
        read_queue_batch(store, "orders", 0, 0, 4)
    assert calls[-1] == 3  # the fourth row left to the reference path, which refuses it
    assert "__RMQ_DELIVER_MS" in str(compiled.value) or "allowed" in str(compiled.value)


@pytest.mark.parametrize("rows", [FALLBACK_MAX_WORK, FALLBACK_MAX_WORK + 1])
def test_large_and_small_blocks_decode_alike(store, rows):
    """A block small enough for the Python run of the loop, and one that takes the compiled
    loop: the same columns as the reference path."""
    store.append([RecordSpec("orders", b"body-%d" % i, {"UNIQ_KEY": f"U{i}", "KEYS": f"k{i} x",
                                                         "n": str(i)}, queue_id=0)
                  for i in range(rows)])
    got = _decode(store, 0, rows, reference=False)
    assert got.equals(_decode(store, 0, rows, reference=True))


def test_a_large_read_never_waits_for_the_compiled_loops(store, monkeypatch):
    """Before the compiled loops are loaded, a block too large for their Python run goes to
    the NumPy path and the loops are asked of the background thread: numba is never
    imported, loaded or compiled on the read's path."""
    from store.base import jit

    kernels = decode_kernels._KERNELS
    asked = []
    monkeypatch.setattr(kernels, "_ready", {name: set() for name in kernels._ready})
    monkeypatch.setattr(kernels, "_asked", set())
    monkeypatch.setattr(jit._COMPILER, "submit", lambda kset, name, key: asked.append(name))
    monkeypatch.setattr(kernels, "dispatchers", lambda: pytest.fail("the read waited for numba"))
    rows = FALLBACK_MAX_WORK + 100
    store.append([RecordSpec("orders", b"b%d" % i, {"KEYS": f"k{i}"}, queue_id=0)
                  for i in range(rows)])
    got = _decode(store, 0, rows, reference=False)
    assert got.equals(_decode(store, 0, rows, reference=True))
    assert sorted(set(asked)) == ["_check_records", "_gather_messages"]
