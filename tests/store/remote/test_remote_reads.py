"""Watching a served store: ``connect(url).pull`` gives what a local ``pull`` gives, and
``follow`` (remote, local, a group's) sees messages sent after it started."""

from __future__ import annotations

import dataclasses

import pytest

from store import (InvalidConfigError, InvalidMessageError, LocalTransactionState, Message,
                   MessageStore, OffsetOutOfRangeError, StoreGroup, StoreReader, StoreServer,
                   UnknownTopicError, connect)
from store.base.remote_address import RemoteAddress

TOKEN = "reads-token"


def _fields(view) -> dict:
    out = dataclasses.asdict(view)
    del out["sys_flag"], out["system_properties"]  # not carried by reads (documented)
    return out


@pytest.fixture
def served(tmp_path, clock):
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token=TOKEN, clock=clock)
    yield server
    server.close()


class _Commit:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, view):
        return LocalTransactionState.COMMIT_MESSAGE


def test_remote_pull_equals_local_pull(served, clock):
    store = served.store
    p = store.producer("g")
    p.send(Message("t", b"plain"))
    p.send(Message("t", b"tagged", tags="a", keys="k1 k2", properties={"x": "y"}))
    for i in range(40):
        p.send(Message("t", b"many-%d" % i), queue_id=1)
    p.send(Message("t", b"due"), delay_ms=1, queue_id=2)
    store.transaction_producer("tx", _Commit()).send_in_transaction(Message("t", b"paid"))
    clock.advance(2000)  # past the due time (timer precision 1 s)
    assert store.deliver_due() == 1
    with connect(served.url, token=TOKEN) as remote, StoreReader.open(store.root) as local:
        for q in local.queue_ids("t"):
            hi = local.max_offset("t", q)
            for offset in range(0, hi + 1, 7):
                for n in (1, 32):
                    want = [_fields(v) for v in local.pull("t", q, offset, n)]
                    got = [_fields(v) for v in remote.pull("t", q, offset, n)]
                    assert got == want, (q, offset, n)
            assert remote.pull("t", q, hi) == [] == local.pull("t", q, hi)
            for bad in (hi + 1, -1):
                with pytest.raises(OffsetOutOfRangeError):
                    local.pull("t", q, bad)
                with pytest.raises(OffsetOutOfRangeError, match="out of range"):
                    remote.pull("t", q, bad)
        paid = [v for q in local.queue_ids("t") for v in remote.pull("t", q, 0, 64)
                if v.body == b"paid"]
        assert paid[0].transaction_id and paid[0].deliver_timestamp_ms is None
        with pytest.raises(InvalidMessageError):
            remote.pull("t", 0, 0, 0)
        with pytest.raises(UnknownTopicError):
            remote.pull("nope", 0, 0)


def test_remote_pull_sees_a_message_sent_after_the_bounds_were_read(served):
    """The queue bounds are a snapshot; a pull at its end asks again, as a local pull would
    see the new message at once."""
    with connect(served.url, token=TOKEN) as remote:
        remote.producer("g").send(Message("t", b"one"), queue_id=0)
        end = remote.max_offset("t", 0)
        served.store.producer("g").send(Message("t", b"two"), queue_id=0)
        assert [v.body for v in remote.pull("t", 0, end)] == [b"two"]


def _follow_sees_a_later_send(source, send) -> None:
    """``source.follow`` from the latest: the first time it has caught up (``stop``), a
    message is sent; the follower yields that one and nothing older."""
    sent = []

    def stop() -> bool:
        if not sent:
            sent.append(send(b"after-start"))
        return False

    items = source.follow("t", poll_interval_s=0.01, stop=stop)
    first = next(items)
    view = first[1] if isinstance(first, tuple) else first
    assert view.body == b"after-start" and sent


def test_remote_follow_sees_a_message_sent_after_it_started(served):
    served.store.producer("g").send(Message("t", b"before"))
    with connect(served.url, token=TOKEN) as remote:
        producer = remote.producer("g")
        _follow_sees_a_later_send(remote, lambda body: producer.send(Message("t", body)))
        # from the earliest, stopping at the end: everything, in queue order per queue
        seen = list(remote.follow("t", start="earliest", stop=lambda: True))
        assert sorted(v.body for v in seen) == [b"after-start", b"before"]


def test_local_and_group_follow_see_a_message_sent_after_they_started(tmp_path):
    with MessageStore.open(str(tmp_path / "s")) as store:
        producer = store.producer("g")
        producer.send(Message("t", b"before"))
        _follow_sees_a_later_send(store, lambda body: producer.send(Message("t", body)))
    with StoreGroup.create(str(tmp_path / "g"), 2) as group:
        gp = group.producer("g")
        gp.send(Message("t", b"before"))
        _follow_sees_a_later_send(group, lambda body: gp.send(Message("t", body)))
        names = {name for name, _ in group.follow("t", start="earliest", stop=lambda: True)}
        assert names <= {"store-0", "store-1"} and names


def test_follow_checks_its_arguments_at_the_call(served):
    with connect(served.url, token=TOKEN) as remote:
        with pytest.raises(InvalidConfigError, match="allowed: 'latest' or 'earliest'"):
            remote.follow("t", start="beginning")
        with pytest.raises(InvalidConfigError, match="poll_interval_s"):
            served.store.follow("t", poll_interval_s=0)


def test_a_url_naming_several_servers_says_what_to_use():
    # (several servers are the replicas of one replica set: connect() takes them)
    with pytest.raises(InvalidConfigError,
                       match="names several servers.*replica set go to connect"):
        RemoteAddress.parse("rmq://h1:7911,h2:7911")
