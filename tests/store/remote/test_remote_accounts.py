"""The Flight face with accounts (``rmq serve --listen ... --acl FILE``, the gRPC face's
accounts file): each call is checked by what it touches; the token stays an admin."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from store import AuthenticationError, LocalTransactionState, Message, StoreServer, connect
from store.base.errors import AccessDeniedError, InvalidConfigError

TOKEN = "accounts-token"
ACCOUNTS = [
    {"accessKey": "writer", "secretKey": "writer-secret", "topicPerms": ["orders=PUB"]},
    {"accessKey": "reader", "secretKey": "reader-secret", "topicPerms": ["orders=SUB"]},
    {"accessKey": "other", "secretKey": "other-secret", "topicPerms": ["others=PUB|SUB"]},
    {"accessKey": "ops", "secretKey": "ops-secret", "admin": True},
]


@pytest.fixture
def served(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": ACCOUNTS}))
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token=TOKEN, acl=str(acl))
    yield server
    server.close()


def as_(served, name):
    return connect(served.url, account=name, secret=f"{name}-secret", timeout_s=20)


def bodies(served, topic):
    with connect(served.url, token=TOKEN) as admin:
        admin.refresh()
        if topic not in admin.topics():
            return []
        return sorted(b for q in admin.queue_ids(topic) for b in admin.read_arrow(
            topic, q, 0, admin.max_offset(topic, q)).column("body").to_pylist())


def test_each_call_is_checked_against_the_topic_it_touches(served):
    with as_(served, "writer") as writer, as_(served, "reader") as reader, \
            as_(served, "other") as other:
        writer.producer("g").send(Message("orders", b"o1"))
        writer.producer("g").send_table(pa.table({"body": [b"o2", b"o3"]}), topic="orders")
        for call in (lambda: writer.producer("g").send(Message("others", b"x")),
                     lambda: writer.producer("g").send_table(pa.table({
                         "topic": ["orders", "others"], "body": [b"a", b"b"]})),
                     lambda: reader.producer("g").send(Message("orders", b"x")),
                     lambda: other.read_arrow("orders", 0, 0, 1),
                     lambda: writer.read_arrow("orders", 0, 0, 1),
                     lambda: other.deliver_due(),
                     lambda: other.sink("s").stage(pa.table({"body": [b"x"]}), topic="orders")):
            with pytest.raises(AccessDeniedError):
                call()
        reader.refresh()
        assert reader.topics() == ["orders"]
        assert sorted(b for q in reader.queue_ids("orders") for b in reader.read_arrow(
            "orders", q, 0, reader.max_offset("orders", q)).column("body").to_pylist()) == [
            b"o1", b"o2", b"o3"]
        other.refresh()
        assert other.topics() == []  # the snapshot shows only what the account may touch
    assert bodies(served, "orders") == [b"o1", b"o2", b"o3"]
    assert bodies(served, "others") == []


def test_a_wrong_secret_or_an_unknown_account_is_refused(served):
    for name, secret in (("writer", "wrong-secret"), ("nobody", "whatever"), ("writer", "")):
        with connect(served.url, account=name, secret=secret or "x") as remote:
            with pytest.raises(AuthenticationError):
                remote.producer("g").send(Message("orders", b"x"))
    with pytest.raises(InvalidConfigError):
        connect(served.url, account="writer")
    with pytest.raises(InvalidConfigError):
        connect(served.url, account="writer", secret="s", token=TOKEN)
    assert bodies(served, "orders") == []


def test_sinks_and_transactions_stay_with_the_account_that_opened_them(served):
    class Listener:
        def execute_local_transaction(self, message, arg):
            return None

        def check_local_transaction(self, view):
            return LocalTransactionState.UNKNOW

    with as_(served, "writer") as writer, as_(served, "other") as other, \
            as_(served, "ops") as ops:
        staged = writer.sink("s").stage(pa.table({"body": [b"sunk"]}), topic="orders")
        assert other.sink("s").open_halves() == [] and other.sink("s").abort() == 0
        assert writer.sink("s").open_halves() == staged
        writer.sink("s").commit(0, staged)
        half = writer.transaction_producer("g", Listener()).send_in_transaction(
            Message("orders", b"half"))
        with pytest.raises(AccessDeniedError):
            other.end_transaction(half.transaction_id, "COMMIT")
        assert writer.end_transaction(half.transaction_id, "COMMIT") is True
        assert ops.deliver_due() == 0  # an admin account may
    assert bodies(served, "orders") == [b"half", b"sunk"]


def test_spark_options_name_the_account_and_its_secret_as_they_name_the_token(tmp_path):
    from rmq_source.errors import InvalidOptionError
    from rmq_source.options import parse_options

    secret_file = tmp_path / "secret"
    secret_file.write_text("writer-secret\n")
    url = "rmq://127.0.0.1:7911"
    options = parse_options({"path": url, "subscribe": "orders", "account": "writer",
                             "secretFile": str(secret_file)}, streaming=False)
    access = options.remote
    assert (access.account, access.secret) == ("writer", "writer-secret")
    assert "writer-secret" not in repr(access)
    assert access.connect_options()["account"] == "writer"
    for bad in ({"account": "writer"}, {"secret": "s3cret-x"},
                {"account": "writer", "secret": "s3cret-x", "token": "t"}):
        with pytest.raises(InvalidOptionError) as info:
            parse_options({"path": url, "subscribe": "orders", **bad}, streaming=False)
        assert "s3cret-x" not in str(info.value)


def test_queries_by_key_and_id_need_the_right_to_read_the_topic(tmp_path):
    """``query_messages`` and ``view_message`` return message bodies: an account reads
    only topics it may SUB (they were answered to any account)."""
    from store import MessageStore, StoreConfig

    MessageStore.open(str(tmp_path / "s"), StoreConfig(message_index_enable=True)).close()
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": ACCOUNTS}))
    served = StoreServer(str(tmp_path / "s"), StoreConfig(message_index_enable=True),
                         listen="127.0.0.1:0", token=TOKEN, acl=str(acl))
    with connect(served.url, token=TOKEN) as admin:
        sent = admin.producer("g").send(Message("orders", b"secret order", keys="k1"))
        msg_id = sent.msg_id
    with as_(served, "reader") as reader, as_(served, "other") as other:
        assert [v.body for v in reader.query_messages("orders", key="k1")] == [b"secret order"]
        assert reader.view_message(msg_id).body == b"secret order"
        with pytest.raises(AccessDeniedError, match="may not SUB topic 'orders'"):
            other.query_messages("orders", key="k1")
        with pytest.raises(AccessDeniedError, match="may not SUB topic 'orders'"):
            other.view_message(msg_id, topic="orders")
        assert other.view_message(msg_id) is None  # not found for it, rather than shown
    served.close()
