"""Queries: messages by key, by id (offset message id or unique key) and by store time, on a
store and on a read-only reader, and ``rmq query``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rmq_cli.cli import main
from store import InvalidMessageError, Message, MessageStore, StoreReader
from store.formats.message_id import decode_offset_message_id, offset_message_id
from tests.conftest import SMALL, FakeClock


@pytest.fixture
def filled(tmp_path):
    """A store with 60 messages in ``orders`` (keys ``order-<i % 6>``), 1 s apart, and a few
    in ``other`` sharing the keys; returns ``(path, clock, results)``."""
    path = str(tmp_path / "store")
    clock = FakeClock()
    with MessageStore.open(path, SMALL, clock=clock) as store:
        p = store.producer("g")
        results = []
        for i in range(60):
            clock.advance(1000)
            results.append(p.send(Message("orders", f"o{i}".encode(), keys=[f"order-{i % 6}",
                                                                            "all"])))
            if i % 20 == 0:
                p.send(Message("other", b"x", keys=f"order-{i % 6}"))
    return path, clock, results


@pytest.mark.parametrize("read_only", [False, True])
def test_query_by_key_returns_the_messages_of_the_key_in_the_topic(filled, read_only):
    path, clock, results = filled
    store = MessageStore.open(path, SMALL, clock=clock, read_only=read_only)
    try:
        got = store.query_messages("orders", key="order-2")
        assert [v.msg_id for v in got] == [r.msg_id for r in results[2::6]]
        assert all(v.topic == "orders" and "order-2" in v.keys for v in got)
        assert len(store.query_messages("orders", key="all", max=7)) == 7
        assert store.query_messages("orders", key="nobody") == []
        # a unique key is a key too
        assert [v.body for v in store.query_messages("orders", key=results[3].msg_id)] == [b"o3"]
        # and the time range bounds it
        t = got[3].store_timestamp_ms
        assert [v.msg_id for v in store.query_messages("orders", key="order-2", begin_ms=t,
                                                       end_ms=t + 6000)] == [
            got[3].msg_id, got[4].msg_id]
    finally:
        store.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_query_by_time_uses_store_time_across_queues(filled, read_only):
    path, clock, results = filled
    store = MessageStore.open(path, SMALL, clock=clock, read_only=read_only)
    try:
        everything = store.query_messages("orders", max=1000)
        assert [v.msg_id for v in everything] == [r.msg_id for r in results]
        t = everything[10].store_timestamp_ms
        window = store.query_messages("orders", begin_ms=t, end_ms=t + 4999)
        assert [v.body for v in window] == [f"o{i}".encode() for i in range(10, 15)]
        assert [v.body for v in store.query_messages("orders", begin_ms=t, max=2)] == [
            b"o10", b"o11"]
        with pytest.raises(InvalidMessageError, match="begin_ms"):
            store.query_messages("orders", begin_ms=t, end_ms=t - 1)
        with pytest.raises(InvalidMessageError, match="max"):
            store.query_messages("orders", max=0)
    finally:
        store.close()


def test_view_message_by_unique_key_and_by_offset_id(filled):
    path, _, results = filled
    with StoreReader.open(path) as reader:
        assert reader.view_message(results[7].msg_id).body == b"o7"
        assert reader.view_message(results[7].msg_id, topic="other") is None
        by_offset = offset_message_id(results[8].commitlog_offset)
        assert decode_offset_message_id(by_offset)[2] == results[8].commitlog_offset
        assert reader.view_message(by_offset).body == b"o8"
        assert reader.view_message("0" * 32) is not None  # offset 0: the first record
        assert reader.view_message("F" * 32) is None
        assert reader.view_message("not-an-id") is None


def test_view_message_of_a_delayed_message_is_the_delivered_copy(tmp_path):
    clock = FakeClock()
    with MessageStore.open(str(tmp_path / "s"), SMALL, clock=clock) as store:
        r = store.producer("g").send(Message("T", b"later", keys="k"), delay_level=1)
        assert store.view_message(r.msg_id).topic == "SCHEDULE_TOPIC_XXXX"
        assert store.query_messages("T", key="k") == []
        clock.advance(5000)
        store.deliver_due()
        view = store.view_message(r.msg_id)
        assert (view.topic, view.body) == ("T", b"later")
        assert [v.msg_id for v in store.query_messages("T", key="k")] == [r.msg_id]


def test_cli_query_by_key_id_and_time(filled):
    path, _, results = filled
    runner = CliRunner()
    out = runner.invoke(main, ["query", "--store", path, "--topic", "orders", "--key", "order-1",
                               "--format", "json"])
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["msg_id"] for line in out.output.splitlines()] == [
        r.msg_id for r in results[1::6]]
    out = runner.invoke(main, ["query", "--store", path, "--id", results[4].msg_id])
    assert out.exit_code == 0 and out.output.rstrip().endswith(" o4"), out.output
    with StoreReader.open(path) as reader:
        t = reader.view_message(results[20].msg_id).store_timestamp_ms
    out = runner.invoke(main, ["query", "--store", path, "--topic", "orders", "--from", str(t),
                               "--to", str(t + 1999)])
    assert out.exit_code == 0 and len(out.output.splitlines()) == 2, out.output
    out = runner.invoke(main, ["query", "--store", path, "--key", "order-1"])
    assert out.exit_code == 2 and "--topic is required" in out.output


def test_a_group_answers_queries_from_every_store_naming_each(tmp_path):
    """``StoreGroup.query_messages`` / ``view_message`` ask every member: the messages of a
    key spread over the stores come back together in store-time order, each naming its
    store; an offset id that two stores hold a message at is refused, naming them."""
    from store import StoreGroup

    path = str(tmp_path / "g")
    clock = FakeClock()
    with StoreGroup.create(path, 2, SMALL, clock=clock) as group:
        p = group.producer("g")
        sent = []
        for i in range(12):
            clock.advance(1000)
            sent.append(p.send(Message("orders", f"o{i}".encode(), keys=f"k{i % 3}")))
    with StoreGroup.open(path, read_only=True) as group:
        assert {r.store_name for r in sent} == set(group.names)  # spread over both
        got = group.query_messages("orders", key="k1")
        assert [(n, v.msg_id) for n, v in got] == [(r.store_name, r.msg_id) for r in sent[1::3]]
        assert [v.msg_id for _, v in group.query_messages("orders", key="k1", max=2)] == [
            r.msg_id for r in sent[1::3][-2:]]
        first = group.query_messages("orders", begin_ms=0, max=5)
        assert [v.msg_id for _, v in first] == [r.msg_id for r in sent[:5]]
        name, view = group.view_message(sent[7].msg_id)
        assert (name, view.body) == (sent[7].store_name, b"o7")
        assert group.view_message("F" * 32) is None
        assert group.query_messages("nowhere", key="k1") == []
        with pytest.raises(InvalidMessageError, match="more than one store"):
            group.view_message(offset_message_id(sent[0].commitlog_offset))
    runner = CliRunner()
    out = runner.invoke(main, ["query", "--store", path, "--topic", "orders", "--key", "k2",
                               "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [(r["store"], r["msg_id"]) for r in rows] == [(s.store_name, s.msg_id)
                                                         for s in sent[2::3]]


def test_cli_query_over_rmq(tmp_path):
    """``rmq query --store rmq://...`` asks the server (with its token), as
    ``store.connect(...).query_messages`` does."""
    from store import StoreConfig, StoreServer

    token_file = tmp_path / "token"
    token_file.write_text("query-token\n")
    server = StoreServer(str(tmp_path / "s"), StoreConfig(message_index_enable=True),
                         listen="127.0.0.1:0", token="query-token")
    try:
        sent = [server.store.producer("g").send(Message("orders", b"o%d" % i, keys=f"k{i % 2}"))
                for i in range(6)]
        runner = CliRunner()
        out = runner.invoke(main, ["query", "--store", server.url, "--token-file",
                                   str(token_file), "--topic", "orders", "--key", "k1",
                                   "--format", "json"])
        assert out.exit_code == 0, out.output
        assert [json.loads(line)["msg_id"] for line in out.output.splitlines()] == [
            r.msg_id for r in sent[1::2]]
        out = runner.invoke(main, ["query", "--store", server.url, "--id", sent[0].msg_id])
        assert out.exit_code != 0  # no token: refused, said
        out = runner.invoke(main, ["query", "--store", str(tmp_path / "s"), "--token",
                                   "x", "--id", sent[0].msg_id])
        assert out.exit_code == 2 and "go with a served store's URL" in out.output
    finally:
        server.close()
