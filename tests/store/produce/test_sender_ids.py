"""Messages sent with their sender's id (``Producer.send(msg_id=...)``, what RocketMQ 5
clients do), and cancelling such a delayed message by where it waits."""

from __future__ import annotations

import pytest

from store import InvalidMessageError, Message


def test_send_keeps_the_given_id_plain_delayed_and_transactional(store, clock):
    p = store.producer()
    plain = p.send(Message("t", b"a"), msg_id="0102FC000000010D070B1C5D8600000000")
    timer = p.send(Message("t", b"b"), delay_ms=5_000, msg_id="client-id.2")
    level = p.send(Message("t", b"c"), delay_level=1, msg_id="client_id-3")

    class Commit:
        def execute_local_transaction(self, message, arg):
            return "COMMIT_MESSAGE"

        def check_local_transaction(self, view):
            return "COMMIT_MESSAGE"

    tx = store.transaction_producer("g", Commit()).send_in_transaction(
        Message("t", b"d"), msg_id="tx-4")
    assert (plain.msg_id, timer.msg_id, level.msg_id, tx.msg_id, tx.transaction_id) == (
        "0102FC000000010D070B1C5D8600000000", "client-id.2", "client_id-3", "tx-4", "tx-4")
    clock.advance(10_000)
    store.deliver_due()
    ids = {v.msg_id: bytes(v.body) for q in store.queue_ids("t")
           for v in store.pull("t", q, 0, 100)}
    assert ids == {"0102FC000000010D070B1C5D8600000000": b"a", "client-id.2": b"b",
                   "client_id-3": b"c", "tx-4": b"d"}


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "a\x01b", "ü", 7, b"bytes"])
def test_a_bad_id_is_refused_and_nothing_is_stored(store, bad):
    p = store.producer()
    with pytest.raises(InvalidMessageError, match="msg_id"):
        p.send(Message("t", b"a"), msg_id=bad)
    with pytest.raises(InvalidMessageError, match="msg_id"):
        p.send(Message("t", b"a"), delay_ms=1000, msg_id=bad)
    assert "t" not in store.topics() or all(
        store.max_offset("t", q) == 0 for q in store.queue_ids("t"))


def test_cancel_by_stored_queue_offset_finds_ids_the_store_did_not_make(store, clock):
    p = store.producer()
    r = p.send(Message("t", b"x"), delay_ms=5_000, msg_id="made-by-a-client")
    other = p.send(Message("t", b"y"), delay_ms=5_000, msg_id="another")
    assert not p.cancel("t", "made-by-a-client")  # the id carries no time to search by
    assert not p.cancel("t", "made-by-a-client", stored_queue_offset=other.stored_queue_offset)
    assert not p.cancel("u", "made-by-a-client", stored_queue_offset=r.stored_queue_offset)
    assert p.cancel("t", "made-by-a-client", stored_queue_offset=r.stored_queue_offset)
    assert not p.cancel("t", "made-by-a-client", stored_queue_offset=r.stored_queue_offset)
    with pytest.raises(InvalidMessageError, match="stored_queue_offset"):
        p.cancel("t", "another", stored_queue_offset=-1)
    clock.advance(10_000)
    store.deliver_due()
    bodies = [bytes(v.body) for q in store.queue_ids("t") for v in store.pull("t", q, 0, 10)]
    assert bodies == [b"y"]
