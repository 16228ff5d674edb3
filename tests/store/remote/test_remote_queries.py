"""Queries over ``rmq://``: a served store answers ``query_messages`` and ``view_message`` as
a local one does; only the matching messages cross the network."""

from __future__ import annotations

import pytest

from store import InvalidMessageError, Message, StoreConfig, StoreServer, connect

TOKEN = "s3cret-token"


@pytest.fixture
def client(tmp_path):
    server = StoreServer(str(tmp_path / "s"), StoreConfig(message_index_enable=True),
                         listen="127.0.0.1:0", token=TOKEN)
    remote = connect(server.url, token=TOKEN)
    yield remote
    remote.close()
    server.close()


def test_query_and_view_over_rmq(client):
    p = client.producer()
    sent = [p.send(Message("orders", f"o{i}".encode(), keys=f"order-{i % 3}",
                           properties={"p": "v"})) for i in range(9)]
    got = client.query_messages("orders", key="order-1")
    assert [v.msg_id for v in got] == [r.msg_id for r in sent[1::3]]
    assert got[0].body == b"o1" and got[0].keys == ("order-1",)
    assert got[0].properties == {"p": "v"}
    assert len(client.query_messages("orders", max=4)) == 4
    view = client.view_message(sent[5].msg_id)
    assert (view.topic, view.body, view.commitlog_offset) == ("orders", b"o5",
                                                              sent[5].commitlog_offset)
    assert client.view_message("F" * 32) is None
    with pytest.raises(InvalidMessageError, match="begin_ms"):
        client.query_messages("orders", begin_ms=5, end_ms=1)
    with pytest.raises(Exception, match="max"):
        client.query_messages("orders", max=10**6)
