"""A RocketMQ client's call refused by the ACL (a wrong secret, a missing right) is logged
with the client's address."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq import ClientConfiguration, Credentials, Message, Producer  # noqa: E402

from store import StoreServer  # noqa: E402

pytestmark = pytest.mark.xdist_group("grpc")


def _message(topic, body):
    m = Message()
    m.topic = topic
    m.body = body
    return m


def test_refused_grpc_calls_name_the_client_address(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="store.proxy")
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "orders-svc", "secretKey": "s3cret-orders", "topicPerms": ["orders=PUB"]},
    ]}))
    server = StoreServer(str(tmp_path / "store"), grpc="127.0.0.1:0", acl=str(acl))
    try:
        config = ClientConfiguration(server.grpc_endpoint,
                                     Credentials("orders-svc", "s3cret-orders"),
                                     request_timeout=5)
        producer = Producer(config, ("orders",))
        producer.startup()
        try:
            with pytest.raises(Exception):  # FORBIDDEN: no right on audit
                producer.send(_message("audit", b"no"))
        finally:
            producer.shutdown()
        bad = Producer(ClientConfiguration(server.grpc_endpoint,
                                           Credentials("orders-svc", "wrong-secret"),
                                           request_timeout=5), ("orders",))
        with pytest.raises(Exception):
            bad.startup()
            bad.send(_message("orders", b"no"))
    finally:
        server.close()
    refused = [r.getMessage() for r in caplog.records
               if r.name.startswith("store.proxy") and "refused" in r.getMessage()]
    assert any("FORBIDDEN" in line for line in refused), refused
    assert any("UNAUTHORIZED" in line for line in refused), refused
    assert all("127.0.0.1" in line for line in refused), refused
    assert "s3cret-orders" not in caplog.text and "wrong-secret" not in caplog.text
