"""A replica set served in this process (``StoreServer(listen=..., replica_set=...)``): the
follower holds the leader's CommitLog byte for byte, reads work on it, writes are refused
naming the leader, only the leader's services run, rights and malformed requests."""

from __future__ import annotations

import json
import os
import socket
import time

import pyarrow as pa
import pytest
from pyarrow import flight

from store import LocalTransactionState, Message, MessageStore, NotLeaderError, StoreServer, connect
from store.base.errors import AccessDeniedError, InvalidConfigError, ReplicaWriterError
from store.base.remote_address import RemoteAddress
from store.remote.wire import dumps
from store.replication.replica import read_state
from store.replication.replica_set import ReplicaSet

SMALL = {"commitlog_file_size_bytes": 256 * 1024, "timer_precision_ms": 100,
         "message_index_enable": True}
T0 = 1_800_000_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Commit:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, view):
        return LocalTransactionState.COMMIT_MESSAGE


def replica_file(tmp_path, ports, **more) -> str:
    path = tmp_path / "replicas.json"
    path.write_text(json.dumps({"replicas": [f"rmq://127.0.0.1:{p}" for p in ports], **more}))
    return str(path)


def commitlog_bytes(root: str, end: int) -> bytes:
    """The CommitLog of the store at ``root`` up to ``end``, segments joined."""
    d = os.path.join(root, "commitlog")
    parts = []
    for name in sorted(n for n in os.listdir(d) if n.isdigit()):
        with open(os.path.join(d, name), "rb") as fh:
            parts.append(fh.read())
    return b"".join(parts)[:end]


def caught_up(leader: StoreServer, follower: StoreServer, timeout_s: float = 30) -> int:
    end = leader.store.confirmed_offset()
    deadline = time.monotonic() + timeout_s
    while follower.store.confirmed_offset() < end:
        assert time.monotonic() < deadline, follower.replica.status()
        time.sleep(0.01)
    return end


def queue_entries(store, topics) -> dict:
    return {(t, q): store.queue_entries(t, q, store.min_offset(t, q), store.max_offset(t, q)
                                        ).tolist()
            for t in topics for q in store.queue_ids(t)}


@pytest.fixture
def pair(tmp_path):
    """A leader (its clock a fake one) and a follower, each a StoreServer whose loop is not
    run (steps are called by hand)."""
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)  # (no witness: the leader is static, the first)
    clock = Clock()
    leader = StoreServer(str(tmp_path / "a"), SMALL, clock=clock,
                         listen=f"127.0.0.1:{ports[0]}", replica_set=rs)
    follower = StoreServer(str(tmp_path / "b"), SMALL, listen=f"127.0.0.1:{ports[1]}",
                           replica_set=rs)
    leader.clock = clock
    yield leader, follower
    follower.close()
    leader.close()


def test_every_kind_of_send_reaches_the_follower_byte_for_byte(pair):
    leader, follower = pair
    with connect(leader.url) as remote:
        p = remote.producer("g")
        ids = [p.send(Message("orders", b"one-%d" % i, tags="a", keys=f"k{i}")).msg_id
               for i in range(30)]
        ids += [r.msg_id for r in p.send_batch([Message("orders", b"batch-%d" % i)
                                                for i in range(40)], queue_id=1)]
        table = p.send_table(pa.table({"body": [b"x" * 700 + str(i).encode()
                                                for i in range(3000)],
                                       "tags": [f"t{i % 3}" for i in range(3000)]}),
                             topic="bulk")
        ids += table.column("msg_id").to_pylist()
        p.send(Message("orders", b"later"), delay_ms=5_000)
        p.send(Message("orders", b"level"), delay_level=1)
        tx = remote.transaction_producer("tg", Commit())
        ids.append(tx.send_in_transaction(Message("orders", b"in-tx")).msg_id)
        sink = remote.sink("job")  # (rows written once, made visible by a commit marker)
        sink.commit(1, sink.stage(pa.table({"topic": ["sunk"] * 50,
                                            "body": [b"s%d" % i for i in range(50)]})))
        p.send(Message("sunk", b"after"))  # (the queue goes on past the marker's entries)
    end = caught_up(leader, follower)
    assert end > 3 * SMALL["commitlog_file_size_bytes"]  # (segments and their blanks crossed)
    assert commitlog_bytes(follower.path, end) == commitlog_bytes(leader.path, end)
    topics = ["orders", "bulk", "sunk"]
    assert queue_entries(follower.store, topics) == queue_entries(leader.store, topics)
    assert sum(follower.store.max_offset("sunk", q) for q in follower.store.queue_ids("sunk")) \
        == 51
    with connect(follower.url) as remote:
        for msg_id in ids[::97] + ids[-3:]:
            view = remote.view_message(msg_id)
            assert view is not None and view == leader.store.view_message(msg_id), msg_id
        assert remote.query_messages("orders", key="k7")[0].body == b"one-7"
        got = remote.read_arrow("bulk", 0, 0, remote.max_offset("bulk", 0))
        assert got.num_rows == leader.store.max_offset("bulk", 0)
        followed = remote.follow("orders", start="earliest", deliver_due=True,
                                 poll_interval_s=0.01)  # as rmq tail follows it
        assert next(followed).topic == "orders"
    status = follower.replica.status()
    assert status["role"] == "follower" and status["lag_bytes"] == 0
    assert status["state"] == "following" and status["epoch"] == 1


