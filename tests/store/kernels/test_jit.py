"""store.base.jit: the Python versions of the compiled loops give the compiled loops' results byte
for byte, small batches never wait for numba, and a fresh install delivers on time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from store import Message, MessageStore

from store.base import jit
from tests.conftest import SMALL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _copy(a):
    return a.copy() if isinstance(a, np.ndarray) else a


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


@pytest.fixture
def shadowed(monkeypatch):
    """Every kernel call runs twice: compiled on its arguments, as Python on copies of them;
    the results and every array argument afterwards must be equal.  Yields the calls seen."""
    seen: list[tuple[str, str]] = []
    original = jit.KernelSet.run

    def run(self, name, work, args):
        copies = tuple(map(_copy, args))
        python_args, back = jit._python_args(copies)
        with np.errstate(all="ignore"):
            expected = self._python[name](*python_args)
        for array, wide in back:
            array[...] = wide
        got = self.dispatchers()[name](*args)
        assert _same(got, expected), f"{self.module}.{name}: {got!r} != {expected!r}"
        for k, (a, c) in enumerate(zip(args, copies)):
            if isinstance(a, np.ndarray):
                assert np.array_equal(a, c), f"{self.module}.{name}: argument {k} differs"
        seen.append((self.module, name))
        return got

    monkeypatch.setattr(jit.KernelSet, "run", run)
    yield seen
    monkeypatch.setattr(jit.KernelSet, "run", original)


_text = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_characters="|",
                              blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cf")), max_size=12)
_rows = st.lists(st.tuples(st.binary(min_size=1, max_size=300), _text, _text,
                           st.dictionaries(st.sampled_from(["a", "bb", "order", "ÿ"]),
                                           st.from_regex(r"[0-9a-z-]{1,24}", fullmatch=True),
                                           max_size=3),
                           st.sampled_from([None, 0, 500, 1500]),
                           st.sampled_from([None, 1, 2])),
                 min_size=1, max_size=40)


# no shrinking: an example takes tens of ms, a shrink of a failure minutes
@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_rows)
def test_python_loops_equal_the_compiled_ones(fresh_dir, shadowed, rows):
    """Sends (single, batch, table), delivery of both delay kinds, reads with CRC checks and a
    CommitLog walk: each kernel call is checked both ways."""
    path = fresh_dir("shadow") / "s"
    now = [1_700_000_000_000]
    with MessageStore.open(path, SMALL, clock=lambda: now[0], flush_service=False) as store:
        producer = store.producer("g")
        producer.send(Message("t", b"timer", properties={"n": "1"}), delay_ms=1500)
        for body, tags, keys, props, delay_ms, level in rows[:5]:
            m = Message("t", body, tags=tags or None, keys=keys or None, properties=props)
            producer.send(m, delay_ms=delay_ms or None) if level is None else \
                producer.send(m, delay_level=level)
        producer.send_batch([Message("t", body, tags=tags or None, properties=props)
                             for body, tags, _, props, _, _ in rows])
        producer.send_table(pa.table({
            "topic": ["t", "u"] * (len(rows) // 2) + ["t"] * (len(rows) % 2),
            "body": [r[0] for r in rows], "tags": pa.array([r[1] or None for r in rows], pa.string()),
            "keys": pa.array([r[2] or None for r in rows], pa.string()),
            "delay_ms": pa.array([r[4] for r in rows], pa.int64())}))
        now[0] += 400
        store.deliver_due()  # level 1 and the 500 ms ones not due yet
    with MessageStore.open(path, SMALL, clock=lambda: now[0], flush_service=False) as store:
        for _ in range(3):  # the wheel's slots walked from the timer log's files
            now[0] += 2_000
            store.deliver_due()
        for topic in store.topics():
            for q in store.queue_ids(topic):
                for verify_crc in (True, False):
                    store.read_arrow(topic, q, store.min_offset(topic, q),
                                     store.max_offset(topic, q), verify_crc=verify_crc)
        assert store.verify_commitlog().ok
    names = {name for _, name in shadowed}
    assert {"_assemble_records", "_body_crcs", "_walk_records", "_fill_ids", "_walk_file",
            "_scan_properties", "_format_int_pairs", "_parse_int_ranges",
            "_gather_messages", "_check_records"} <= names


def test_small_calls_run_as_python_until_the_compiled_loop_is_in(monkeypatch, tmp_path):
    """A call of at most FALLBACK_MAX_WORK units never waits for numba: before the set's
    signature is compiled it runs the Python loop and asks the background compiler."""
    module = tmp_path / "jit_probe.py"
    module.write_text(textwrap.dedent("""
        def _double(a, out):
            for i in range(len(a)):
                out[i] = 2 * a[i]
    """))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    ns = {"__name__": "jit_probe", "np": np}
    exec(compile(module.read_text(), str(module), "exec"), ns)
    kset = jit.kernel_set(ns, kernels=("_double",))
    submitted = []
    monkeypatch.setattr(jit._COMPILER, "submit", lambda *args: submitted.append(args))
    a = np.arange(5, dtype=np.int32)
    out = np.zeros(5, np.int64)
    kset(5)["_double"](a, out)
    assert out.tolist() == [0, 2, 4, 6, 8]
    assert not kset.loaded  # numba not touched by this set
    assert len(submitted) == 1 and submitted[0][1] == "_double"
    kset(5)["_double"](a, out)  # asked once per signature
    assert len(submitted) == 1
    kset.compile_signature(*submitted[0][1:])
    assert kset.ready() and kset.loaded
    big = np.arange(jit.FALLBACK_MAX_WORK + 1, dtype=np.int32)
    out = np.zeros(len(big), np.int64)
    kset(len(big))["_double"](big, out)  # large: compiled here
    assert (out == 2 * big).all()
    assert len(kset._dispatchers["_double"].overloads) == 1  # the warmed signature served


_FRESH = """
import json, sys, time
t0 = time.monotonic()
from store import Message, MessageStore, StoreConfig
path = sys.argv[1]
with MessageStore.open(path, StoreConfig(timer_precision_ms=1000)) as store:
    producer = store.producer("g")
    sent = {}
    for i in range(200):
        r = producer.send(Message("t", b"m%d" % i), delay_level=1)  # due in 1 s
        sent[r.msg_id] = time.time() * 1000 + 1000
    first = time.monotonic() - t0
    seen = {}
    end = time.monotonic() + 3.5
    while time.monotonic() < end and len(seen) < 200:
        store.deliver_due()
        now = time.time() * 1000
        for q in store.queue_ids("t"):
            for m in store.pull("t", q, 0, 1000):
                seen.setdefault(m.msg_id, now)
        time.sleep(0.05)
