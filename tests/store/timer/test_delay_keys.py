"""Replace by key: a delay key names at most one pending timer message; a replacing send or a
cancel that returned means the old message never surfaces, across reopens, other processes,
a lost or damaged table, and SIGKILLs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from store import InvalidDelayError, InvalidMessageError, Message, MessageStore
from store.base.errors import InvalidBatchError
from store.formats.message import PROPERTY_DELAY_KEY
from store.timer.delay_key_table import MIN_CAPACITY, find_slots, place_new
from tests.conftest import SMALL

T0 = 1_790_000_000_000
TOPIC = "orders"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def delivered(store) -> list[tuple[bytes, str | None, int]]:
    """(body, delay key, deliver time) of every message of the topic."""
    out = []
    if TOPIC not in store.topics():
        return out
    for q in store.queue_ids(TOPIC):
        batch = store.read_arrow(TOPIC, q, 0, store.max_offset(TOPIC, q))
        for body, props, deliver in zip(batch.column("body").to_pylist(),
                                        batch.column("properties").to_pylist(),
                                        batch.column("deliver_timestamp").to_pylist()):
            out.append((body, dict(props).get(PROPERTY_DELAY_KEY),
                        None if deliver is None else int(deliver.timestamp() * 1000)))
    return out


@pytest.fixture
def keyed(store_path, clock):
    clock.set(T0)
    s = MessageStore.open(store_path, SMALL, clock=clock)
    yield s
    s.close()


def test_a_keyed_send_replaces_and_a_cancel_cancels(keyed, clock):
    p = keyed.producer()
    p.send(Message(TOPIC, b"first"), delay_ms=5_000, key="order-1")
    r = p.send(Message(TOPIC, b"second"), delay_ms=8_000, key="order-1")
    assert r.deliver_at_ms == T0 + 8_000
    p.send(Message(TOPIC, b"other"), delay_ms=5_000, key="order-2")
    p.send(Message(TOPIC, b"plain"), delay_ms=5_000)
    assert p.pending_keys(["order-1", "order-2", "order-3"]).tolist() == [True, True, False]
    assert p.cancel(key="order-2") is True
    assert p.cancel(key="order-2") is False  # nothing pending under it any more
    assert p.cancel(key="order-3") is False
    clock.set(T0 + 6_000)
    keyed.deliver_due()
    assert [(b, k) for b, k, _ in delivered(keyed)] == [(b"plain", None)]
    clock.set(T0 + 10_000)
    keyed.deliver_due()
    got = sorted(delivered(keyed))
    assert got == [(b"plain", None, T0 + 5_000), (b"second", "order-1", T0 + 8_000)]
    assert p.pending_keys(["order-1"]).tolist() == [False]
    assert p.cancel(key="order-1") is False  # delivered: nothing to cancel


def test_a_replace_after_the_due_time_but_before_the_delivery_still_replaces(keyed, clock):
    p = keyed.producer()
    p.send(Message(TOPIC, b"old"), delay_ms=1_000, key="k")
    clock.set(T0 + 5_000)  # due, not delivered yet (no delivery ran)
    p.send(Message(TOPIC, b"new"), delay_ms=1_000, key="k")
    clock.set(T0 + 7_000)
    keyed.deliver_due()
    assert [b for b, _, _ in delivered(keyed)] == [b"new"]


def test_keyed_message_due_now_goes_through_the_timer(keyed, clock):
    p = keyed.producer()
    p.send(Message(TOPIC, b"later"), delay_ms=60_000, key="k")
    r = p.send(Message(TOPIC, b"now"), delay_ms=0, key="k")
    assert r.stored_topic is not None and r.deliver_at_ms == T0 + 1
    r = p.send(Message(TOPIC, b"past"), deliver_at_ms=T0 - 10, key="j")
    assert r.stored_topic is not None
    clock.set(T0 + 2_000)
    keyed.deliver_due()
    assert sorted(b for b, _, _ in delivered(keyed)) == [b"now", b"past"]
    clock.set(T0 + 120_000)
    keyed.deliver_due()
    assert sorted(b for b, _, _ in delivered(keyed)) == [b"now", b"past"]


def test_replace_survives_reopen_and_a_lost_or_damaged_table(store_path, clock):
    clock.set(T0)
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        p = s.producer()
        p.send(Message(TOPIC, b"a1"), delay_ms=5_000, key="a")
        p.send(Message(TOPIC, b"b1"), delay_ms=5_000, key="b")
    table = os.path.join(store_path, "timerkeys")
    with open(table, "r+b") as fh:  # a damaged table: rebuilt from the timer topic
        fh.write(b"garbage!" * 8)
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        p = s.producer()
        p.send(Message(TOPIC, b"a2"), delay_ms=6_000, key="a")
        assert p.cancel(key="b") is True
    assert any(n.startswith("timerkeys.damaged-") for n in os.listdir(store_path))
    os.remove(table)  # lost: the next keyed send scans the whole timer topic again
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        s.producer().send(Message(TOPIC, b"c1"), delay_ms=7_000, key="c")
    clock.set(T0 + 10_000)
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        s.deliver_due()
        assert sorted(b for b, _, _ in delivered(s)) == [b"a2", b"c1"]


def test_another_process_replaces_and_this_one_delivers(store_path, clock, tmp_path):
    clock.set(T0)
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        s.producer().send(Message(TOPIC, b"mine"), delay_ms=5_000, key="k")
        s.producer().send(Message(TOPIC, b"kept"), delay_ms=5_000, key="j")
        script = (
            "import sys\n"
            "from store import Message, MessageStore\n"
            "from tests.conftest import SMALL\n"
            f"with MessageStore.open(sys.argv[1], SMALL, clock=lambda: {T0}) as s:\n"
            "    s.producer().send(Message('orders', b'theirs'), delay_ms=5_000, key='k')\n")
        subprocess.run([sys.executable, "-c", script, store_path], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT})
        clock.set(T0 + 10_000)
        s.deliver_due()
        assert sorted(b for b, _, _ in delivered(s)) == [b"kept", b"theirs"]


def test_bad_keys_and_arguments_are_refused_and_store_nothing(keyed):
    p = keyed.producer()
    for bad in ("", 5, "a\x01b", "é" * 600):
        with pytest.raises(InvalidMessageError):
            p.send(Message(TOPIC, b"x"), delay_ms=1_000, key=bad)
    with pytest.raises(InvalidDelayError, match="delay_ms or deliver_at_ms"):
        p.send(Message(TOPIC, b"x"), key="k")
    with pytest.raises(InvalidDelayError, match="delay level"):
        p.send(Message(TOPIC, b"x"), delay_level=2, key="k")
    with pytest.raises(InvalidMessageError, match="key= alone"):
        p.cancel(TOPIC, "0" * 32, key="k")
    with pytest.raises(InvalidMessageError):
        p.cancel_keys("k")
    assert keyed.max_offset("rmq_sys_wheel_timer", 0) == 0 if "rmq_sys_wheel_timer" in \
        keyed.topics(include_system=True) else True
    assert not os.path.exists(os.path.join(keyed.root, "timerkeys"))
    assert p.cancel(key="never") is False and p.pending_keys(["never"]).tolist() == [False]


def _rows(keys, bodies, delay, **extra):
    n = len(keys)
    cols = {"topic": pa.array([TOPIC] * n), "body": pa.array(bodies, pa.binary()),
            "key": pa.array(keys), "delay_ms": pa.array(np.full(n, delay, np.int64))}
    cols.update(extra)
    return pa.table(cols)


def test_replace_table_last_row_of_a_key_wins_and_keeps_user_properties(keyed, clock):
    p = keyed.producer()
    props = pa.array([[("color", "red"), (PROPERTY_DELAY_KEY, "spoof")], None, [("size", "L")]],
                     pa.map_(pa.string(), pa.string()))
    p.replace_table(_rows(["a", "b", "a"], [b"a1", b"b1", b"a2"], 5_000, properties=props))
    p.send(Message(TOPIC, b"b2"), delay_ms=9_000, key="b")
    clock.set(T0 + 20_000)
    keyed.deliver_due()
    got = sorted(delivered(keyed))
    assert [(b, k) for b, k, _ in got] == [(b"a2", "a"), (b"b2", "b")]
    all_props = [dict(p) for q in keyed.queue_ids(TOPIC)
                 for p in keyed.read_arrow(TOPIC, q, 0, keyed.max_offset(TOPIC, q))
                 .column("properties").to_pylist()]
    a2 = next(d for d in all_props if d.get(PROPERTY_DELAY_KEY) == "a")
    assert a2["size"] == "L" and "color" not in a2


def test_replace_table_refuses_bad_tables_before_storing(keyed):
    p = keyed.producer()
    with pytest.raises(InvalidBatchError, match="no key column"):
        p.replace_table(pa.table({"topic": [TOPIC], "body": [b"x"], "delay_ms": [1]}))
    with pytest.raises(InvalidBatchError, match="nulls"):
        p.replace_table(_rows(["a", None], [b"x", b"y"], 10))
    with pytest.raises(InvalidMessageError, match="separators"):
        p.replace_table(_rows(["a", "b\x02"], [b"x", b"y"], 10))
    with pytest.raises(InvalidDelayError, match="delay_ms, deliver_at"):
        p.replace_table(pa.table({"topic": [TOPIC], "body": [b"x"], "key": ["a"]}))
    with pytest.raises(InvalidDelayError, match="delay levels"):
        p.replace_table(pa.table({"topic": [TOPIC], "body": [b"x"], "key": ["a"],
                                  "delay_level": [2]}))
    with pytest.raises(InvalidDelayError):
        p.replace_table(_rows(["a"], [b"x"], -5))
    assert delivered(keyed) == []


def test_replace_table_with_deliver_at_and_cancel_keys(keyed, clock):
    p = keyed.producer()
    n = 5_000
    keys = [f"k{i}" for i in range(n)]
    p.replace_table(pa.table({"topic": [TOPIC] * n, "body": [b"v1"] * n, "key": keys,
                              "deliver_at": pa.array(np.full(n, T0 + 30_000, np.int64))}))
    p.replace_table(_rows(keys[: n // 2], [b"v2"] * (n // 2), 40_000))
    cancelled = p.cancel_keys(pa.array(keys[::5] + ["unknown"]))
    assert cancelled.tolist() == [True] * len(keys[::5]) + [False]
    clock.set(T0 + 31_000)
    keyed.deliver_due()
    first = delivered(keyed)
    assert sorted(k for b, k, _ in first) == sorted(
        k for i, k in enumerate(keys) if i >= n // 2 and i % 5)
    assert all(b == b"v1" and t == T0 + 30_000 for b, _, t in first)
    clock.set(T0 + 41_000)
    keyed.deliver_due()
    second = [r for r in delivered(keyed) if r[0] == b"v2"]
    assert sorted(k for _, k, _ in second) == sorted(
        k for i, k in enumerate(keys) if i < n // 2 and i % 5)


def test_the_table_grows_and_forgets_delivered_keys(keyed, clock):
    p = keyed.producer()
    n = MIN_CAPACITY  # past half the first table: it is rebuilt larger
    keys = [f"k{i}" for i in range(n)]
    p.replace_table(_rows(keys, [b"x"] * n, 1_000))
    table = keyed.timer.keys._table
    assert table.capacity >= 2 * n and table.used == n
    clock.set(T0 + 10_000)
    keyed.deliver_due()
    assert len(delivered(keyed)) == n
    more = [f"m{i}" for i in range(n)]
    p.replace_table(_rows(more, [b"y"] * n, 1_000))  # the delivered keys are dropped
    assert keyed.timer.keys._table.used == n


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**40)), min_size=1,
                max_size=300, unique_by=lambda t: t))
def test_probing_finds_every_key_placed(pairs):
    slots = np.zeros(1024, dtype=[("key_hash", ">i8"), ("key_check", ">i8")])
    h = np.array([max(1, p[0] % 64 + 1) for p in pairs], np.int64)  # many collisions
    c = np.array([p[1] for p in pairs], np.int64)
    keys = {}
    for hh, cc in zip(h.tolist(), c.tolist()):
        keys[(hh, cc)] = None
    h = np.array([k[0] for k in keys], np.int64)
    c = np.array([k[1] for k in keys], np.int64)
    at = place_new(slots, h)
    assert len(set(at.tolist())) == len(at)
    slots["key_check"][at] = c
    slots["key_hash"][at] = h
    assert (find_slots(slots, h, c) == at).all()
    assert (find_slots(slots, h, c + 1) == -1).all()


# ------------------------------------------------------------------------------ model
KEYS = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), KEYS, st.integers(0, 4_000)),
    st.tuples(st.just("table"), st.lists(st.tuples(KEYS, st.integers(0, 4_000)), min_size=1,
                                         max_size=4)),
    st.tuples(st.just("cancel"), st.lists(KEYS, min_size=1, max_size=3)),
    st.tuples(st.just("plain"), st.integers(1, 4_000)),
    st.tuples(st.just("advance"), st.integers(1, 3_000)),
    st.tuples(st.just("deliver")), st.tuples(st.just("reopen")),
    st.tuples(st.just("crash_in_delivery")),
), min_size=1, max_size=30)


class DeliveryCrash(Exception):
    pass


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(OPS)
@example([("send", "c", 0), ("advance", 100), ("crash_in_delivery",), ("cancel", ["c"])])
@example([("send", "a", 0), ("crash_in_delivery",), ("advance", 100), ("cancel", ["a"])])
def test_model(fresh_dir, clock, ops):
    """Against a model of what each key names: every message that stays named is delivered
    exactly once and never early; a replaced or cancelled one never; across reopens and a
    delivery killed after its appends (redone by the next one)."""
    path = str(fresh_dir("keys-model"))
    clock.set(T0)
    s = MessageStore.open(path, SMALL, clock=clock)
    named: dict[str, tuple[bytes, int]] = {}  # key -> (body, due) of the pending one
    due_of: dict[bytes, int] = {}
    dead: set[bytes] = set()  # replaced or cancelled: never to be delivered
    n = 0
    try:
        for op in ops:
            p = s.producer()
            kind = op[0]
            if kind in ("send", "table", "plain"):
                rows = [(op[1], op[2])] if kind == "send" else (
                    op[1] if kind == "table" else [(None, op[1])])
                bodies = []
                for key, delay in rows:
                    n += 1
                    body = f"m{n}".encode()
                    bodies.append(body)
                    due_of[body] = clock() + max(delay, 1 if key else 0)
                if kind == "send":
                    p.send(Message(TOPIC, bodies[0]), delay_ms=op[2], key=op[1])
                elif kind == "plain":
                    p.send(Message(TOPIC, bodies[0]), delay_ms=op[1])
                else:
                    p.replace_table(_rows([k for k, _ in rows], bodies, 0).set_column(
                        3, "delay_ms", pa.array([d for _, d in rows], pa.int64())))
                for (key, _), body in zip(rows, bodies):
                    if key is not None:
                        if key in named:
                            dead.add(named[key][0])
                        named[key] = (body, due_of[body])
            elif kind == "cancel":
                got = p.cancel_keys(op[1])
                before = dict(named)
                for key, hit in zip(op[1], got.tolist()):
                    assert hit == (key in before), (key, hit)
                    if key in named:
                        dead.add(named.pop(key)[0])
            elif kind == "advance":
                clock.advance(op[1])
            elif kind == "deliver":
                s.deliver_due()
            elif kind == "crash_in_delivery":
                from store.timer import timer_service as timer_service

                real = timer_service.TimerService._save

                def dying(self, state, _real=real):
                    if state.deliver_mark < 0:  # the closing save of a run: die before it
                        raise DeliveryCrash()
                    return _real(self, state)

                timer_service.TimerService._save = dying
                try:
                    s.deliver_due()
                except DeliveryCrash:
                    pass
                finally:
                    timer_service.TimerService._save = real
                s.close()
                s = MessageStore.open(path, SMALL, clock=clock)
            elif kind == "reopen":
                s.close()
                s = MessageStore.open(path, SMALL, clock=clock)
            got = delivered(s)
            bodies = [b for b, _, _ in got]
            assert len(bodies) == len(set(bodies)), "a message delivered twice"
            for body, _, at in got:
                assert body not in dead, body
                assert at == due_of[body] and at <= clock(), (body, at, clock())
            for key, (body, _) in list(named.items()):
                if body in bodies:  # delivered: the key names nothing pending now
                    named.pop(key)
        clock.advance(10_000)
        s.deliver_due()
        got = [b for b, _, _ in delivered(s)]
        assert len(got) == len(set(got))
        assert not (set(got) & dead)
        assert {b for b, _ in named.values()} <= set(got)
        expected = {b for b in due_of if b not in dead}
        assert set(got) == expected
    finally:
        s.close()


# ------------------------------------------------------------------------------ SIGKILL
CHILD = """
import sys
from store import Message, MessageStore
from tests.conftest import SMALL
path, log_path, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
with MessageStore.open(path, SMALL, clock=lambda: 1_790_000_000_000) as s, \\
        open(log_path, "a", buffering=1) as log:
    p = s.producer()
    print("ready", flush=True)
    i = start
    while True:
        key = f"k{i % 7}"
        p.send(Message("orders", f"{i}".encode()), delay_ms=60_000, key=key)
        log.write(f"{key} {i}\\n")  # acknowledged
        if i % 11 == 0:
            p.cancel(key=f"k{(i + 3) % 7}")
            log.write(f"cancel k{(i + 3) % 7} {i}\\n")
        i += 1