def test_a_follower_refuses_writes_naming_the_leader_and_serves_reads(pair):
    leader, follower = pair
    with connect(follower.url) as remote:
        p = remote.producer("g")
        for call in (lambda: p.send(Message("t", b"x")),
                     lambda: p.send_batch([Message("t", b"x")]),
                     lambda: p.send_table(pa.table({"body": [b"x"]}), topic="t"),
                     lambda: remote.sink("s").stage(pa.table({"body": [b"x"]}), topic="t"),
                     lambda: remote.ensure_topic("t")):
            with pytest.raises(NotLeaderError, match=leader.url):
                call()
        assert remote.topics() == []  # reads are answered
        assert remote.deliver_due() == 0  # the leader delivers: readers asking get nothing
    assert follower.store.confirmed_offset() == 0
    # another process opening the follower's directory may read it, never append to it
    with MessageStore.open(follower.path, SMALL) as other:
        with pytest.raises(ReplicaWriterError, match="is a follower .* allowed: writes to "
                                                     "the leader"):
            other.producer("g").send(Message("t", b"bypass"))
        assert other.confirmed_offset() == 0


def test_only_the_leader_delivers_and_its_deliveries_are_replicated(pair):
    leader, follower = pair
    with connect(leader.url) as remote:
        remote.producer("g").send(Message("orders", b"due"), delay_ms=5_000)
        remote.producer("g").send(Message("orders", b"level"), delay_level=1)
    caught_up(leader, follower)
    leader.clock.now += 60_000
    assert follower.step() == 0  # a follower's step delivers nothing, whatever its clock
    assert follower.store.confirmed_offset() == leader.store.confirmed_offset()
    assert leader.step() == 2
    end = caught_up(leader, follower)
    assert commitlog_bytes(follower.path, end) == commitlog_bytes(leader.path, end)
    views = follower.store.pull("orders", 0, 0, 10) + follower.store.pull("orders", 1, 0, 10) \
        + follower.store.pull("orders", 2, 0, 10) + follower.store.pull("orders", 3, 0, 10)
    assert sorted(v.body for v in views) == [b"due", b"level"]
    assert follower.step() == 0


