"""The high watermark (readers of a replica see only what enough replicas hold) and a
follower's retention (it deletes what its leader no longer keeps): servers in this process
on loopback, steps called by hand."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest
from click.testing import CliRunner
from test_replica_set import SMALL, caught_up, free_port, replica_file
from test_sync_replication import following, serve

from rmq_cli.cli import main
from store import (
    Message,
    OffsetOutOfRangeError,
    ReplicaAckTimeoutError,
    StoreServer,
    connect,
    promote_replica,
)
from store.remote import flight_service
from store.replication.replica import read_state

SYNC = {"min_insync_replicas": 2, "replica_ack_timeout_ms": 300}


@pytest.fixture(autouse=True)
def short_read_wait(monkeypatch):
    """A read past the watermark waits 0.2 s for it (not 5 s)."""
    monkeypatch.setattr(flight_service, "READ_BOUND_WAIT_S", 0.2)


def seen(url, topic="t") -> list[bytes]:
    """Every body a client of ``url`` reads of ``topic`` (its snapshot, then its queues)."""
    with connect(url) as client:
        client.refresh()
        if topic not in client.topics():
            return []
        return [v.body for q in client.queue_ids(topic)
                for v in client.pull(topic, q, 0, 10_000)]


def eventually(check, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def sync_pair(tmp_path):
    """A leader and its follower (following), ``min_insync_replicas: 2``: the ports, the
    replica-set file and the two servers."""
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, **SYNC)
    a, b = serve(tmp_path, "a", ports[0], rs), serve(tmp_path, "b", ports[1], rs)
    following(b)
    return ports, rs, a, b


def test_a_reader_of_the_leader_sees_a_record_only_once_its_follower_holds_it(tmp_path):
    ports, rs, a, b = sync_pair(tmp_path)
    try:
        for i in range(5):
            a.store.producer("g").send(Message("t", b"m-%d" % i), queue_id=0)
        assert seen(a.url) == [b"m-%d" % i for i in range(5)]  # acknowledged: visible
        acked_end = a.store.confirmed_offset()
        b.close()  # the follower stops: nothing new is held by 2 replicas
        with pytest.raises(ReplicaAckTimeoutError):
            a.store.producer("g").send(Message("t", b"late", keys="late-key"), queue_id=0)
        assert a.store.max_offset("t", 0) == 6  # in the leader's log (its services read it)
        assert a.replica.status()["high_watermark"] == acked_end
        assert seen(a.url) == [b"m-%d" % i for i in range(5)]  # the read stops at the mark
        with connect(a.url) as client:
            assert client.queue_bounds([("t", 0)]) == {("t", 0): (0, 5)}
            assert client.pull("t", 0, 5) == []
            with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
                client.read_arrow("t", 0, 0, 6)  # a range planned past it: refused
            assert client.query_messages("t", key="late-key") == []
            assert len(client.query_messages("t")) == 5
        a.step()  # the watermark recorded: a restarted leader shows what it showed
        assert read_state(a.path)["high_watermark"] == acked_end
        a.close()
        shown = CliRunner().invoke(main, ["stats", "--store", a.path, "--json"])
        assert json.loads(shown.output)["replication"]["high_watermark"] == acked_end
        shown = CliRunner().invoke(main, ["stats", "--store", a.path])
        assert f"readers see the CommitLog below {acked_end} (high watermark)" in shown.output
        a = serve(tmp_path, "a", ports[0], rs)
        assert seen(a.url) == [b"m-%d" % i for i in range(5)]
        b = serve(tmp_path, "b", ports[1], rs)  # the follower back: the mark advances
        eventually(lambda: len(seen(a.url)) == 6)
        assert seen(a.url)[-1] == b"late"
        with connect(a.url) as client:
            assert client.read_arrow("t", 0, 0, 6).num_rows == 6
    finally:
        b.close()
        a.close()


def test_after_a_change_of_leader_nothing_a_reader_saw_is_gone(tmp_path):
    ports, rs, a, b = sync_pair(tmp_path)
    try:
        for i in range(10):
            a.store.producer("g").send(Message("t", b"m-%d" % i))
    finally:
        b.close()
    try:
        for i in range(3):  # on a only: in the tail a will cut
            with pytest.raises(ReplicaAckTimeoutError):
                a.store.producer("g").send(Message("t", b"late-%d" % i))
        read_before = seen(a.url)
        assert sorted(read_before) == sorted(b"m-%d" % i for i in range(10))
    finally:
        a.close()
    promote_replica(str(tmp_path / "b"))
    rs = replica_file(tmp_path, ports, leader=f"rmq://127.0.0.1:{ports[1]}", **SYNC)
    new, old = serve(tmp_path, "b", ports[1], rs), serve(tmp_path, "a", ports[0], rs)
    try:
        following(old)
        new.store.producer("g").send(Message("t", b"after"))
        assert old.replica.status()["last_cut"]["records"] == 3
        for url in (new.url, old.url):
            eventually(lambda url=url: b"after" in seen(url))
            assert set(read_before) <= set(seen(url))
    finally:
        old.close()
        new.close()


def test_a_follower_reader_sees_only_below_its_leaders_watermark(tmp_path):
    """Three replicas, all three needed: with c stopped, b holds a write its leader could
    not acknowledge, and b's readers do not see it until c holds it too."""
    ports = free_port(), free_port(), free_port()
    rs = replica_file(tmp_path, ports, min_insync_replicas=3, replica_ack_timeout_ms=300)
    a, b, c = (serve(tmp_path, n, p, rs) for n, p in zip("abc", ports))
    following(b, c)
    try:
        a.store.producer("g").send(Message("t", b"all"))
        eventually(lambda: seen(b.url) == [b"all"])
        c.close()
        with pytest.raises(ReplicaAckTimeoutError):
            a.store.producer("g").send(Message("t", b"two"))
        caught_up(a, b)  # b holds it ...
        assert b.store.max_offset("t", 0) + b.store.max_offset("t", 1) + \
            b.store.max_offset("t", 2) + b.store.max_offset("t", 3) == 2
        time.sleep(0.6)  # (one more answer of the leader's, at least)
        assert seen(b.url) == [b"all"]  # ... its readers do not see it
        assert b.replica.status()["high_watermark"] < b.store.confirmed_offset()
        c = serve(tmp_path, "c", ports[2], rs)
        eventually(lambda: sorted(seen(b.url)) == [b"all", b"two"])
        eventually(lambda: sorted(seen(c.url)) == [b"all", b"two"])
    finally:
        c.close()
        b.close()
        a.close()


