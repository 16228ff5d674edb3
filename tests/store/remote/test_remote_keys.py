"""Replace by key and recurring schedules over ``rmq://``: a remote producer keys, cancels,
replaces tables and schedules as a local one does."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from store import InvalidMessageError, InvalidScheduleError, Message, StoreServer, connect

TOKEN = "s3cret-token"


@pytest.fixture
def client(tmp_path):
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token=TOKEN)
    remote = connect(server.url, token=TOKEN)
    yield remote
    remote.close()
    server.close()


def _bodies(store, topic):
    store.refresh()
    if topic not in store.topics():
        return []
    out = []
    for q in store.queue_ids(topic):
        out += store.read_arrow(topic, q, 0, store.max_offset(topic, q)).column("body").to_pylist()
    return sorted(out)


def test_keys_and_schedules_over_rmq(client):
    p = client.producer()
    p.send(Message("orders", b"old"), delay_ms=300, key="order-1")
    r = p.send(Message("orders", b"new"), delay_ms=300, key="order-1")
    assert r.stored_topic is not None
    p.send(Message("orders", b"gone"), delay_ms=300, key="order-2")
    assert p.cancel(key="order-2") is True and p.cancel(key="order-2") is False
    assert p.pending_keys(["order-1", "order-2"]).tolist() == [True, False]
    out = p.replace_table(pa.table({"topic": ["orders"] * 2, "body": [b"t1", b"t2"],
                                    "key": ["order-3", "order-3"], "delay_ms": [300, 300]}))
    assert out.num_rows == 2
    assert p.cancel_keys(["order-9"]).tolist() == [False]
    info = p.schedule(Message("reminders", b"ping"), key="remind-1", every_ms=60_000)
    assert info.key == "remind-1" and info.next_fire_ms is not None
    assert [s.key for s in client.schedules()] == ["remind-1"]
    assert client.pause_schedule("remind-1") and client.schedules()[0].paused
    assert client.resume_schedule("remind-1") and client.remove_schedule("remind-1")
    assert client.schedules() == [] and client.remove_schedule("remind-1") is False
    r = p.schedule_table(pa.table({"key": ["t1", "t2"], "body": [b"x", b"y"],
                                   "cron": ["0 9 * * *", None],
                                   "every_ms": pa.array([None, 60_000], pa.int64())}),
                         topic="reminders")
    assert (r.changed, r.unchanged, r.removed) == (2, 0, 0)
    r = p.schedule_table(pa.table({"key": ["t1", "t2"], "body": [b"x", None],
                                   "cron": ["0 9 * * *", None]}), topic="reminders")
    assert (r.changed, r.unchanged, r.removed) == (0, 1, 1)
    assert [s.key for s in client.schedules()] == ["t1"]
    with pytest.raises(InvalidMessageError):
        p.send(Message("orders", b"x"), delay_ms=10, key="a\x01b")
    with pytest.raises(InvalidScheduleError):
        p.schedule(Message("orders", b"x"), key="k", cron="61 * * * *")
    deadline = time.monotonic() + 10  # the default precision is 1 s
    while len(_bodies(client, "orders")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        client.deliver_due()
    assert _bodies(client, "orders") == [b"new", b"t2"]