print(json.dumps({"late": [seen[k] - sent[k] for k in seen], "count": len(seen), "start": first}))
"""


@pytest.mark.slow
def test_a_fresh_install_delivers_level_1_messages_on_time(tmp_path):
    """numba's cache empty (a fresh install): 200 level-1 messages sent in the first second
    of a process are in their topic within the precision + 200 ms of due."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "s")], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    result = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert result["count"] == 200, out.stderr[-2000:]
    assert max(result["late"]) <= 1000 + 200, sorted(result["late"])[-5:]


@pytest.mark.slow
def test_serve_on_a_fresh_install_delivers_overdue_messages_at_once(tmp_path):
    """`rmq serve` started with numba's cache empty on a store holding overdue messages:
    they are delivered as soon as it is up, while it still compiles in the background, and
    messages sent once it is attached, due 1.5 s later, are in their topic within the
    precision + 200 ms of due (the compile takes several seconds here)."""
    from store import server_status

    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        producer = store.producer("g")
        for i in range(100):
            producer.send(Message("t", b"o%d" % i), delay_ms=1)  # overdue at the start
    time.sleep(0.01)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), PYTHONPATH=ROOT)
    cli = [sys.executable, "-c", "from rmq_cli.cli import main; main()"]
    server = subprocess.Popen(cli + ["serve", "--store", path], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ((st := server_status(path) or {}).get("attached") and "warming" in st):
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        attached = time.time() * 1000
        warming = st["warming"]
        with MessageStore.open(path) as store:  # due 1.5 s from now
            producer = store.producer("g")
            due_ms = time.time() * 1000 + 1500
            for i in range(100):
                producer.send(Message("t", b"d%d" % i), deliver_at_ms=int(due_ms))
        seen: dict[bytes, float] = {}
        end = time.monotonic() + 20
        while time.monotonic() < end and len(seen) < 200:
            with MessageStore.open(path, read_only=True) as reader:
                now = time.time() * 1000
                for q in reader.queue_ids("t") if "t" in reader.topics() else ():
                    for m in reader.pull("t", q, 0, 1000):
                        seen.setdefault(m.body, now)
            time.sleep(0.02)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert len(seen) == 200
    assert warming  # it served while its compiled loops were still loading
    overdue = max(t - attached for b, t in seen.items() if b.startswith(b"o"))
    late = max(t - due_ms for b, t in seen.items() if b.startswith(b"d"))
    assert overdue <= 1000 + 200, overdue
    assert late <= 1000 + 200, late