def test_a_follower_restarted_goes_on_from_its_own_end(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    leader = StoreServer(str(tmp_path / "a"), SMALL, listen=f"127.0.0.1:{ports[0]}",
                         replica_set=rs)
    try:
        with connect(leader.url) as remote:
            remote.producer("g").send_table(pa.table({"body": [b"a%d" % i for i in range(500)]}),
                                            topic="t")
            follower = StoreServer(str(tmp_path / "b"), SMALL, listen=f"127.0.0.1:{ports[1]}",
                                   replica_set=rs)
            first = caught_up(leader, follower)
            follower.close()
            remote.producer("g").send_table(pa.table({"body": [b"b%d" % i for i in range(500)]}),
                                            topic="t")
            follower = StoreServer(str(tmp_path / "b"), SMALL, listen=f"127.0.0.1:{ports[1]}",
                                   replica_set=rs)
            try:
                end = caught_up(leader, follower)
                assert end > first
                assert commitlog_bytes(follower.path, end) == commitlog_bytes(leader.path, end)
                deadline = time.monotonic() + 30  # (its next request reports the end)
                while not [f for f in leader.replica.status()["followers"] if f["end"] == end]:
                    assert time.monotonic() < deadline, leader.replica.status()  # never seen
                    time.sleep(0.01)
            finally:
                follower.close()
    finally:
        leader.close()


def test_a_diverged_follower_refuses_to_follow(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    with MessageStore.open(str(tmp_path / "b"), SMALL) as own:  # a history of its own
        own.producer("g").send(Message("t", b"mine"))
    leader = StoreServer(str(tmp_path / "a"), SMALL, listen=f"127.0.0.1:{ports[0]}",
                         replica_set=rs)
    try:
        with connect(leader.url) as remote:
            for i in range(5):
                remote.producer("g").send(Message("t", b"theirs-%d" % i))
        follower = StoreServer(str(tmp_path / "b"), SMALL, listen=f"127.0.0.1:{ports[1]}",
                               replica_set=rs)
        try:
            deadline = time.monotonic() + 30
            while follower.replica.status()["state"] != "diverged":
                assert time.monotonic() < deadline, follower.replica.status()
                time.sleep(0.01)
            assert "not a prefix" in follower.replica.status()["error"]
            assert follower.store.pull("t", 0, 0, 10)[0].body == b"mine"  # nothing cut
        finally:
            follower.close()
    finally:
        leader.close()


def test_the_replication_right_is_needed_under_an_acl(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "reader", "secretKey": "reader-secret", "defaultTopicPerm": "PUB|SUB"},
        {"accessKey": "replicator", "secretKey": "replicator-secret", "replicate": True}]}))
    server = StoreServer(str(tmp_path / "a"), SMALL, listen="127.0.0.1:0", acl=str(acl))
    try:
        server.store.producer("g").send(Message("t", b"x"))
        ask = {"tail_crc": 0, "file_size": SMALL["commitlog_file_size_bytes"],
               "max_bytes": 1 << 20, "wait_ms": 0}
        with connect(server.url, account="reader", secret="reader-secret") as reader, \
                pytest.raises(AccessDeniedError, match="replication right"):
            list(reader.log_chunks(0, **ask))
        with connect(server.url, account="replicator", secret="replicator-secret") as ok:
            batches = list(ok.log_chunks(0, **ask))
        assert sum(len(b.column("data")[0].as_py()) for b in batches) == \
            server.store.confirmed_offset()
    finally:
        server.close()
    acl.write_text(json.dumps({"accounts": [{"accessKey": "a", "secretKey": "secret",
                                             "replicate": "yes"}]}))
    with pytest.raises(InvalidConfigError, match="replicate"):
        StoreServer(str(tmp_path / "c"), SMALL, listen="127.0.0.1:0", acl=str(acl))


def refused(client, ticket: bytes, kind: str) -> None:
    with pytest.raises(flight.FlightServerError) as info:
        client.do_get(flight.Ticket(ticket)).read_all()
    assert json.loads(info.value.extra_info)["type"] == kind, info.value


def test_malformed_replication_requests_get_typed_errors(tmp_path):
    server = StoreServer(str(tmp_path / "a"), SMALL, listen="127.0.0.1:0")
    try:
        server.store.producer("g").send(Message("t", b"x" * 100))
        client = flight.FlightClient(server.service.address.location)
        good = {"op": "replicate", "from": 0, "tail_crc": 0,
                "file_size": SMALL["commitlog_file_size_bytes"], "max_bytes": 1024,
                "wait_ms": 0}
        bad = [{k: v for k, v in good.items() if k != "from"}, {**good, "from": -1},
               {**good, "from": "0"}, {**good, "max_bytes": 1 << 40}, {**good, "max_bytes": 0},
               {**good, "wait_ms": 60_000}, {**good, "tail_crc": -5}, {**good, "file_size": 0}]
        for body in bad:
            refused(client, dumps(body), "InvalidRequest")
        refused(client, dumps(good)[:-7], "InvalidRequest")  # cut off: no JSON
        refusals = {"ReplicaDivergedError": [{**good, "from": 5},  # inside a record
                                             {**good, "from": 1 << 30},  # past the end
                                             {**good, "from": server.store.confirmed_offset(),
                                              "tail_crc": 12345}],  # other bytes before it
                    "ReplicationError": [{**good, "file_size": 1 << 20}]}
        for kind, bodies in refusals.items():
            for body in bodies:
                refused(client, dumps(body), kind)
        got = client.do_get(flight.Ticket(dumps(good))).read_all()  # it keeps serving
        assert got.column("end").to_pylist() == [server.store.confirmed_offset()]
        client.close()
    finally:
        server.close()


