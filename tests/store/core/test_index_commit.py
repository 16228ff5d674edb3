"""Index commits (:mod:`store.core.index_commit`): staged records become visible by a marker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import MessageStore
from store.base.errors import CorruptRecordError
from store.core.index_commit import (INDEX_COMMIT_TOPIC, Marker, commit_staged,
                                     decode_marker, encode_marker)
from store.sink.staging import stage_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _bodies(store, topic):
    """Every body a reader of ``topic`` sees, queue by queue, in queue order."""
    if topic not in store.topics():
        return []
    out = []
    for q in store.queue_ids(topic):
        lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
        out += [v.body for v in store.pull(topic, q, lo, hi - lo + 1)]
    return out


def _arrow_bodies(store, topic):
    out = []
    for q in store.queue_ids(topic):
        lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
        if hi > lo:
            batch = store.read_arrow(topic, q, lo, hi)
            out += batch.column("body").to_pylist()
    return out


def _table(n, topic="orders", start=0, **extra):
    return pa.table({"topic": [topic] * n,
                     "body": [b"m%d" % i for i in range(start, start + n)], **extra})


def _commit(store, ranges):
    with store.write_lock():
        return commit_staged(store, ranges)


def test_staged_rows_are_invisible_until_the_marker_then_read_once(tmp_path, small_config,
                                                                  clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        ranges = stage_rows(store, _table(1500)).ranges
        assert len(ranges) > 1  # small segments: several ranges
        assert _bodies(store, "orders") == []
        store.producer("p").send_table(_table(5, start=1000))  # a writer meanwhile
        result = _commit(store, ranges)
        assert result.rows == 1500
        seen = _bodies(store, "orders")
        assert sorted(seen) == sorted([b"m%d" % i for i in range(1500)]
                                      + [b"m%d" % i for i in range(1000, 1005)])
        assert sorted(_arrow_bodies(store, "orders")) == sorted(seen)
        # the queue offsets a reader gets are the queue positions
        for q in store.queue_ids("orders"):
            views = store.pull("orders", q, 0, 10_000)
            assert [v.queue_offset for v in views] == list(range(len(views)))
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        assert sorted(_bodies(store, "orders")) == sorted(seen)


def test_rebuilt_queues_replay_markers(tmp_path, small_config, clock):
    path = str(tmp_path / "s")
    with MessageStore.open(path, small_config, clock=clock) as store:
        committed = stage_rows(store, _table(200)).ranges
        stage_rows(store, _table(50, start=500))  # never committed
        store.producer("p").send_table(_table(7, start=900))
        _commit(store, committed)
        before = _bodies(store, "orders")
        store.rebuild_queues()
        after = _bodies(store, "orders")
        assert after == before
        assert sorted(after) == sorted([b"m%d" % i for i in range(200)]
                                          + [b"m%d" % i for i in range(900, 907)])


def test_a_range_that_is_not_staged_is_refused(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.producer("p").send_table(_table(3))
        end = store.confirmed_offset()
        with pytest.raises(CorruptRecordError):
            _commit(store, [(0, end)])
        assert INDEX_COMMIT_TOPIC not in store.topics()


def test_marker_body_round_trip():
    marker = Marker([(0, 100), (4096, 5000)], [("a", 0), ("bé", 3)],
                    np.array([7, 0]), np.array([10, 2]))
    back = decode_marker(encode_marker(marker))
    assert back.ranges == marker.ranges and back.keys == marker.keys
    assert back.firsts.tolist() == [7, 0] and back.counts.tolist() == [10, 2]
    with pytest.raises(CorruptRecordError):
        decode_marker(encode_marker(marker)[:-1])


_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import pyarrow as pa
    from store import MessageStore, StoreConfig
    from store.core import index_commit
    from store.sink.staging import stage_rows
    from store.core.placed_commit import commit_placed, staged_runs
    path, where, how = sys.argv[1], sys.argv[2], sys.argv[3]
    store = MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=1 << 16))
    done = stage_rows(store, pa.table({{"topic": ["t"] * 400,
                                       "body": [b"r%d" % i for i in range(400)]}}))
    ranges = done.ranges
    if where == "staged":
        os.kill(os.getpid(), signal.SIGKILL)
    if where == "published":  # the marker is published, its entries not yet written
        index_commit._dispatch = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    if where == "half":  # half of the entries written
        real = index_commit._dispatch
        def half(core, offset, entries):
            key = sorted(entries)[0]
            first, units = entries[key]
            k = len(units) // 2
            core.dispatcher.dispatch({{key: (first, units[:k])}})
            os.kill(os.getpid(), signal.SIGKILL)
        index_commit._dispatch = half
    if where == "before-publish":
        real_after = store.appender.after_publish
        def die(marker, action):
            real_after(marker, action)
            os.kill(os.getpid(), signal.SIGKILL)
        store.appender.after_publish = die
    with store.write_lock():
        if how == "walk":
            index_commit.commit_staged(store, ranges)
        else:  # (from the stager's columns, no record read)
            commit_placed(store, staged_runs(done.columns, 1 << 16))
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("where,visible", [("staged", 0), ("before-publish", 0),
                                           ("published", 400), ("half", 400), ("done", 400)])
@pytest.mark.parametrize("how", ["walk", "placed"])
def test_sigkill_between_stage_commit_and_dispatch(tmp_path, where, visible, how):
    path = str(tmp_path / "s")
    proc = subprocess.run([sys.executable, "-c", _KILLER.format(root=ROOT), path, where, how],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    from store import StoreConfig
    with MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=1 << 16)) as store:
        seen = _bodies(store, "t")
        assert sorted(seen) == sorted(b"r%d" % i for i in range(visible))
        assert store.checkpoint.get("index_commit_pending") == 0
        # a rebuild agrees
        store.rebuild_queues()
        assert sorted(_bodies(store, "t")) == sorted(seen)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["stage", "send", "commit", "reopen"]),
                          st.integers(1, 40)), min_size=1, max_size=12))
def test_matches_a_model(tmp_path_factory, small_config, steps):
    """Stages, plain sends, commits of every range staged so far and reopens against a
    model: the visible rows are the sent ones and those of committed stages, in each
    queue's order of becoming visible."""
    path = str(tmp_path_factory.mktemp("m") / "s")
    store = MessageStore.open(path, small_config)
    model: list[bytes] = []
    pending: list[tuple[int, int]] = []
    staged_rows: list[bytes] = []
    n = 0
    try:
        for op, count in steps:
            bodies = [b"x%d" % (n + i) for i in range(count)]
            n += count
            table = pa.table({"topic": ["t"] * count, "body": bodies,
                              "queue_id": pa.array([0] * count, pa.int32())})
            if op == "stage":
                pending += stage_rows(store, table).ranges
                staged_rows += bodies
            elif op == "send":
                store.producer("p").send_table(table)
                model += bodies
            elif op == "commit" and pending:
                _commit(store, pending)
                model += staged_rows
                pending, staged_rows = [], []
            elif op == "reopen":
                store.close()
                store = MessageStore.open(path, small_config)
            assert _bodies(store, "t") == model
    finally:
        store.close()
