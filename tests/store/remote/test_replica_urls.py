"""URLs naming the replicas of a replica set (``rmq://h1:7911,h2:7911``): parsed, and what a
client repeats after a failover (store/remote/failover.py)."""

from __future__ import annotations

import pytest

from store import InvalidConfigError, RemoteError, connect
from store.base.remote_address import RemoteAddress, parse_replicas, replicas_url
from store.remote.failover import _not_sent, may_repeat


def test_a_url_may_name_several_replicas():
    found = parse_replicas("rmq://h1:7911,h2:7912,[::1]:7913")
    assert found == (RemoteAddress("h1", 7911), RemoteAddress("h2", 7912),
                     RemoteAddress("::1", 7913))
    assert replicas_url(found) == "rmq://h1:7911,h2:7912,[::1]:7913"
    assert parse_replicas("rmqs://a:1,b:2")[1].tls
    assert parse_replicas("rmq://h:7911") == (RemoteAddress("h", 7911),)


@pytest.mark.parametrize("url, says", [
    ("rmq://h1:7911,h1:7911", "names a server twice"),
    ("rmq://h1:7911,h2", "a host and a port"),
    ("rmq://h1:7911,h2:7911/x", "nothing may follow"),
    ("rmq://u:p@h1:7911,h2:7911", "user or a token"),
])
def test_a_malformed_replica_url_is_refused(url, says):
    with pytest.raises(InvalidConfigError, match=says):
        parse_replicas(url)


def test_one_server_is_still_one_address():
    with pytest.raises(InvalidConfigError, match="several servers"):
        RemoteAddress.parse("rmq://h1:7911,h2:7911")
    with connect("rmq://h1:7911,h2:7911") as store:  # nothing is sent before a call
        assert store.root == "rmq://h1:7911,h2:7911" and len(store.addresses) == 2


def test_only_sends_that_are_safe_to_repeat_are_repeated_after_a_lost_answer():
    assert not may_repeat("send", {"key": None})
    assert may_repeat("send", {"key": "order-7"})  # a keyed timer message replaces itself
    for once in ("send_batch", "send_table", "send_half", "sink_stage"):
        assert not may_repeat(once)
    for again in ("read", "snapshot", "sink_commit", "end_transactions", "replace_table",
                  "schedule", "cancel"):
        assert may_repeat(again)


def test_a_stream_removed_mid_call_is_not_taken_for_a_request_never_sent():
    """A server killed after it took a send breaks the stream with an "unavailable" error,
    as a refused connection does; only the latter says nothing was sent (the former, taken
    for it, re-sent a stored message to the new leader: a duplicate)."""
    where = "the store server rmq://127.0.0.1:1 cannot be reached (Flight returned unavailable"
    assert _not_sent(RemoteError(f"{where} error, with message: failed to connect to all "
                                 "addresses; last error: Connection refused)"))
    assert not _not_sent(RemoteError(f"{where} error, with message: Stream removed (Socket "
                                     "closed))"))