def test_the_replica_set_file_is_checked(tmp_path):
    def parse(data):
        return ReplicaSet.of(data, "rs.json")

    ok = parse({"replicas": ["rmq://h1:7911", "rmq://h2:7911"], "witness": "rmq://h3:7911",
                "min_insync_replicas": 1})
    assert ok.leader == "rmq://h1:7911" and ok.witness == "rmq://h3:7911"
    assert parse({"replicas": ["rmq://h1:1", "rmq://h2:1"], "leader": "rmq://h2:1"}).leader \
        == "rmq://h2:1"
    from store.base.remote_address import RemoteAddress
    assert ok.member(RemoteAddress.listen("h2:7911")) == "rmq://h2:7911"
    for bad, why in (([], "JSON object"), ({"replicas": []}, "non-empty"),
                     ({"replicas": ["rmq://h1:1"], "extra": 1}, "unknown field"),
                     ({"replicas": ["rmq://h1:1", "rmq://h1:1"]}, "twice"),
                     ({"replicas": ["h1:1"]}, "no store URL"),
                     ({"replicas": ["rmq://h1:1"], "leader": "rmq://h9:1"}, "not one of"),
                     ({"replicas": ["rmq://h1:1"], "witness": "rmq://h1:1"}, "also a replica"),
                     ({"replicas": ["rmq://h1:1"], "min_insync_replicas": 2}, "asynchronous"),
                     ({"replicas": ["rmq://h1:1"], "account": "a"}, "go together")):
        with pytest.raises(InvalidConfigError, match=why):
            parse(bad)
    with pytest.raises(InvalidConfigError, match="no single replica"):
        ok.member(RemoteAddress.listen("h4:7911"))
    rs = replica_file(tmp_path, [free_port()])
    with pytest.raises(InvalidConfigError, match="no single replica"):
        StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", replica_set=rs)
    with pytest.raises(InvalidConfigError, match="listen"):
        StoreServer(str(tmp_path / "s"), replica_set=rs)
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    for grpc_field, why in (({"rmq://h9:1": "127.0.0.1:1"}, "no replica"),
                            ({"rmq://h1:1": "nohostport"}, "HOST:PORT"), ([], "must map")):
        with pytest.raises(InvalidConfigError, match=why):
            parse({"replicas": ["rmq://h1:1"], "grpc": grpc_field})
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)  # (no "grpc": a replica's gRPC face needs every one)
    with pytest.raises(InvalidConfigError, match="does not give the gRPC endpoint"):
        StoreServer(str(tmp_path / "s"), listen=f"127.0.0.1:{ports[1]}", replica_set=rs,
                    grpc="127.0.0.1:0")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InvalidConfigError, match="not JSON"):
        ReplicaSet.read(tmp_path / "broken.json")


def test_role_and_epoch_are_recorded_for_a_stopped_store(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    server = StoreServer(str(tmp_path / "a"), SMALL, listen=f"127.0.0.1:{ports[1]}",
                         replica_set=rs)
    server.close()
    state = read_state(str(tmp_path / "a"))
    assert state["role"] == "follower" and state["epoch"] == 1
    assert state["leader"] == f"rmq://127.0.0.1:{ports[0]}"
    rs = replica_file(tmp_path, ports, leader=f"rmq://127.0.0.1:{ports[1]}")
    server = StoreServer(str(tmp_path / "a"), SMALL, listen=f"127.0.0.1:{ports[1]}",
                         replica_set=rs)
    server.close()
    state = read_state(str(tmp_path / "a"))
    assert state["role"] == "leader" and state["epoch"] == 2  # another leader: a new term


def test_the_election_fields_of_a_replica_set_file():
    urls = ["rmq://127.0.0.1:7911", "rmq://127.0.0.2:7911", "rmq://127.0.0.3:7911"]
    plain = ReplicaSet.of({"replicas": urls[:2]})
    assert not plain.elected
    rs = ReplicaSet.of({"replicas": urls[:2], "witness": urls[2],
                        "raft": {urls[0]: "127.0.0.1:9000"}, "election_timeout_ms": 800})
    assert rs.elected and rs.voters == tuple(urls) and rs.election_timeout_ms == 800
    assert rs.raft_address(urls[0]) == "127.0.0.1:9000"
    assert rs.raft_address(urls[1]) == "127.0.0.2:7912"  # port + 1 when not given
    assert rs.member(RemoteAddress.listen("127.0.0.3:7911"), witness=True) == urls[2]
    for bad, why in [({"raft": {"rmq://127.0.0.9:1": "h:1"}}, "no voter"),
                     ({"raft": {urls[0]: "nohostport"}}, "HOST:PORT"),
                     ({"raft": ["x"]}, "raft"),
                     ({"election_timeout_ms": 10}, "election_timeout_ms"),
                     ({"election_timeout_ms": True}, "election_timeout_ms")]:
        with pytest.raises(InvalidConfigError, match=why):
            ReplicaSet.of({"replicas": urls[:2], "witness": urls[2], **bad})