"""


@pytest.mark.slow
def test_sigkill_mid_replace_never_lets_a_replaced_message_through(tmp_path):
    path, log_path = str(tmp_path / "store"), str(tmp_path / "acks")
    env = {**os.environ, "PYTHONPATH": ROOT}
    start = 0
    for round_ in range(4):
        child = subprocess.Popen([sys.executable, "-c", CHILD, path, log_path, str(start)],
                                 env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.4 + 0.3 * round_)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        with open(log_path) as fh:
            lines = fh.read().splitlines()
        last_i = max(int(line.split()[-1]) for line in lines)
        parts = lines[-1].split()
        if parts[0] != "cancel" and last_i % 11 == 0:  # a cancel the kill may have cut off
            with open(log_path, "a") as fh:
                fh.write(f"maybe-cancel k{(last_i + 3) % 7} {last_i}\n")
        start = last_i + 1
    with open(log_path) as fh:
        lines = fh.read().splitlines()
    # per key: the last acknowledged send (None after a cancel), and whether a cancel that
    # was in flight at a kill may have ended it
    sent: dict[str, int | None] = {}
    maybe_gone: dict[str, bool] = {}
    for line in lines:
        parts = line.split()
        if parts[0] == "cancel":
            sent[parts[1]], maybe_gone[parts[1]] = None, False
        elif parts[0] == "maybe-cancel":
            maybe_gone[parts[1]] = True
        else:
            sent[parts[0]], maybe_gone[parts[0]] = int(parts[1]), False
    with MessageStore.open(path, SMALL, clock=lambda: T0 + 120_000) as s:
        s.deliver_due()
        got = delivered(s)
    per_key: dict[str, list[int]] = {}
    for body, key, _ in got:
        per_key.setdefault(key, []).append(int(body))
    assert per_key, "nothing was delivered"
    for key, values in per_key.items():
        assert len(values) == 1, (key, values)  # one message per key surfaces
    for key, i in sent.items():
        if i is None:  # cancelled: only a send after the cancel (cut off by a kill) may show
            assert key not in per_key or per_key[key][0] > max(
                int(line.split()[-1]) for line in lines if line.split()[1:2] == [key]
                and line.startswith("cancel")), (key, per_key.get(key))
        elif key in per_key:
            # the acknowledged send, or one sent after it whose ack the kill cut off
            assert per_key[key][0] >= i, (key, i, per_key[key])
        else:
            assert maybe_gone.get(key), (key, i)


def test_sink_stages_keyed_rows_that_replace_when_the_batch_commits(keyed, clock):
    p = keyed.producer()
    p.send(Message(TOPIC, b"old"), delay_ms=5_000, key="a")
    sink = keyed.sink("s1")
    staged = sink.stage(_rows(["a", "b"], [b"a-new", b"b-new"], 5_000))
    clock.set(T0 + 6_000)  # not committed yet: the old one is the key's
    keyed.deliver_due()
    assert [b for b, _, _ in delivered(keyed)] == [b"old"]
    p.send(Message(TOPIC, b"a2"), delay_ms=5_000, key="a")
    sink.commit(0, staged)  # the batch's rows now replace (a2 was sent before the commit)
    clock.set(T0 + 20_000)
    keyed.deliver_due()
    assert sorted(b for b, _, _ in delivered(keyed)) == [b"a-new", b"b-new", b"old"]
    abandoned = keyed.sink("s2").stage(_rows(["b"], [b"never"], 1_000))
    assert keyed.sink("s2").abort() == len(abandoned)
    clock.set(T0 + 40_000)
    keyed.deliver_due()
    assert b"never" not in [b for b, _, _ in delivered(keyed)]


def test_retention_keeps_what_keyed_messages_need(store_path, clock):
    """Segments are cleaned while keyed messages wait: the pending ones (replaced or not)
    stay, and a table rebuilt from the timer topic afterwards still knows which one a key
    names."""
    clock.set(T0)
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        p = s.producer()
        for _ in range(3000):  # segments with nothing pending: retention may go
            p.send(Message("filler", b"f" * 100))
        old = p.send(Message(TOPIC, b"a-old"), delay_ms=60_000, key="a")
        for _ in range(3000):  # fill several 64 KiB segments
            p.send(Message("filler", b"f" * 100))
        p.send(Message(TOPIC, b"a-new"), delay_ms=60_000, key="a")
        p.send(Message(TOPIC, b"b"), delay_ms=60_000, key="b")
        for _ in range(3000):
            p.send(Message("filler", b"f" * 100))
        assert s.clean_expired_files(force=True) >= 1
        # the segments before the oldest pending record went; its own segment stays
        assert 0 < s.commit_log.min_offset() <= old.commitlog_offset
    os.remove(os.path.join(store_path, "timerkeys"))  # rebuilt by the next keyed send
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        s.producer().send(Message(TOPIC, b"c"), delay_ms=60_000, key="c")
        clock.set(T0 + 120_000)
        s.deliver_due()
        assert sorted(b for b, _, _ in delivered(s)) == [b"a-new", b"b", b"c"]
