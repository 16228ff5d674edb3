"""A store group whose members are served on other hosts (``rmq://`` paths in group.json):
127.0.0.1 and 127.0.0.2 stand in for two hosts."""

from __future__ import annotations

import pyarrow as pa
import pytest

from store import (InvalidGroupError, InvalidMessageError, LocalTransactionState, Message,
                   RemoteError, StoreGroup, StoreServer, connect)

TOKEN = "group-token"


@pytest.fixture
def two_hosts(tmp_path):
    servers = [StoreServer(str(tmp_path / f"host-{i}" / "store"), listen=f"127.0.0.{i + 1}:0",
                           token=TOKEN) for i in range(2)]
    yield [s.url for s in servers]
    for s in servers:
        s.close()


def _bodies(url, topic):
    with connect(url, token=TOKEN) as remote:
        if topic not in remote.topics():
            return []
        return sorted(b for q in remote.queue_ids(topic) for b in remote.read_arrow(
            topic, q, remote.min_offset(topic, q), remote.max_offset(topic, q)
        ).column("body").to_pylist())


def test_a_group_spans_two_served_stores(tmp_path, two_hosts):
    path = str(tmp_path / "group")
    with StoreGroup.create(path, ["a", "b"], paths=two_hosts,
                           remote={"token": TOKEN}) as group:
        assert StoreGroup.members(path) == [("a", two_hosts[0]), ("b", two_hosts[1])]
        p = group.producer("g")
        first, second = p.send(Message("t", b"x0")), p.send(Message("t", b"x1"))
        assert {first.store_name, second.store_name} == {"a", "b"}
        keyed = [p.send(Message("k", b"k%d" % i), sharding_key="order-7") for i in range(5)]
        assert len({(r.store_name, r.queue_id) for r in keyed}) == 1  # one queue keeps order
        out = p.send_table(pa.table({"topic": ["t"] * 100,
                                     "body": [b"r%d" % i for i in range(100)]}))
        assert out.num_rows == 100 and set(out.column("store").to_pylist()) == {"a", "b"}
        assert out.column("queue_offset").null_count == 0
        with pytest.raises(InvalidMessageError):  # one bad row: no member writes anything
            p.send_table(pa.table({"topic": ["t"] * 4, "body": [b"ok", b"ok", b"", b"ok"]}))
    both = _bodies(two_hosts[0], "t") + _bodies(two_hosts[1], "t")
    assert sorted(both) == sorted([b"x0", b"x1"] + [b"r%d" % i for i in range(100)])


def test_the_group_sink_and_transactions_across_hosts(tmp_path, two_hosts):
    path = str(tmp_path / "group")
    StoreGroup.create(path, ["a", "b"], paths=two_hosts, remote={"token": TOKEN}).close()
    with StoreGroup.open(path, remote={"token": TOKEN}) as group:
        sink = group.sink("job")
        staged = sink.stage(pa.table({"topic": ["s"] * 50,
                                      "body": [b"s%d" % i for i in range(50)]}))
        assert set(staged) == {"a", "b"}
        done = sink.commit(3, staged)
        assert sum(c.rows for c in done.values()) == 50
        assert all(c.replayed for c in sink.commit(3, staged).values())

        class Later:
            def execute_local_transaction(self, message, arg):
                return None

            def check_local_transaction(self, view):
                return LocalTransactionState.UNKNOW

        txp = group.transaction_producer("pay", Later())
        ids = [txp.send_in_transaction(Message("pay", b"p%d" % i)).transaction_id
               for i in range(4)]
        assert group.end_transactions([(i, "COMMIT") for i in ids]) == [True] * 4
        with pytest.raises(InvalidGroupError, match="served on other hosts"):
            group.check_transactions()
    got = _bodies(two_hosts[0], "s") + _bodies(two_hosts[1], "s")
    assert sorted(got) == sorted(b"s%d" % i for i in range(50))
    assert sorted(_bodies(two_hosts[0], "pay") + _bodies(two_hosts[1], "pay")) == \
        [b"p0", b"p1", b"p2", b"p3"]


def test_a_group_with_an_unreachable_member_does_not_open(tmp_path, two_hosts):
    path = str(tmp_path / "group")
    with pytest.raises(RemoteError, match="127.0.0.3:1"):
        StoreGroup.create(path, ["a", "b"], paths=[two_hosts[0], "rmq://127.0.0.3:1"],
                          remote={"token": TOKEN, "timeout_s": 5})
