"""The exactly-once sink (:mod:`store.sink.sink`): staging, commit, replays, aborts, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import (
    InvalidDelayError,
    InvalidMessageError,
    InvalidTopicError,
    LocalTransactionState,
    MessageStore,
    MessageTooLargeError,
    SinkCommitError,
    StoreConfig,
    TransactionStateError,
)

PROPS = pa.map_(pa.string(), pa.string())
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _visible(store, topic):
    """Every message of ``topic`` a reader sees: (body, tags, keys, properties)."""
    if topic not in store.topics():
        return []
    out = []
    for q in store.queue_ids(topic):
        for v in store.pull(topic, q, store.min_offset(topic, q), 100_000):
            out.append((v.body, v.tags, tuple(v.keys), dict(v.properties)))
    return sorted(out, key=repr)


def _table(n, topic="orders", **extra):
    return pa.table({"topic": [topic] * n, "body": [b"m%d" % i for i in range(n)], **extra})


@pytest.mark.parametrize("commit", ["index", "copy"])
def test_rows_invisible_until_commit_then_all_at_once(tmp_path, small_config, clock, commit):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("job-1", commit=commit)
        first = sink.stage(_table(300))
        second = sink.stage(_table(200, topic="payments"))
        if commit == "copy":
            assert len(first) > 1  # several halves: 64 KiB segments bound a half
        else:
            assert len(first) == 1  # one stage note per stage
        assert _visible(store, "orders") == [] and _visible(store, "payments") == []
        assert store.pending_transaction_stats()["pending"] == len(first) + len(second)
        result = sink.commit(0, first + second)
        assert (result.rows, result.halves, result.rolled_back, result.replayed) == (
            500, len(first) + len(second), 0, False)
        assert len(_visible(store, "orders")) == 300 and len(_visible(store, "payments")) == 200
        assert store.pending_transaction_stats()["pending"] == 0
        assert sink.committed_batches()[0]["transactions"] == first + second
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        assert len(_visible(store, "orders")) == 300  # durable across a reopen


def test_same_messages_as_send_table(tmp_path, small_config, clock):
    table = pa.table({
        "topic": ["a", "b", "a", "a"], "body": [b"1", b"2", b"3", "4".encode()],
        "tags": ["t", None, "u", "t"],
        "keys": pa.array([["k1", "k2"], None, ["k3"], []], pa.list_(pa.string())),
        "properties": pa.array([[("x", "1")], None, [("ü", "✓"), ("y", "z")], []], PROPS)})
    with MessageStore.open(str(tmp_path / "t"), small_config, clock=clock) as store:
        store.producer().send_table(table)
        expected = {t: _strip(_visible(store, t)) for t in ("a", "b")}
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("x")
        sink.commit(7, sink.stage(table))
        assert {t: _strip(_visible(store, t)) for t in ("a", "b")} == expected


def test_a_large_commit_puts_each_chunk_in_the_next_queue(tmp_path, clock, monkeypatch):
    """A commit group of many chunks: each chunk of CHUNK_ROWS rows of a topic lands in one
    queue, the next of the round robin, in order (as send_table)."""
    import store.sink.sink as sink_module
    from store.produce.table_producer import CHUNK_ROWS

    monkeypatch.setattr(sink_module, "COMMIT_GROUP_ROWS", 1 << 20)  # every half in one group
    n = 9 * CHUNK_ROWS + 5
    config = StoreConfig(commitlog_file_size_bytes=1 << 20, default_queue_count=3)
    with MessageStore.open(str(tmp_path / "s"), config, clock=clock) as store:
        sink = store.sink("x")
        sink.commit(0, sink.stage(pa.table({"topic": ["a"] * n,
                                            "body": [b"%d" % i for i in range(n)]})))
        where = {}
        for q in store.queue_ids("a"):
            for v in store.pull("a", q, 0, 2 * n):
                where[int(v.body)] = (q, v.queue_offset)
        assert sorted(where) == list(range(n))
        first = where[0][0]
        for i in range(n):
            assert where[i][0] == (first + i // CHUNK_ROWS) % 3, i
        # each queue holds its chunks in row order
        assert all(where[i][1] < where[i + 1][1] for i in range(n - 1)
                   if where[i][0] == where[i + 1][0])


def _strip(rows):
    return [(b, t, k, {n: v for n, v in p.items() if n != "UNIQ_KEY"}) for b, t, k, p in rows]


def test_replayed_batch_adds_nothing_and_rolls_back_its_new_halves(tmp_path, small_config,
                                                                  clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("stream")
        assert sink.commit(0, sink.stage(_table(10))).rows == 10
        again = sink.stage(_table(10))  # Spark re-runs batch 0 after a failure
        result = sink.commit(0, again)
        assert (result.rows, result.replayed, result.rolled_back) == (0, True, len(again))
        assert sink.commit(0, again).rolled_back == 0  # and once more: nothing at all
        assert len(_visible(store, "orders")) == 10
        assert sink.open_halves() == []
        assert sink.commit(1, sink.stage(_table(5))).rows == 5
        assert len(_visible(store, "orders")) == 15


def test_failed_task_attempts_are_rolled_back_by_the_commit(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("stream")
        lost = sink.stage(_table(7))          # an attempt whose task failed: never listed
        kept = sink.stage(_table(3))
        other = store.sink("another-sink").stage(_table(4))
        result = sink.commit(0, kept)
        assert (result.rows, result.rolled_back) == (3, len(lost))
        assert len(_visible(store, "orders")) == 3
        # another sink's halves are left alone
        assert store.sink("another-sink").open_halves() == other
        assert store.sink("another-sink").abort() == len(other)
        assert store.pending_transaction_stats()["pending"] == 0


def test_commit_of_halves_no_longer_open_fails_and_writes_nothing(tmp_path, small_config,
                                                                 clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("stream")
        staged = sink.stage(_table(5))
        assert sink.abort() == len(staged)
        end = store.confirmed_offset()
        with pytest.raises(SinkCommitError, match=r"sink 'stream' batch 3: 1 of its 1 staged "
                                                  r"halves are no longer open"):
            sink.commit(3, staged)
        assert store.confirmed_offset() == end and sink.committed_batches() == {}
        with pytest.raises(SinkCommitError, match="no longer open"):
            sink.commit(3, ["SINK0000000000000000000000000000"])
        with pytest.raises(InvalidMessageError, match="batch id -1"):
            sink.commit(-1, [])
        with pytest.raises(InvalidMessageError, match="sink id ''"):
            store.sink("")


def test_bad_rows_are_refused_with_nothing_staged(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("s")
        end = store.confirmed_offset()
        cases = [
            (pa.table({"topic": ["a"]}), InvalidMessageError, "no body column"),
            (pa.table({"topic": ["a"], "body": [b"x"], "color": ["red"]}), InvalidMessageError,
             r"unknown column\(s\) \['color'\]"),
            (pa.table({"topic": ["a b"], "body": [b"x"]}), InvalidTopicError, "a b"),
            (pa.table({"topic": ["a", "a"], "body": [b"x", None]}), InvalidMessageError, "body"),
            (pa.table({"topic": ["a"], "body": [b"x"], "delay_ms": [5], "delay_level": [1]}),
             InvalidDelayError, "more than one"),
            (pa.table({"topic": ["a"], "body": [b"x" * (small_config.max_message_size_bytes
                                                        + 1)]}), MessageTooLargeError,
             "exceeds max_message_size_bytes"),
        ]
        for table, error, text in cases:
            with pytest.raises(error, match=text):
                sink.stage(table)
        assert store.confirmed_offset() == end and sink.open_halves() == []


def test_delayed_rows_are_due_from_when_they_were_staged(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("s")
        staged = sink.stage(pa.table({
            "topic": ["t"] * 3, "body": [b"timer", b"level", b"now"],
            "delay_ms": pa.array([10_000, None, None], pa.int64()),
            "delay_level": pa.array([None, 2, None], pa.int32())}))  # level 2: 5 s
        clock.advance(4_000)
        sink.commit(0, staged)
        assert [r[0] for r in _visible(store, "t")] == [b"now"]
        clock.advance(999)  # 4.999 s after staging: the level message is not due yet
        store.deliver_due()
        assert [r[0] for r in _visible(store, "t")] == [b"now"]
        clock.advance(1)
        store.deliver_due()
        assert sorted(r[0] for r in _visible(store, "t")) == [b"level", b"now"]
        clock.advance(4_900)
        store.deliver_due()
        assert len(_visible(store, "t")) == 2  # the timer row: 10 s from staging, not commit
        clock.advance(200)
        store.deliver_due()
        assert sorted(r[0] for r in _visible(store, "t")) == [b"level", b"now", b"timer"]


def test_check_loop_never_asks_users_and_user_commit_is_refused(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("s")
        staged = sink.stage(_table(3))
        asked = []
        clock.advance(3_600_000)
        result = store.check_transactions(lambda view: asked.append(view) or "COMMIT")
        assert asked == [] and result.checked == 0
        assert _visible(store, "orders") == [] and sink.open_halves() != []
        with pytest.raises(TransactionStateError, match=r"half of the rmq sink 's'; allowed: "
                                                        "ROLLBACK only"):
            store.end_transaction(sink.open_halves()[0], LocalTransactionState.COMMIT_MESSAGE)
        assert store.end_transaction(sink.open_halves()[0], "ROLLBACK")
        with pytest.raises(SinkCommitError):
            sink.commit(0, staged)
        assert _visible(store, "orders") == []


def test_check_loop_finishes_a_batch_whose_marker_exists(tmp_path, small_config, clock):
    """A commit torn after its marker (a reboot can keep part of a group): the check loop
    commits the listed halves still open, once."""
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("s")
        staged = sink.stage(_table(4))
        store.append([sink._marker_spec(0, staged, clock())])  # the marker alone survived
        clock.advance(3_600_000)
        store.check_transactions(lambda view: "ROLLBACK")
        assert len(_visible(store, "orders")) == 4 and sink.open_halves() == []
        store.check_transactions(lambda view: "ROLLBACK")
        assert sink.commit(0, staged).replayed and len(_visible(store, "orders")) == 4


def test_atomic_group_failure_leaves_nothing(tmp_path, small_config, clock):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        store.producer().send_table(_table(2, topic="before"))
        end = store.confirmed_offset()
        with pytest.raises(RuntimeError, match="boom"):
            with store.atomic_append():
                store.producer().send_table(_table(500, topic="inside"))
                raise RuntimeError("boom")
        assert store.confirmed_offset() == end
        assert _visible(store, "inside") == [] and len(_visible(store, "before")) == 2
        store.producer().send_table(_table(3, topic="after"))
        assert len(_visible(store, "after")) == 3 and _visible(store, "inside") == []


_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import pyarrow as pa
    import store.sink.sink as sk
    from store import MessageStore, StoreConfig
    from store.core.store_core import StoreCore
    sk.COMMIT_GROUP_ROWS = 4096  # several appends in the commit's group
    cfg = StoreConfig(commitlog_file_size_bytes=64 * 1024)
    s = MessageStore.open(sys.argv[1], cfg)
    sink = s.sink("k", commit=sys.argv[4])
    staged = sink.stage(pa.table({{"topic": ["t"] * 20000,
                                   "body": [b"x%d" % i for i in range(20000)]}}))
    open(sys.argv[2], "w").write("\\n".join(staged))
    calls = [0]
    # the commit's appends: copy, one per chunk of rows; index: the marker, the ops, the
    # index-commit marker
    name = "append_assembled" if sys.argv[4] == "copy" else "append"
    real = getattr(StoreCore, name)
    def dying(self, *a, **k):
        calls[0] += 1
        if calls[0] == int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *a, **k)
    setattr(StoreCore, name, dying)
    sink.commit(0, staged)
""")


