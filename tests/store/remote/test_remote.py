"""A store served over Arrow Flight (``StoreServer(listen=...)``, ``rmq serve --listen``) and
reached with ``store.connect``: the same results and typed errors as a local store, tokens,
garbage requests, a server killed under a client."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from pyarrow import flight

from store import (AuthenticationError, InvalidMessageError, LocalTransactionState, Message,
                   MessageStore, OffsetOutOfRangeError, RemoteError, SinkCommitError,
                   StoreServer, UnknownTopicError, connect, server_status)
from store.base.errors import InvalidConfigError
from store.base.remote_address import RemoteAddress, is_remote, read_token

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
TOKEN = "s3cret-token"


@pytest.fixture
def served(tmp_path):
    """A StoreServer listening on a free loopback port with a token (its loop not run: the
    Flight service answers on its own threads)."""
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token=TOKEN)
    yield server
    server.close()


def _all(store, topic):
    store.refresh()
    out = []
    for q in store.queue_ids(topic):
        batch = store.read_arrow(topic, q, store.min_offset(topic, q), store.max_offset(topic, q))
        out += batch.column("body").to_pylist()
    return sorted(out)


def test_addresses_parse_and_refuse_what_they_cannot_be():
    assert RemoteAddress.parse("rmq://host:7911") == RemoteAddress("host", 7911, False)
    assert RemoteAddress.parse("rmqs://[::1]:7911").location == "grpc+tls://[::1]:7911"
    assert is_remote("RMQ://h:1") and not is_remote("/data/rmq") and not is_remote(None)
    for bad in ("rmq://host", "rmq://host:x", "rmq://u:p@host:1", "rmq://host:1/path",
                "rmq://host:1?token=x", "/data/rmq"):
        with pytest.raises(InvalidConfigError):
            RemoteAddress.parse(bad)
    assert RemoteAddress.listen("0.0.0.0:7911").loopback is False
    assert RemoteAddress.listen("127.0.0.1:0").loopback is True
    with pytest.raises(InvalidConfigError):
        RemoteAddress.listen("7911")


def test_token_files(tmp_path):
    f = tmp_path / "tok"
    f.write_text("abc \nsecond line\n")
    assert read_token(token_file=f) == "abc"
    (tmp_path / "empty").write_text("\n")
    for kwargs in ({"token_file": tmp_path / "empty"}, {"token_file": tmp_path / "missing"},
                   {"token": "a", "token_file": f}, {"token": "  "}):
        with pytest.raises(InvalidConfigError):
            read_token(**kwargs)


def test_a_remote_producer_and_reader_see_what_a_local_one_would(served):
    with connect(served.url, token=TOKEN) as remote:
        p = remote.producer("g")
        r = p.send(Message("orders", b"one", tags="a", keys="k1", properties={"x": "y"}))
        assert (r.topic, r.queue_offset) == ("orders", 0) and len(r.msg_id) == 32
        batch = p.send_batch([Message("orders", b"b%d" % i) for i in range(3)], queue_id=2)
        assert [b.queue_id for b in batch] == [2, 2, 2]
        table = p.send_table(pa.table({"topic": ["orders"] * 4,
                                       "body": [b"t%d" % i for i in range(4)]}))
        assert table.num_rows == 4 and "msg_id" in table.column_names
        delayed = p.send(Message("orders", b"later"), delay_ms=3_600_000)
        assert delayed.queue_offset == -1 and delayed.stored_topic == "rmq_sys_wheel_timer"
        assert p.cancel("orders", delayed.msg_id) is True
        assert p.cancel("orders", delayed.msg_id) is False
        assert _all(remote, "orders") == sorted([b"one", b"b0", b"b1", b"b2",
                                                  b"t0", b"t1", b"t2", b"t3"])
        view = remote.read_arrow("orders", r.queue_id, 0, 1, columns=["tags", "keys", "body"])
        assert view.schema.names == ["tags", "keys", "body"]
        assert view.to_pylist() == [{"tags": "a", "keys": ["k1"], "body": b"one"}]
        assert remote.read_arrow("orders", r.queue_id, 0, 1, tags=["zzz"]).num_rows == 0
        assert remote.written_by_rmq is True
    # the same bytes a local reader sees
    local = MessageStore.open(served.path, read_only=True)
    try:
        assert local.read_arrow("orders", r.queue_id, 0, 1).to_pylist() == \
            connect(served.url, token=TOKEN).read_arrow("orders", r.queue_id, 0, 1).to_pylist()
    finally:
        local.close()


def test_a_large_range_is_streamed_in_batches(served):
    n = 150_000
    with connect(served.url, token=TOKEN) as remote:
        remote.producer("g").send_table(pa.table({"body": [b"x%d" % i for i in range(n)],
                                                  "queue_id": pa.array([0] * n, pa.int32())}),
                                        topic="big")
        batches = list(remote.read_batches("big", 0, 0, n))
        assert len(batches) == 3 and sum(b.num_rows for b in batches) == n
        whole = remote.read_arrow("big", 0, 0, n)
        assert whole.num_rows == n and whole.column("queue_offset")[-1].as_py() == n - 1


def test_errors_keep_their_types(served):
    with connect(served.url, token=TOKEN) as remote:
        p = remote.producer("g")
        with pytest.raises(InvalidMessageError, match="empty"):
            p.send(Message("orders", b""))
        p.send(Message("orders", b"x"), queue_id=0)
        with pytest.raises(UnknownTopicError):
            remote.queue_ids("missing")
        with pytest.raises(OffsetOutOfRangeError):
            remote.read_arrow("orders", 0, 5, 9)
        with pytest.raises(SinkCommitError):
            remote.sink("k").commit(0, ["NOT-A-HALF"])
        assert remote.topics() == ["orders"]  # still serving


@pytest.mark.parametrize("commit", ["index", "copy"])
def test_the_sink_commits_once_and_a_repeated_stage_adds_nothing(served, commit):
    with connect(served.url, token=TOKEN) as remote:
        sink = remote.sink("job-1", commit=commit)
        rows = pa.table({"topic": ["paid"] * 5, "body": [b"r%d" % i for i in range(5)]})
        first = sink.stage(rows)
        sink.stage(rows)  # a stage retried after a timeout: never listed in the commit
        assert len(sink.open_halves()) == 2
        done = sink.commit(7, first)
        assert (done.rows, done.replayed) == (5, False)
        assert sink.commit(7, first).replayed is True
        assert sink.open_halves() == [] and list(sink.committed_batches()) == [7]
        assert _all(remote, "paid") == sorted(rows.column("body").to_pylist())
    with MessageStore.open(served.path, read_only=True) as store:  # the server staged it so
        kinds = {bytes(store.read_record(int(o)).body[:4]) for o in store.queue_entries(
            "RMQ_SYS_TRANS_HALF_TOPIC", 0, 0, store.max_offset("RMQ_SYS_TRANS_HALF_TOPIC", 0)
        )["offset"].tolist()}
        assert kinds == {b"RMQN" if commit == "index" else b"RMQF"}  # stage notes: RMQN


def test_transactions_end_from_a_remote_producer(served):
    class Listener:
        def execute_local_transaction(self, message, arg):
            return arg

        def check_local_transaction(self, view):
            return LocalTransactionState.UNKNOW

    with connect(served.url, token=TOKEN) as remote:
        txp = remote.transaction_producer("pay", Listener())
        ok = txp.send_in_transaction(Message("pay", b"commit-me"), arg="COMMIT")
        kept = txp.send_in_transaction(Message("pay", b"unknown"), arg=None)
        assert ok.ended and ok.local_state is LocalTransactionState.COMMIT_MESSAGE
        assert not kept.ended
        assert _all(remote, "pay") == [b"commit-me"]
        assert remote.end_transaction(kept.transaction_id, "ROLLBACK") is True
        assert remote.end_transaction(kept.transaction_id, "ROLLBACK") is False
        assert _all(remote, "pay") == [b"commit-me"]


def test_a_wrong_or_missing_token_is_refused_and_nothing_is_done(served, caplog):
    for token in (None, "wrong"):
        with connect(served.url, token=token) as remote:
            with pytest.raises(AuthenticationError, match="token"):
                remote.producer("g").send(Message("t", b"x"))
    assert "refused" in caplog.text and TOKEN not in caplog.text and "wrong" in caplog.text
    with connect(served.url, token=TOKEN) as remote:
        assert remote.topics() == []  # nothing was written
    assert TOKEN not in repr(connect(served.url, token=TOKEN))


def test_garbage_requests_get_typed_errors_and_the_server_keeps_serving(served):
    client = flight.connect(RemoteAddress.parse(served.url).location)
    options = flight.FlightCallOptions(timeout=10, headers=[
        (b"authorization", f"Bearer {TOKEN}".encode())])
    for action, body in (("send", b"\xff\x00garbage"), ("nope", b"{}"), ("send", b"[1, 2]"),
                         ("send", b'{"group": "g", "message": {"topic": 1}}'),
                         ("end_transactions", b'{"items": [[1]]}'),
                         ("send", json.dumps({"group": "g", "message": {
                             "topic": "t", "body": "not base64!"}}).encode())):
        with pytest.raises(flight.FlightServerError) as info:
            list(client.do_action(flight.Action(action, body), options))
        assert b"InvalidRequest" in info.value.extra_info
    for ticket in (b"", b"{}", b'{"op": "read", "topic": "t"}', b"\x00" * 100):
        with pytest.raises(flight.FlightServerError):
            client.do_get(flight.Ticket(ticket), options).read_all()
    with pytest.raises(flight.FlightError):
        writer, _ = client.do_put(flight.FlightDescriptor.for_command(b"junk"),
                                  pa.schema([("a", pa.int64())]), options)
        writer.write_table(pa.table({"a": [1]}))
        writer.close()
    with connect(served.url, token=TOKEN) as remote:
        remote.producer("g").send(Message("t", b"after"))
        assert _all(remote, "t") == [b"after"]


def test_a_non_loopback_address_needs_a_token_or_insecure(tmp_path):
    with pytest.raises(InvalidConfigError, match="token"):
        StoreServer(str(tmp_path / "s"), listen="0.0.0.0:0")
    assert not os.path.exists(tmp_path / "s")  # refused before anything was created
    server = StoreServer(str(tmp_path / "s"), listen="0.0.0.0:0", insecure=True)
    try:
        assert server.url.startswith("rmq://0.0.0.0:")
    finally:
        server.close()


def test_an_unreachable_server_fails_within_the_timeout_naming_its_address(tmp_path):
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0")
    url = server.url
    server.close()
    start = time.monotonic()
    with connect(url, timeout_s=5) as remote:
        with pytest.raises(RemoteError, match=url.replace(".", r"\.")):
            remote.topics()
    assert time.monotonic() - start < 10


def _serve(path, *extra):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "rmq_cli.cli", "serve", "--store", path,
                             "--create",
                             "--log-level", "WARNING", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _url_of(path, proc, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        status = server_status(path)
        if status and status.get("attached") and status.get("pid") == proc.pid \
                and status.get("listen"):
            return status["listen"]
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def test_rmq_serve_listen_is_killed_and_restarted_under_a_client(tmp_path):
    """A server SIGKILLed under a client: the client's next call fails within its timeout
    naming the address; restarted on the same port, every acknowledged send is there once."""
    path = str(tmp_path / "s")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = _serve(path, "--listen", "127.0.0.1:0", "--token-file", str(token_file))
    url = _url_of(path, proc)
    port = url.rsplit(":", 1)[1]
    acked = []
    with connect(url, token_file=str(token_file), timeout_s=5) as remote:
        p = remote.producer("g")
        for i in range(50):
            acked.append(p.send(Message("t", b"m%d" % i)).msg_id)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        start = time.monotonic()
        with pytest.raises(RemoteError, match=port):
            p.send(Message("t", b"lost"))
        assert time.monotonic() - start < 10
        proc = _serve(path, "--listen", f"127.0.0.1:{port}", "--token-file", str(token_file))
        try:
            _url_of(path, proc)
            remote.refresh()
            got = []
            for q in remote.queue_ids("t"):
                got += remote.read_arrow("t", q, 0, remote.max_offset("t", q)).column(
                    "msg_id").to_pylist()
            assert sorted(got) == sorted(acked)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_tls_serves_rmqs_and_a_client_without_the_root_is_refused(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token=TOKEN,
                         tls=(cert.read_bytes(), key.read_bytes()))
    try:
        assert server.url.startswith("rmqs://127.0.0.1:")
        with connect(server.url, token=TOKEN, tls_root_certs=str(cert)) as remote:
            remote.producer("g").send(Message("t", b"over tls"))
            assert _all(remote, "t") == [b"over tls"]
        with connect(server.url, token=TOKEN, timeout_s=5) as remote:  # system roots only
            with pytest.raises(RemoteError):
                remote.topics()
        plain = server.url.replace("rmqs://", "rmq://")
        with connect(plain, token=TOKEN, timeout_s=5) as remote:  # no TLS at all
            with pytest.raises(RemoteError):
                remote.topics()
    finally:
        server.close()


def test_rmq_serve_listen_serves_every_member_of_a_group(tmp_path):
    from store import StoreGroup

    group = str(tmp_path / "g")
    StoreGroup.create(group, ["a", "b"]).close()
    proc = _serve(group, "--listen", "127.0.0.1:0")
    try:
        urls = [_url_of(member, proc) for _, member in StoreGroup.members(group)]
        assert len(set(urls)) == 2
        for i, url in enumerate(urls):
            with connect(url) as remote:
                remote.producer("g").send(Message("t", b"to-%d" % i))
                assert _all(remote, "t") == [b"to-%d" % i]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
