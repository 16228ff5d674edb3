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


def test_each_report_on_the_exchange_is_checked_as_a_ticket_is():
    from types import SimpleNamespace

    from store.remote.replication_stream import REPORT_SCHEMA, exchange_requests

    def reports(*rows):
        return [SimpleNamespace(data=pa.RecordBatch.from_pylist(list(r), schema=REPORT_SCHEMA))
                for r in rows]

    body = {"op": "replicate_exchange", "file_size": 4096, "max_bytes": 1000, "wait_ms": 10,
            "replica": "rmq://127.0.0.1:1", "epoch": 3}
    got = list(exchange_requests(reports(
        [{"from": 0, "tail_crc": 0, "high_watermark": None}],
        [{"from": 250, "tail_crc": 7, "high_watermark": 250}]), body))
    assert [(r["from"], r["tail_crc"], r["high_watermark"], r["epoch"], r["replica"])
            for r in got] == [(0, 0, None, 3, "rmq://127.0.0.1:1"),
                              (250, 7, 250, 3, "rmq://127.0.0.1:1")]
    with pytest.raises(InvalidRequest, match="one row"):
        list(exchange_requests(reports([{"from": 0, "tail_crc": 0, "high_watermark": None}] * 2),
                               body))
    with pytest.raises(InvalidRequest, match="from=-1"):
        list(exchange_requests(reports([{"from": -1, "tail_crc": 0, "high_watermark": None}]),
                               body))
    with pytest.raises(InvalidRequest, match="wait_ms"):  # (checked before any report)
        list(exchange_requests(iter(()), dict(body, wait_ms=10**9)))
