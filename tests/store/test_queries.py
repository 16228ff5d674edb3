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
