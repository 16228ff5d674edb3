"""A follower's requests on one ``DoExchange`` kept open (``replicate_exchange``): reports up,
chunks down, each answer ended by an empty batch; a leader of an earlier version (which
refuses the op) is asked with ``DoGet`` tickets instead.  Servers in this process on
loopback."""

from __future__ import annotations

import pyarrow as pa
import pytest
from test_replica_set import SMALL, Clock, commitlog_bytes, free_port, replica_file
from test_sync_replication import following, same_log

from store import Message, StoreServer, connect
from store.remote import flight_service
from store.remote.wire import InvalidRequest


def pair(tmp_path, earlier_leader: bool = False, monkeypatch=None):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports, min_insync_replicas=2, replica_ack_timeout_ms=10_000)
    if earlier_leader:  # (a leader of an earlier version: it knows no such exchange op)
        def refuse(self, context, body, reader, writer):
            raise InvalidRequest(f"unknown exchange op {body['op']!r}; allowed: 'send_table', "
                                 "'replace_table', 'schedule_table'")

        monkeypatch.setattr(flight_service.StoreService, "_replicate_exchange", refuse)
    clock = Clock()
    servers = [StoreServer(str(tmp_path / name), SMALL, clock=clock,
                           listen=f"127.0.0.1:{port}", replica_set=rs)
               for name, port in zip("ab", ports)]
    following(servers[1])
    return servers


@pytest.mark.parametrize("earlier_leader", [False, True], ids=["exchange", "earlier-leader"])
def test_a_follower_reports_on_one_stream_or_with_tickets_to_an_earlier_leader(
        tmp_path, monkeypatch, earlier_leader):
    leader, follower = pair(tmp_path, earlier_leader, monkeypatch)
    try:
        requests = follower.replica.follower._log
        with connect(leader.url) as remote:
            p = remote.producer("g")
            for i in range(20):
                p.send(Message("t", b"one-%d" % i))
                # (synchronous: acknowledged once the follower reported holding it)
                assert follower.store.confirmed_offset() >= leader.store.confirmed_offset()
            p.send_table(pa.table({"body": [b"x%d" % i for i in range(3000)]}), topic="bulk")
            assert follower.store.confirmed_offset() >= leader.store.confirmed_offset()
        end = same_log(leader, follower)
        assert commitlog_bytes(follower.path, end) == commitlog_bytes(leader.path, end)
        if earlier_leader:
            assert requests.supported is False and requests._call is None
        else:
            assert requests.supported is None and requests._call is not None
            opened = requests._call[3]
            with connect(leader.url) as remote:
                remote.producer("g").send(Message("t", b"later"))
            assert requests._call[3] == opened  # (the same stream: no new one per report)
        assert leader.replica.status()["ack_timeouts"] == 0
    finally:
        follower.close()
        leader.close()