@pytest.mark.parametrize("commit,die_at", [("copy", 1), ("copy", 3), ("index", 1),
                                           ("index", 3)])
def test_commit_killed_midway_shows_nothing_then_replays_once(tmp_path, commit, die_at):
    path, ids = str(tmp_path / "s"), str(tmp_path / "ids")
    proc = subprocess.run([sys.executable, "-c", _KILLER.format(root=ROOT), path, ids,
                           str(die_at), commit], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    staged = open(ids).read().split("\n")
    with MessageStore.open(path) as store:
        assert _visible(store, "t") == []       # nothing of the torn commit
        sink = store.sink("k")
        assert sorted(sink.open_halves()) == sorted(staged)
        assert sink.committed_batches() == {}
        assert sink.commit(0, staged).rows == 20000  # the replay after the restart
        assert len(_visible(store, "t")) == 20000
        assert sink.commit(0, staged).replayed
    with MessageStore.open(path) as store:
        assert len(_visible(store, "t")) == 20000


_DISPATCH_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import pyarrow as pa
    from store import MessageStore, StoreConfig
    from store.core import index_commit
    s = MessageStore.open(sys.argv[1], StoreConfig(commitlog_file_size_bytes=64 * 1024))
    sink = s.sink("k")
    staged = sink.stage(pa.table({{"topic": ["t"] * 5000,
                                   "body": [b"x%d" % i for i in range(5000)]}}))
    open(sys.argv[2], "w").write("\\n".join(staged))
    # the group is published (marker, ops, index-commit marker): die before the entries
    index_commit._dispatch = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    sink.commit(0, staged)
""")


def test_commit_killed_after_publishing_is_rolled_forward_once(tmp_path):
    path, ids = str(tmp_path / "s"), str(tmp_path / "ids")
    proc = subprocess.run([sys.executable, "-c", _DISPATCH_KILLER.format(root=ROOT), path,
                           ids], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    staged = open(ids).read().split("\n")
    with MessageStore.open(path) as store:
        assert len(_visible(store, "t")) == 5000  # rolled forward at the open
        sink = store.sink("k")
        assert sink.open_halves() == []
        again = sink.commit(0, staged)  # Spark replays the batch: nothing new
        assert again.replayed and again.rows == 0
        assert len(_visible(store, "t")) == 5000


_rows = st.lists(st.tuples(
    st.sampled_from(["a", "b"]), st.binary(min_size=1, max_size=40),
    st.one_of(st.none(), st.sampled_from(["x", "y"])),
    st.one_of(st.none(), st.lists(st.sampled_from(["k1", "k2", "k3"]), max_size=2)),
    st.dictionaries(st.sampled_from(["p", "q", "ü"]), st.text("abcü✓ ", min_size=1, max_size=5)
                    .filter(str.strip), max_size=2)), min_size=1, max_size=40)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_rows, min_size=1, max_size=4), replays=st.lists(st.booleans(),
                                                                        min_size=4, max_size=4))
def test_model_every_row_exactly_once(fresh_dir, batches, replays):
    """Against a model: every committed row once, whatever batches are replayed."""
    path = str(fresh_dir("model") / "s")
    expected = []
    with MessageStore.open(path) as store:
        sink = store.sink("m")
        for batch_id, rows in enumerate(batches):
            table = pa.table({
                "topic": [r[0] for r in rows], "body": [r[1] for r in rows],
                "tags": pa.array([r[2] for r in rows], pa.string()),
                "keys": pa.array([r[3] for r in rows], pa.list_(pa.string())),
                "properties": pa.array([list(r[4].items()) for r in rows], PROPS)})
            sink.commit(batch_id, sink.stage(table))
            if replays[batch_id]:
                sink.commit(batch_id, sink.stage(table))
            expected += [(r[0], r[1], r[2], tuple(r[3] or ()),
                          dict(r[4])) for r in rows]
        got = [(t, b, tg, k, {n: v for n, v in p.items() if n != "UNIQ_KEY"})
               for t in ("a", "b") for b, tg, k, p in _visible(store, t)]
        assert sorted(got, key=repr) == sorted(expected, key=repr)
        assert sink.open_halves() == []


def test_retention_keeps_the_staged_records_of_an_open_stage(tmp_path, small_config, clock):
    """The staged records lie before their stage note: retention keeps every segment from
    the first one an open note lists, and frees them once the batch committed."""
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("r")
        staged = sink.stage(_table(1500))  # over several 64 KiB segments
        store.producer("p").send_table(_table(1500, topic="other"))  # more segments after
        clock.advance(10 * 24 * 3600 * 1000)
        assert store.clean_expired_files(force=True) == 0
        assert sink.commit(0, staged).rows == 1500
        assert len(_visible(store, "orders")) == 1500
        assert store.clean_expired_files(force=True) > 0  # nothing keeps them any more


@pytest.mark.parametrize("commit", ["index", "copy"])
def test_keyed_rows_replace_their_keys_pending_message_when_committed(tmp_path, small_config,
                                                                      clock, commit):
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("keys", commit=commit)

        def keyed(body):
            return pa.table({"topic": ["t"], "body": [body], "key": ["a"],
                             "delay_ms": pa.array([10_000], pa.int64())})

        sink.commit(0, sink.stage(keyed(b"v1")))
        staged = sink.stage(keyed(b"v2"))
        clock.advance(10_500)
        store.deliver_due()  # v2 not committed: v1 is still the key's message
        assert [r[0] for r in _visible(store, "t")] == [b"v1"]
        sink.commit(1, staged)
        clock.advance(10_000)
        store.deliver_due()
        assert sorted(r[0] for r in _visible(store, "t")) == [b"v1", b"v2"]
        sink.commit(2, sink.stage(keyed(b"v3")))
        sink.commit(3, sink.stage(keyed(b"v4")))  # replaces v3 before it is due
        clock.advance(10_500)
        store.deliver_due()
        assert sorted(r[0] for r in _visible(store, "t")) == [b"v1", b"v2", b"v4"]


def test_a_query_by_key_finds_staged_rows_only_once_committed(tmp_path, small_config, clock):
    """The key index indexes every record it walks, staged ones too: a query shows a staged
    row only once a commit marker named it."""
    with MessageStore.open(str(tmp_path / "s"), small_config, clock=clock) as store:
        sink = store.sink("q")
        staged = sink.stage(pa.table({"topic": ["t"] * 3, "body": [b"a", b"b", b"c"],
                                      "keys": pa.array([["k1"], ["k2"], ["k1"]],
                                                       pa.list_(pa.string()))}))
        abandoned = store.sink("other").stage(pa.table({"topic": ["t"], "body": [b"z"],
                                                        "keys": [["k1"]]}))
        assert abandoned and store.query_messages("t", key="k1") == []
        sink.commit(0, staged)
        assert sorted(m.body for m in store.query_messages("t", key="k1")) == [b"a", b"c"]
