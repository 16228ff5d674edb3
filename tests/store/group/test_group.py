"""Store groups (store.group): layout, routing, sends, the exactly-once sink across members."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import (
    InvalidGroupError,
    InvalidMessageError,
    InvalidTopicError,
    LocalTransactionState,
    Message,
    StoreGroup,
    UnknownMessageError,
    is_store_group,
)
from store.formats.message import sharding_queue


def _messages(store, topic):
    out = []
    for q in store.queue_ids(topic) if topic in store.topics() else ():
        out += store.pull(topic, q, store.min_offset(topic, q), 10_000)
    return out


def _bodies(group, topic):
    """``{body: [store names holding it]}`` over every member."""
    seen: dict[bytes, list[str]] = {}
    for name, s in group.stores():
        for m in _messages(s, topic):
            seen.setdefault(m.body, []).append(name)
    return seen


@pytest.fixture
def group(tmp_path, small_config, clock):
    g = StoreGroup.create(str(tmp_path / "g"), ["broker-a", "broker-b", "broker-c"],
                          small_config, clock=clock)
    yield g
    g.close()


def test_layout_rules(tmp_path, small_config):
    path = str(tmp_path / "g")
    for bad in ([], ["a", "a"], ["a b"], ["x" * 65], [""]):
        with pytest.raises(InvalidGroupError):
            StoreGroup.create(path, bad, small_config)
    assert not is_store_group(path)
    other = str(tmp_path / "disk2" / "b")
    StoreGroup.create(path, ["a", "b"], small_config, paths=["a", other]).close()
    assert is_store_group(path)
    assert StoreGroup.members(path) == [("a", os.path.join(path, "a")), ("b", other)]
    with pytest.raises(InvalidGroupError, match="already"):
        StoreGroup.create(path, 2, small_config)
    with pytest.raises(InvalidGroupError, match="not a store group"):
        StoreGroup.open(str(tmp_path))
    # group.json damaged: its .bak (the previous copy) is not there for a new group
    with open(os.path.join(path, "group.json"), "w") as fh:
        fh.write("{not json")
    with pytest.raises(InvalidGroupError, match="group.json"):
        StoreGroup.open(path)


def test_a_missing_member_is_refused_and_never_created(tmp_path, small_config):
    path = str(tmp_path / "g")
    StoreGroup.create(path, 2, small_config).close()
    os.rename(os.path.join(path, "store-1"), os.path.join(path, "moved"))
    with pytest.raises(InvalidGroupError, match="store-1"):
        StoreGroup.open(path)
    assert not os.path.exists(os.path.join(path, "store-1"))


def test_sends_round_robin_named_store_and_sharding_keys(group):
    p = group.producer("pg")
    names = [p.send(Message("orders", f"m{i}".encode())).store_name for i in range(6)]
    assert sorted(set(names)) == list(group.names) and names[:3] != names[3:4] * 3
    r = p.send(Message("orders", b"b"), store="broker-b", queue_id=2)
    assert (r.store_name, r.queue_id) == ("broker-b", 2)
    with pytest.raises(InvalidMessageError, match="store="):
        p.send(Message("orders", b"x"), queue_id=1)
    with pytest.raises(InvalidGroupError, match="broker-z"):
        p.send(Message("orders", b"x"), store="broker-z")
    route = group.route("orders")
    assert len(route) == 12  # 4 queues in each of 3 stores, member by member
    for key in ("order-1", "order-2", "order-77"):
        results = [p.send(Message("orders", f"{key}:{i}".encode()), sharding_key=key)
                   for i in range(5)]
        member, queue = route[sharding_queue(key, len(route))]
        assert {(r.store_name, r.queue_id) for r in results} == {(group.names[member], queue)}
        offsets = [r.queue_offset for r in results]
        assert offsets == sorted(offsets)
    batch = p.send_batch([Message("orders", b"x1"), Message("orders", b"x2")], store="broker-c")
    assert {r.store_name for r in batch} == {"broker-c"}


def test_send_table_keeps_input_order_and_validates_every_share_first(group):
    p = group.producer("pg")
    table = pa.table({"topic": ["orders"] * 9, "body": [f"t{i}" for i in range(9)],
                      "sharding_key": [None, None, None, "k1", "k2", "k1", None, None, None]})
    out = p.send_table(table)
    assert out.column_names[-1] == "store"
    ids = out.column("msg_id").to_pylist()
    stored = {m.msg_id: (name, m.body) for name, s in group.stores()
              for m in _messages(s, "orders")}
    assert [stored[i][1] for i in ids] == [f"t{i}".encode() for i in range(9)]
    assert [stored[i][0] for i in ids] == out.column("store").to_pylist()
    assert len(set(out.column("store").to_pylist())) == 3  # round robin slices
    keyed = out.filter(pa.compute.equal(table.column("sharding_key"), "k1"))
    assert len(set(zip(keyed.column("store").to_pylist(),
                       keyed.column("queue_id").to_pylist()))) == 1
    before = {name: s.confirmed_offset() for name, s in group.stores()}
    # the last row (in the last store's share) is bad: nothing is written anywhere
    bad = pa.table({"topic": ["orders"] * 5 + ["%bad topic"], "body": ["a"] * 6})
    with pytest.raises(InvalidTopicError):
        p.send_table(bad)
    too_big = pa.table({"topic": ["orders"] * 6, "body": [b"a"] * 5 + [b"x" * (5 << 20)]})
    with pytest.raises(InvalidMessageError):
        p.send_table(too_big)
    with pytest.raises(InvalidMessageError, match="queue_id"):
        p.send_table(pa.table({"topic": ["orders"], "body": ["a"], "queue_id": [1]}))
    assert {name: s.confirmed_offset() for name, s in group.stores()} == before


def _rows(n, prefix="r"):
    return pa.table({"topic": ["orders"] * n, "body": [f"{prefix}{i}" for i in range(n)]})


def test_sink_batch_committed_in_some_members_then_replayed_is_exactly_once(group):
    sink = group.sink("q1")
    staged = sink.stage(_rows(300))
    assert set(staged) == set(group.names)
    # the driver died after committing the batch in broker-a only
    group.store("broker-a").sink("q1").commit(0, staged["broker-a"])
    assert 0 < sum(len(v) for v in _bodies(group, "orders").values()) < 300
    # Spark re-runs the batch: new tasks stage the same rows (maybe split otherwise)
    restaged: dict[str, list[str]] = {}
    for part in (_rows(300).slice(0, 120), _rows(300).slice(120)):
        for name, txs in sink.stage(part).items():
            restaged.setdefault(name, []).extend(txs)
    results = sink.commit(0, restaged)
    assert results["broker-a"].replayed and not results["broker-b"].replayed
    seen = _bodies(group, "orders")
    assert sorted(seen) == sorted(f"r{i}".encode() for i in range(300))
    assert all(len(v) == 1 for v in seen.values())
    assert all(s.pending_transaction_stats()["pending"] == 0 for _, s in group.stores())
    assert sink.commit(0, sink.stage(_rows(300))) and \
        sum(len(v) for v in _bodies(group, "orders").values()) == 300  # a third replay


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(bodies=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=60),
       committed=st.sets(st.integers(0, 2)), cut=st.integers(0, 60))
def test_model_any_partial_commit_then_replay(fresh_dir, small_config, bodies,
                                             committed, cut):
    """Whatever members committed before the crash and however the replay splits the rows,
    every row is in the group once (duplicate bodies counted as such)."""
    path = str(fresh_dir("g") / "g")
    with StoreGroup.create(path, 3, small_config) as g:
        table = pa.table({"topic": ["t"] * len(bodies), "body": pa.array(bodies, pa.binary())})
        sink = g.sink("s")
        staged = sink.stage(table)
        for name in staged:
            if g.names.index(name) in committed:
                g.store(name).sink("s").commit(7, staged[name])
        cut = min(cut, len(bodies))
        again: dict[str, list[str]] = {}
        for part in (table.slice(0, cut), table.slice(cut)):
            for name, txs in sink.stage(part).items():
                again.setdefault(name, []).extend(txs)
        sink.commit(7, again)
        got = sorted(m.body for _, s in g.stores() for m in _messages(s, "t"))
        assert got == sorted(bodies)
        assert all(s.pending_transaction_stats()["pending"] == 0 for _, s in g.stores())


def test_delayed_and_transactional_messages_stay_in_their_member(group, clock):
    p = group.producer("pg")
    r = p.send(Message("reminders", b"later"), delay_ms=5_000, store="broker-b")
    assert r.store_name == "broker-b"
    clock.advance(4_000)
    assert group.deliver_due() == 0
    clock.advance(1_200)
    assert group.deliver_due() == 1
    assert _bodies(group, "reminders") == {b"later": ["broker-b"]}

    class Listener:
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, view):
            return LocalTransactionState.ROLLBACK_MESSAGE

    tp = group.transaction_producer("pay", Listener())
    sent = [tp.send_in_transaction(Message("payments", f"p{i}".encode())) for i in range(3)]
    assert len({t.store_name for t in sent}) == 3
    assert group.end_transaction(sent[1].transaction_id, LocalTransactionState.COMMIT_MESSAGE)
    with pytest.raises(UnknownMessageError):
        group.end_transaction("no-such-id", LocalTransactionState.COMMIT_MESSAGE)
    assert _bodies(group, "payments") == {b"p1": [sent[1].store_name]}
    clock.advance(120_000)
    result = group.check_transactions()
    assert result.rolled_back == 2 and result.checked == 2
    assert all(s.pending_transaction_stats()["pending"] == 0 for _, s in group.stores())


def test_read_only_open_writes_nothing(tmp_path, small_config):
    path = str(tmp_path / "g")
    with StoreGroup.create(path, 2, small_config) as g:
        g.producer("pg").send_table(_rows(50))
    before = {}
    for root, _, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            with open(full, "rb") as fh:
                before[full] = fh.read()
    with StoreGroup.open(path, read_only=True) as g:
        assert g.topics() == ["orders"]
        assert sum(len(_messages(s, "orders")) for _, s in g.stores()) == 50
        assert [n for n, _ in g.queues("orders")].count("store-0") == 4
    after = {}
    for root, _, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            with open(full, "rb") as fh:
                after[full] = fh.read()
    assert after == before
    assert json.load(open(os.path.join(path, "group.json")))["version"] == 1


def test_rows_without_a_topic_are_refused_with_nothing_written(group):
    p = group.producer("pg")
    before = {name: s.confirmed_offset() for name, s in group.stores()}
    for table in (pa.table({"body": ["a", "b"], "sharding_key": ["k", "k"]}),
                  pa.table({"topic": pa.array([None, "orders"], pa.string()),
                            "body": ["a", "b"], "sharding_key": ["k", "k"]})):
        with pytest.raises((InvalidMessageError, InvalidTopicError)):
            p.send_table(table)
        with pytest.raises((InvalidMessageError, InvalidTopicError)):
            group.sink("s").stage(table)
    assert {name: s.confirmed_offset() for name, s in group.stores()} == before


def test_delay_keys_and_schedules_live_in_the_member_owning_the_key(tmp_path, clock):
    """A key's sends, replaces, cancels and schedule go to one member (its owner), so a
    replace finds what it replaces; the group lists and changes schedules through it."""
    from store import StoreGroup

    T0 = 1_790_000_000_000
    clock.set(T0)
    StoreGroup.create(str(tmp_path / "g"), 3)
    with StoreGroup.open(str(tmp_path / "g"), clock=clock) as g:
        p = g.producer()
        keys = [f"order-{i}" for i in range(30)]
        for k in keys:
            p.send(Message("orders", f"{k}:1".encode()), delay_ms=5_000, key=k)
        owners = {k: g.key_owner(k) for k in keys}
        assert len(set(owners.values())) == 3  # spread over every member
        out = p.replace_table(pa.table({"topic": ["orders"] * 30,
                                        "body": [f"{k}:2".encode() for k in keys],
                                        "key": keys, "delay_ms": [6_000] * 30}))
        assert out.column("store").to_pylist() == [g.names[owners[k]] for k in keys]
        assert p.cancel(key="order-0") is True
        assert p.cancel_keys(["order-1", "order-2", "nope"]).tolist() == [True, True, False]
        assert p.pending_keys(["order-3", "order-0"]).tolist() == [True, False]
        with pytest.raises(InvalidMessageError):
            p.send(Message("orders", b"x"), delay_ms=5, key="k", store=g.names[0])
        p.schedule(Message("reminders", b"ping"), key="remind", every_ms=1_000, catch_up="all")
        owner = g.names[g.key_owner("remind")]
        assert [(s.key) for s in g.store(owner).schedules()] == ["remind"]
        assert [s.key for s in g.schedules()] == ["remind"]
        assert g.pause_schedule("remind") and g.resume_schedule("remind")
        clock.set(T0 + 10_000)
        g.deliver_due()
        got = _bodies(g, "orders")
        assert sorted(got) == sorted(f"{k}:2".encode() for k in keys[3:])
        assert all(got[f"{k}:2".encode()] == [g.names[owners[k]]] for k in keys[3:])
        assert sum(len(v) for v in _bodies(g, "reminders").values()) >= 9
        assert g.remove_schedule("remind") and g.schedules() == []
        # a table of schedules: each row in its key's owner, one write of each member's book
        keys = [f"s-{i}" for i in range(12)]
        r = p.schedule_table(pa.table({"key": keys, "body": [b"b"] * 12,
                                       "every_ms": pa.array([60_000] * 12, pa.int64())}),
                             topic="reminders")
        assert (r.changed, r.unchanged, r.removed) == (12, 0, 0)
        for k in keys:
            assert [s.key for s in g.store(g.names[g.key_owner(k)]).schedules()
                    if s.key == k] == [k]
        r = p.schedule_table(pa.table({"key": keys[:5]}))  # no cron, no every_ms: removed
        assert (r.changed, r.unchanged, r.removed) == (0, 0, 5)
        assert sorted(s.key for s in g.schedules()) == sorted(keys[5:])