def test_with_one_insync_replica_the_watermark_is_the_leaders_end(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)  # asynchronous
    a = serve(tmp_path, "a", ports[0], rs)  # its follower never runs
    try:
        a.store.producer("g").send(Message("t", b"alone"))
        assert a.replica.high_watermark() is None  # readers are not bound
        assert a.replica.status()["high_watermark"] == a.store.confirmed_offset()
        assert seen(a.url) == [b"alone"]
    finally:
        a.close()


def _segments(root: str) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "commitlog")))


def test_a_follower_deletes_the_segments_its_leader_no_longer_keeps(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    a = StoreServer(str(tmp_path / "a"), SMALL, listen=f"127.0.0.1:{ports[0]}", replica_set=rs)
    b = StoreServer(str(tmp_path / "b"), SMALL, listen=f"127.0.0.1:{ports[1]}", replica_set=rs)
    try:
        with connect(a.url) as remote:
            remote.producer("g").send_table(
                pa.table({"body": [b"x" * 1000 + b"%d" % i for i in range(1500)]}), topic="t")
        caught_up(a, b)
        assert len(_segments(b.path)) >= 5 and _segments(a.path) == _segments(b.path)
        assert a.store.clean_expired_files(force=True) >= 4  # the leader's retention
        a.store.producer("g").send(Message("t", b"next"), queue_id=0)
        eventually(lambda: _segments(b.path) == _segments(a.path))
        assert b.store.commit_log.min_offset() == a.store.commit_log.min_offset() > 0
        queues = a.store.queue_ids("t")
        assert [b.store.min_offset("t", q) for q in queues] == \
            [a.store.min_offset("t", q) for q in queues] and a.store.min_offset("t", 0) > 0
        # never past what it copied itself: the newest segment, and what lies past its end
        b.replica.follow_retention(b.store.confirmed_offset() + (1 << 30))
        assert _segments(b.path) == _segments(a.path)[-1:]
        assert sum(b.store.max_offset("t", q) for q in queues) == 1501
    finally:
        b.close()
        a.close()
