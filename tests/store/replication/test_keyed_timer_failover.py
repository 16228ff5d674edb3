"""A keyed timer message replaced before a change of leader stays replaced after it.

Found by the fault run (tools/fault_run.py --minutes 25 --seed 7 --replicas 3, synchronous):
a keyed timer send (``key=``) whose first try's outcome was lost was sent again by the
client, the second record replacing the first; the second was delivered when due, and the
first, replaced, was delivered too, eight minutes later, by a later leader (its delivered
copy carries ``TIMER_ENQUEUE_MS`` 9223372036854775807): a follower never made the delay-key
table (it sends nothing), so as leader its timer did not know the first was replaced."""

from __future__ import annotations

import json
import time

from test_replica_set import Clock, free_port
from test_sync_replication import bodies, following, serve

from store import Message


def test_a_replaced_keyed_timer_message_is_not_delivered_by_the_next_leader(tmp_path):
    ports = free_port(), free_port()
    rs = tmp_path / "replicas.json"
    rs.write_text(json.dumps({"replicas": [f"rmq://127.0.0.1:{p}" for p in ports]}))
    clock = Clock()
    a, b = serve(tmp_path, "a", ports[0], str(rs), clock), serve(tmp_path, "b", ports[1],
                                                                 str(rs), clock)
    following(b)
    try:
        p = a.store.producer("g")
        p.send(Message("orders", b"first try"), delay_ms=2000, key="k")
        p.send(Message("orders", b"second try"), delay_ms=3000, key="k")  # replaces it
        end = a.store.confirmed_offset()
        while b.store.confirmed_offset() < end:  # (copied before the loss)
            time.sleep(0.01)
    finally:
        a.close()  # the leader is lost before either is due
    try:
        b.replica.become_leader(force=True)
        clock.now += 10_000
        b.step()
        assert bodies(b.store, "orders") == {b"second try": 1}
    finally:
        b.close()


def test_a_tail_cut_under_the_key_table_rebuilds_it(tmp_path):
    """Found by the hour-long fault run (seed 21): three keyed timer messages, each sent
    again by its client across a failover, had their first try delivered by a later
    leader, minutes after the second.  A former leader's delay-key table (``timerkeys``)
    kept the queue offset it had indexed to; a tail cut dropped records below that offset
    and its new leader's records took their places, which the table never read: it named
    the first try still.  The table is now set aside with the services' progress at a cut
    or a change of role, and a new leader rebuilds it from the timer topic."""
    from store import MessageStore
    from store.replication.truncation import set_aside_progress_of
    from tests.conftest import SMALL

    now = [1_790_000_000_000]
    with MessageStore.open(str(tmp_path / "s"), SMALL, clock=lambda: now[0]) as store:
        p = store.producer("g")
        p.send(Message("orders", b"first try"), delay_ms=5_000, key="k")
        cut = store.confirmed_offset()
        p.send(Message("orders", b"other"), delay_ms=5_000, key="other")
        store.deliver_due()  # the table reads both (indexed past the cut)
        store.drop_tail(cut)  # a tail cut, as a former leader's on rejoining
        set_aside_progress_of(store, "a tail cut (test)")
        # the new leader's record, copied into the place of the cut one
        p.send(Message("orders", b"second try"), delay_ms=6_000, key="k")
        store.timer.keys.take_over()  # what a replica does as it starts leading
        now[0] += 10_000
        store.deliver_due()
        assert bodies(store, "orders") == {b"second try": 1}
