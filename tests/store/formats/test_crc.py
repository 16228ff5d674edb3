"""store.base.crc: the CRC32 of large buffers is zlib's, and bodies on both sides of the size
where the column path switches to it get CRCs every reader accepts."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import Message, MessageStore
from store.base import crc as crc_module
from store.base.crc import LARGE_BODY_BYTES, crc32


@given(st.binary(max_size=5000), st.integers(0, 4999))
def test_same_values_as_zlib_on_any_slice(data, cut):
    view = memoryview(data)[min(cut, len(data)):]
    assert crc32(view) == zlib.crc32(view)
    assert crc32(np.frombuffer(data, np.uint8)) == zlib.crc32(data)


def test_large_buffers_match_zlib():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (8 << 20) + 13, dtype=np.uint8)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)[5:]) == zlib.crc32(memoryview(data)[5:])


def test_the_hardware_crc_is_used_where_isal_is_installed():
    pytest.importorskip("isal")
    assert crc_module.HARDWARE_CRC and crc32 is not zlib.crc32


@pytest.mark.parametrize("size", [LARGE_BODY_BYTES - 1, LARGE_BODY_BYTES, 3 * LARGE_BODY_BYTES])
def test_column_path_crcs_on_both_sides_of_the_switch(tmp_path, small_config, clock, size):
    bodies = [bytes((i * 7 + k) % 256 for k in range(size + i)) for i in range(3)]
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as s:
        table = s.producer("g").send_table(pa.table({"topic": ["t"] * 3, "body": bodies}))
        single = s.producer("g").send(Message("t", bodies[0]))
        offsets = table.column("commitlog_offset").to_pylist() + [single.commitlog_offset]
        for off, body in zip(offsets, bodies + bodies[:1]):
            assert s.read_record(off).body_crc == zlib.crc32(body) & 0x7FFFFFFF
        assert s.verify_commitlog().ok


def _kernel_crcs(data: bytes, cuts: list) -> list:
    """The compiled kernels' CRCs (``scan_kernels.body_crcs``) of slices of ``data``."""
    from store.kernels.segment_walk import body_crcs

    buf = np.frombuffer(data, np.uint8)
    starts = np.array([min(a, b) for a, b in cuts], np.int64)
    ends = np.array([max(a, b) for a, b in cuts], np.int64)
    return body_crcs(buf, starts, ends).tolist()


_cuts = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), min_size=1, max_size=8)


@settings(deadline=None)  # the first example may compile the kernel
@given(st.binary(min_size=3000, max_size=3000), _cuts)
def test_the_kernels_crc_is_zlibs_on_any_slice(data, cuts):
    got = _kernel_crcs(data, cuts)
    assert got == [zlib.crc32(data[min(a, b):max(a, b)]) & 0x7FFFFFFF for a, b in cuts]


@settings(deadline=None)  # the first example compiles the loop
@given(st.binary(max_size=300))
def test_the_fallback_loop_function_is_zlibs(data):
    loop = crc_module.loop_function()
    assert loop(0, data, len(data)) == zlib.crc32(data)


def test_the_kernels_call_isal_where_installed():
    pytest.importorskip("isal")
    fn = crc_module.crc_function()
    assert fn is crc_module.crc_function()  # loaded once
    assert getattr(fn, "__name__", "") == "crc32_gzip_refl"


def test_records_written_and_verified_with_the_fallback_loop(tmp_path, small_config, clock,
                                                              monkeypatch):
    """Without isal the kernels take the compiled loop (and large bodies zlib first):
    records still carry zlib's CRC, the verifying walk accepts them, and the walk's own CRCs
    are zlib's."""
    from store.core import write_placement as record_writes

    monkeypatch.setattr(crc_module, "_function", [crc_module.loop_function()])
    monkeypatch.setattr(record_writes, "HARDWARE_CRC", False)  # large bodies: zlib first
    sizes = [40, 540, LARGE_BODY_BYTES - 1, LARGE_BODY_BYTES + 7]
    bodies = [bytes((i * 13 + k) % 256 for k in range(size)) for i, size in enumerate(sizes)]
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as s:
        table = s.producer("g").send_table(pa.table({"topic": ["t"] * 4, "body": bodies}))
        for off, body in zip(table.column("commitlog_offset").to_pylist(), bodies):
            assert s.read_record(off).body_crc == zlib.crc32(body) & 0x7FFFFFFF
        assert s.verify_commitlog().ok
    data = b"".join(bodies)
    cuts = [(0, 40), (40, 580), (7, len(data))]  # the compiled loop alone
    assert _kernel_crcs(data, cuts) == [zlib.crc32(data[a:b]) & 0x7FFFFFFF for a, b in cuts]


def test_the_zlib_callback_serves_until_the_loop_is_compiled(tmp_path, small_config, clock,
                                                            monkeypatch):
    """Without isal, before the background thread has the compiled loop, the kernels call
    zlib through a C callback: same CRCs, in the Python loops and the compiled ones."""
    monkeypatch.setattr(crc_module, "_function", [crc_module.c_function(crc_module._ZLIB_CALLBACK)])
    bodies = [bytes((i * 7 + k) % 256 for k in range(size)) for i, size in enumerate([3, 300])]
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as s:
        table = s.producer("g").send_table(pa.table({"topic": ["t"] * 2, "body": bodies}))
        for off, body in zip(table.column("commitlog_offset").to_pylist(), bodies):
            assert s.read_record(off).body_crc == zlib.crc32(body) & 0x7FFFFFFF
        assert s.verify_commitlog().ok


_CACHE_PROBE = """
import sys, tempfile
sys.path.insert(0, {root!r})
import pyarrow as pa
from store import MessageStore
from store.base import jit
from store.kernels import record_assembly as record_kernels
from store.kernels import segment_walk as scan_kernels
with MessageStore.open(tempfile.mkdtemp()) as s:
    s.producer("g").send_table(pa.table({{"topic": ["t"], "body": [b"x"]}}))
    assert s.verify_commitlog().ok
assert jit.wait_compiled(120)  # small calls: loaded in the background
for k in (record_kernels._kernels.dispatchers()["_assemble_records"],
          scan_kernels._KERNELS.dispatchers()["_walk_records"]):
    print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))
"""


def test_kernels_taking_the_crc_pointer_load_from_numbas_cache():
    """The CRC and memcpy functions reach the kernels as arguments, so a new process (a
    Spark worker) loads the compiled kernels from numba's cache instead of compiling them
    again; a pointer compiled in as a constant would make every process compile."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    code = _CACHE_PROBE.format(root=root)
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    for line in runs[1].stdout.split("\n")[:2]:  # the second process: all from the cache
        hits, misses = map(int, line.split())
        assert hits >= 1 and misses == 0, runs[1].stdout
