"""``rmq serve --grpc``: the ACL signature check (a refusal logged with the client's
address), the non-loopback rule, and a SIGKILL
mid-send (a real ``rmq serve`` process, restarted) that loses no acknowledged message."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq import ClientConfiguration, Credentials, Message, Producer  # noqa: E402

from store import InvalidConfigError, StoreReader, StoreServer  # noqa: E402

pytestmark = pytest.mark.xdist_group("grpc")


def _message(topic, body):
    m = Message()
    m.topic = topic
    m.body = body
    return m


@pytest.fixture
def acl_server(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "orders-svc", "secretKey": "s3cret-orders",
         "topicPerms": ["orders=PUB", "audit=SUB"]},
        {"accessKey": "admin", "secretKey": "s3cret-admin", "admin": True},
    ]}))
    srv = StoreServer(str(tmp_path / "store"), grpc="127.0.0.1:0", acl=str(acl))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(timeout=30)


def _producer(srv, ak, sk, topics):
    return Producer(ClientConfiguration(srv.grpc_endpoint, Credentials(ak, sk),
                                        request_timeout=5), topics)


def test_acl_accepts_signed_calls_with_the_right_and_refuses_the_rest(acl_server, caplog):
    caplog.set_level(logging.WARNING, logger="store.proxy")
    admin = _producer(acl_server, "admin", "s3cret-admin", ("audit",))
    admin.startup()
    try:
        admin.send(_message("audit", b"by the admin"))
    finally:
        admin.shutdown()
    p = _producer(acl_server, "orders-svc", "s3cret-orders", ("orders",))
    p.startup()
    try:
        assert p.send(_message("orders", b"ok")).message_id
        with pytest.raises(Exception, match="40300"):  # FORBIDDEN: no PUB right on audit
            p.send(_message("audit", b"no"))
    finally:
        p.shutdown()
    bad = _producer(acl_server, "orders-svc", "wrong-secret", ("orders",))
    with pytest.raises(Exception):
        bad.startup()  # the route query is refused: UNAUTHORIZED
        bad.send(_message("orders", b"no"))
    refused = [r.getMessage() for r in caplog.records  # each naming the client's address
               if r.name.startswith("store.proxy") and "refused" in r.getMessage()]
    assert any("FORBIDDEN" in line for line in refused), refused
    assert any("UNAUTHORIZED" in line for line in refused), refused
    assert all("127.0.0.1" in line for line in refused), refused
    assert "s3cret-orders" not in caplog.text and "wrong-secret" not in caplog.text
    reader = StoreReader.open(acl_server.path)
    try:
        assert reader.topics() == ["audit", "orders"]
        assert sum(reader.max_offset("orders", q) for q in reader.queue_ids("orders")) == 1
        assert sum(reader.max_offset("audit", q) for q in reader.queue_ids("audit")) == 1
    finally:
        reader.close()


def test_non_loopback_grpc_needs_an_acl_or_insecure(tmp_path):
    with pytest.raises(InvalidConfigError, match="--acl"):
        StoreServer(str(tmp_path / "s"), grpc="0.0.0.0:0")
    srv = StoreServer(str(tmp_path / "s"), grpc="0.0.0.0:0", insecure=True)
    srv.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(store, port):
    return subprocess.Popen(
        [sys.executable, "-m", "rmq_cli.cli", "serve", "--store", str(store), "--create", "--grpc",
         f"127.0.0.1:{port}", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.getcwd()})


def _wait_port(port, proc, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError(f"rmq serve exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("rmq serve never listened")


@pytest.mark.slow
def test_sigkill_mid_send_loses_no_acknowledged_message(tmp_path):
    store, port = tmp_path / "store", _free_port()
    topic = f"crash-{uuid.uuid4().hex[:6]}"
    proc = _serve(store, port)
    acked: list[str] = []
    try:
        _wait_port(port, proc)
        p = Producer(ClientConfiguration(f"127.0.0.1:{port}", Credentials(), request_timeout=3),
                     (topic,))
        p.startup()
        stop = threading.Event()

        def send():
            i = 0
            while not stop.is_set():
                try:
                    acked.append(p.send(_message(topic, f"m{i}".encode())).message_id)
                except Exception:  # noqa: BLE001 - the server is gone: not acknowledged
                    pass
                i += 1

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = len(acked)
        time.sleep(0.5)
        stop.set()
        sender.join(timeout=30)
        try:
            p.shutdown()
        except Exception:  # noqa: BLE001 - its server was killed
            pass
        assert before > 50, f"only {before} sends before the kill"
        proc = _serve(store, port)  # restarted: recovery, then serving again
        _wait_port(port, proc)
    finally:
        proc.kill()
        proc.wait()
    reader = StoreReader.open(str(store))
    try:
        stored = {v.msg_id for q in reader.queue_ids(topic)
                  for v in reader.pull(topic, q, 0, 1_000_000)}
    finally:
        reader.close()
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged messages lost of {len(acked)}"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_grpc_over_tls(tmp_path):
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc
    from rocketmq.grpc_protocol import service_pb2_grpc

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    srv = StoreServer(str(tmp_path / "s"), grpc="127.0.0.1:0",
                      tls=(cert.read_bytes(), key.read_bytes()))
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(srv.grpc_endpoint, creds) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            r = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="tls")),
                                timeout=10)
            assert r.status.code == pb.Code.OK
        with grpc.insecure_channel(srv.grpc_endpoint) as channel:  # no TLS: refused
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            with pytest.raises(grpc.RpcError):
                stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="tls")),
                                timeout=5)
    finally:
        srv.close()

