"""Names through every path that creates or names something (topic, group, sink id, message
id, delay key, schedule key): one validator each, on the Flight face and in the store
itself; a store already holding a bad topic name (an older version's) still opens and
serves the rest."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyarrow import flight

from store import InvalidTopicError, Message, MessageStore, StoreServer, connect
from store.base.errors import InvalidMessageError, InvalidScheduleError
from store.base.remote_address import RemoteAddress

TOKEN = "names-token"
BAD_NAMES = ["/etc/passwd", "a\x00b", "x" * 200_000, "../x", ""]
#: Bad as a topic, a group or a message id; fine as a delay key, schedule key or sink id.
FREE_TEXT_OK = {"/etc/passwd", "../x"}


@pytest.fixture
def served(tmp_path):
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token=TOKEN)
    yield server
    server.close()


def _action(url, name, body):
    client = flight.connect(RemoteAddress.parse(url).location)
    options = flight.FlightCallOptions(timeout=20, headers=[
        (b"authorization", f"Bearer {TOKEN}".encode())])
    with pytest.raises(flight.FlightServerError) as info:
        list(client.do_action(flight.Action(name, json.dumps(body).encode()), options))
    payload = json.loads(bytes(info.value.extra_info))
    assert len(payload["message"]) < 1000  # a 200 KB name is never echoed whole
    return payload["type"]


def _topics_file(path):
    with open(os.path.join(path, "config", "topics.json")) as fh:
        return json.load(fh)["topicConfigTable"]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=["passwd", "nul", "200kb", "dotdot", "empty"])
def test_every_flight_action_naming_something_refuses_a_bad_name(served, bad):
    url = served.url
    msg = {"topic": "t", "body": "eA=="}
    calls = [
        ("ensure_topic", {"topic": bad}, "InvalidTopicError"),
        ("send", {"group": bad, "message": msg}, "InvalidTopicError"),
        ("send", {"group": "g", "message": {**msg, "topic": bad}}, "InvalidTopicError"),
        ("send", {"group": "g", "message": msg, "delay_ms": 1000, "key": bad},
         "InvalidMessageError"),
        ("cancel", {"group": "g", "topic": "t", "msg_id": bad}, "InvalidMessageError"),
        ("cancel", {"group": "g", "key": bad}, "InvalidMessageError"),
        ("schedule", {"group": "g", "message": msg, "key": bad, "every_ms": 1000},
         "InvalidScheduleError"),
        ("remove_schedule", {"key": bad}, "InvalidScheduleError"),
        ("sink_abort", {"sink_id": bad}, "InvalidMessageError"),
        ("sink_open_halves", {"sink_id": "s", "group": bad}, "InvalidTopicError"),
        ("offset_for_timestamp", {"topic": bad, "queue_id": 0, "timestamp_ms": 0},
         "InvalidTopicError"),
        ("send_half", {"group": bad, "message": msg}, "InvalidTopicError"),
    ]
    for name, body, kind in calls:
        if bad in FREE_TEXT_OK and (name in ("sink_abort", "schedule", "remove_schedule")
                                    or "key" in body):
            continue  # keys and sink ids are free text (they name no file), NUL excepted
        assert _action(url, name, body) == kind, (name, body)
    assert served.service.store.topics() == []
    with connect(url, token=TOKEN) as remote:
        remote.producer("g").send(Message("fine", b"x"))
        assert remote.topics() == ["fine"]
    assert set(_topics_file(served.path)) == {"fine"} | {
        t for t in _topics_file(served.path) if t.startswith(("rmq_sys", "RMQ_SYS", "SCHED",
                                                               "TRANS"))}


def test_a_bad_name_is_refused_by_the_store_itself(tmp_path):
    with MessageStore.open(str(tmp_path / "s")) as store:
        for bad in BAD_NAMES:
            with pytest.raises(InvalidTopicError):
                store.ensure_topic(bad)
            with pytest.raises(InvalidTopicError):
                store.topic_table.create(bad, 4, 0)
            with pytest.raises(InvalidTopicError):
                store.producer("g").send_table(pa.table({"body": [b"x"]}), topic=bad)
        for bad in ("a\x00b", "x" * 2000, ""):
            with pytest.raises(InvalidMessageError):
                store.sink(bad)
            with pytest.raises(InvalidMessageError):
                store.producer("g").send(Message("t", b"x"), delay_ms=1000, key=bad)
        for bad in ("a\x00b", "x" * 300, ""):
            with pytest.raises(InvalidScheduleError):
                store.producer("g").schedule(Message("t", b"x"), key=bad, every_ms=1000)
        assert store.topics() == []


def test_a_store_holding_a_bad_topic_name_opens_and_serves_the_rest(tmp_path, caplog):
    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        store.producer("g").send(Message("good", b"kept"))
    table_path = os.path.join(path, "config", "topics.json")
    with open(table_path) as fh:
        data = json.load(fh)
    for bad in ("/etc/passwd", "a\x00b", "y" * 200_000):  # as an older version wrote them
        data["topicConfigTable"][bad] = dict(data["topicConfigTable"]["good"], topicName=bad)
    with open(table_path, "w") as fh:
        json.dump(data, fh)
    with MessageStore.open(path) as store:
        assert store.topics() == ["good"]
        store.producer("g").send(Message("other", b"new"))  # rewrites the table
        assert sorted(store.topics()) == ["good", "other"]
    assert "/etc/passwd" in _topics_file(path)  # kept in the file as it was, never served
    assert "breaks the topic rules" in caplog.text
    from rmq_cli.cli import main

    result = CliRunner().invoke(main, ["stats", "--store", path, "--json"])
    assert result.exit_code == 0, result.output
    assert "good" in result.output and "passwd" not in result.output
    server = StoreServer(path, listen="127.0.0.1:0", token=TOKEN)
    try:
        with connect(server.url, token=TOKEN) as remote:
            assert remote.topics() == ["good", "other"]
            assert remote.read_arrow("good", 0, 0, 1).num_rows in (0, 1)
    finally:
        server.close()
