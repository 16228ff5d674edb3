"""Bounds of the Flight face: streams per client and in all, refused-call log lines per
second, the warning of a listener without TLS."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from store import Message, MessageStore, connect
from store.base.remote_address import RemoteAddress
from store.remote.flight_limits import RateLimitedLog, StreamLimits, peer_host
from store.remote.flight_service import StoreService
from store.remote.wire import Overloaded


def test_streams_are_bounded_per_client_and_in_all():
    limits = StreamLimits(per_client=2, in_all=3)
    a1 = limits.admit("ipv4:10.0.0.1:1000", "read")
    limits.admit("ipv4:10.0.0.1:1001", "read")
    with pytest.raises(Overloaded, match="at most 2 per client"):
        limits.admit("ipv4:10.0.0.1:1002", "read")
    b1 = limits.admit("ipv6:[::1]:1000", "read")
    with pytest.raises(Overloaded, match="3 in all"):
        limits.admit("ipv4:10.0.0.9:1", "read")
    a1()
    a1()  # a second release changes nothing
    assert limits.in_progress == 2
    limits.admit("ipv4:10.0.0.1:1003", "read")
    b1()
    assert peer_host("ipv6:[::1]:5") == "ipv6:[::1]" and peer_host("x") == "x"


def test_refused_calls_are_logged_at_a_bounded_rate(caplog):
    now = [100.0]
    logger = logging.getLogger("test.refused")
    limited = RateLimitedLog(logger, per_second=3, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.refused"):
        logged = [limited.warning("refused %d", i) for i in range(1000)]
        assert sum(logged) == 3 and len(caplog.records) == 3
        now[0] += 1
        limited.warning("refused %d", 1000)
    assert "997 refused call(s) not logged" in caplog.records[-1].getMessage()


def test_a_stream_past_the_bound_is_refused_typed_and_others_go_on(tmp_path):
    store = MessageStore.open(str(tmp_path / "s"))
    service = StoreService(store, RemoteAddress.listen("127.0.0.1:0"),
                           stream_limits=StreamLimits(per_client=1, in_all=1))
    try:
        url = service.url
        with connect(url) as remote:
            remote.producer("g").send_table(pa.table({
                "body": [b"x"] * 10, "queue_id": pa.array([0] * 10, pa.int32())}), topic="t")
            hold = service._streams.admit("ipv4:127.0.0.1:1", "held")  # one stream open
            with pytest.raises(Overloaded, match="at most 1 per client"):
                remote.read_arrow("t", 0, 0, 1)
            remote.producer("g").send(Message("t", b"action"))  # an action: not a stream
            hold()
            assert remote.read_arrow("t", 0, 0, 1).num_rows == 1
    finally:
        service.shutdown()
        service.close_readers()
        store.close()


@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("127.0.0.1", False)])
def test_a_listener_off_loopback_without_tls_warns_that_tokens_travel_in_clear(
        tmp_path, caplog, host, warned):
    store = MessageStore.open(str(tmp_path / "s"))
    try:
        with caplog.at_level(logging.WARNING, logger="store.remote"):
            service = StoreService(store, RemoteAddress.listen(f"{host}:0"), token="t")
        service.shutdown()
        assert ("travel in clear" in caplog.text) is warned
    finally:
        store.close()


def test_half_messages_of_many_groups_keep_a_bounded_number_of_producers(tmp_path):
    """A client names any producer group: the server keeps the producers (and their
    listeners in the store's transaction service) of the most recent
    ``HALF_PRODUCER_GROUPS`` only; the code before kept one of each group for ever."""
    from store.produce.transaction_producer import LeaveOpen
    from store.remote import flight_service

    class Undecided:
        def execute_local_transaction(self, message, arg):
            return None

    store = MessageStore.open(str(tmp_path / "s"))
    service = StoreService(store, RemoteAddress.listen("127.0.0.1:0"))
    bound = getattr(flight_service, "HALF_PRODUCER_GROUPS", 64)
    groups = bound + 40
    try:
        with connect(service.url) as remote:
            for i in range(groups):
                result = remote.transaction_producer(f"g{i}", Undecided()).send_in_transaction(
                    Message("t", b"half"))
                assert result.transaction_id
            mine = [g for g, listener in store.transactions._listeners.items()
                    if isinstance(listener, LeaveOpen)]
            assert len(service._half_producers) == bound
            assert sorted(mine) == sorted(service._half_producers)
            assert f"g{groups - 1}" in mine and "g0" not in mine
            # an evicted group is made again; its halves end as any others
            again = remote.transaction_producer("g0", Undecided()).send_in_transaction(
                Message("t", b"half"))
            assert remote.end_transaction(again.transaction_id, "COMMIT_MESSAGE")
    finally:
        service.shutdown()
        service.close_readers()
        store.close()


def test_opened_transactions_forget_the_oldest_past_their_bound():
    from store.base.errors import AccessDeniedError
    from store.remote.rights import OpenedTransactions

    class Account:
        access_key, admin = "orders-svc", False

    opened = OpenedTransactions(limit=3)
    for t in ("a", "b", "c", "d"):
        opened.opened(Account, t)
    opened.require_own(Account, ["b", "c", "d"], "end")
    with pytest.raises(AccessDeniedError, match="did not open transaction 'a'"):
        opened.require_own(Account, ["a"], "end")  # the oldest, forgotten


@pytest.mark.slow
def test_opened_transactions_hold_under_32_mib_at_their_bound():
    import os
    import tracemalloc

    from store.remote.rights import MAX_OPENED_TRANSACTIONS, OpenedTransactions

    class Account:
        access_key, admin = "orders-svc", False

    full = OpenedTransactions()
    tracemalloc.start()
    try:
        for _ in range(MAX_OPENED_TRANSACTIONS + 10):
            full.opened(Account, os.urandom(16).hex().upper())
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 32 << 20, f"{held >> 20} MiB at the bound"  # (was 1M ids: about 170 MB)
