"""Recurring schedules in a replica set: the book is recorded in the CommitLog, a follower
holds it, and a new leader goes on with each schedule's phase and count."""

from __future__ import annotations

import os

from test_replica_set import SMALL, Clock, caught_up, free_port, replica_file
from test_sync_replication import following, serve

from store import Message, MessageStore, connect
from store.formats.record_codec import RecordSpec
from store.schedule.schedule_book import (
    BOOK_TOPIC,
    PROPERTY_SCHEDULE_FIRE_MS,
    PROPERTY_SCHEDULE_KEY,
)


def fire_times(store, topic="ticks") -> list[int]:
    if topic not in store.topics():
        return []
    return sorted(v.deliver_timestamp_ms for q in store.queue_ids(topic)
                  for v in store.pull(topic, q, 0, 1000))


def test_a_new_leader_goes_on_with_the_schedules_of_its_old_leader(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    clock = Clock()
    a, b = serve(tmp_path, "a", ports[0], rs, clock), serve(tmp_path, "b", ports[1], rs, clock)
    following(b)
    try:
        p = a.store.producer("g")
        first = p.schedule(Message("ticks", b"tick"), key="tick", every_ms=1000).next_fire_ms
        p.schedule(Message("ticks", b"idle"), key="idle", every_ms=5000)
        assert a.store.pause_schedule("idle")
        for _ in range(3):
            clock.now += 1000
            a.step()
        assert fire_times(a.store) == [first, first + 1000, first + 2000]
        caught_up(a, b)
        with connect(b.url) as remote:  # the follower's readers see the leader's book
            held = {s.key: s for s in remote.schedules()}
        assert held["tick"].fires == 3 and held["tick"].next_fire_ms == first + 3000
        assert held["idle"].paused
        assert not os.path.exists(os.path.join(b.path, "config", "rmq_schedules.json"))
    finally:
        a.close()  # the leader is lost
    try:
        b.replica.become_leader()
        assert b.step() == 0  # nothing due yet: nothing fired twice
        clock.now += 1000
        assert b.step() == 1  # the next due time of the same phase, fired once
        assert fire_times(b.store) == [first + i * 1000 for i in range(4)]
        now = {s.key: s for s in b.store.schedules()}
        assert now["tick"].fires == 4 and now["tick"].next_fire_ms == first + 4000
        assert now["idle"].paused and now["idle"].fires == 0
    finally:
        b.close()


def test_copies_fired_after_the_books_last_record_are_counted(tmp_path):
    """A leader lost between a firing step's copies and the book's record: whoever takes the
    book from the log counts the copies it finds after the record."""
    clock = Clock()
    with MessageStore.open(str(tmp_path / "s"), clock=clock) as store:
        store.recurring.replicated = True
        first = store.producer("g").schedule(Message("ticks", b"tick"), key="tick",
                                             every_ms=1000).next_fire_ms
        assert store.max_offset(BOOK_TOPIC, 0) == 1  # the book's record
        for i in range(2):  # two copies appended as a firing step would, no record after
            store.append([RecordSpec(topic="ticks", body=b"tick", queue_id=0, properties={
                PROPERTY_SCHEDULE_KEY: "tick", PROPERTY_SCHEDULE_FIRE_MS: str(first + i * 1000)})])
        os.remove(os.path.join(store.root, "config", "rmq_schedules.json"))  # (set aside)
        (info,) = store.schedules()
        assert info.fires == 2 and info.next_fire_ms == first + 2000
        clock.now = first + 2000
        assert store.deliver_due() == 1
        assert store.max_offset(BOOK_TOPIC, 0) == 2  # the firing step's record
    with MessageStore.open(str(tmp_path / "s"), clock=clock) as store:
        (info,) = store.schedules()  # a lone store reads its file, as before
        assert info.fires == 3 and info.next_fire_ms == first + 3000


def test_a_book_written_before_its_store_led_a_replica_set_reaches_its_follower(tmp_path):
    clock = Clock()
    with MessageStore.open(str(tmp_path / "a"), SMALL, clock=clock) as store:  # (alone)
        store.producer("g").schedule(Message("ticks", b"tick"), key="tick", every_ms=1000)
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    a, b = serve(tmp_path, "a", ports[0], rs, clock), serve(tmp_path, "b", ports[1], rs, clock)
    try:
        following(b)
        caught_up(a, b)
        with connect(b.url) as remote:
            assert [s.key for s in remote.schedules()] == ["tick"]
        assert [s.key for s in a.store.schedules()] == ["tick"]  # (still the leader's)
    finally:
        b.close()
        a.close()
