"""A worker process of a replica's gRPC endpoint appends under the role its server publishes
(:mod:`store.proxy.worker_role`), shown here with the store opened in this process and the
role written by the test as the server would."""

from __future__ import annotations

import threading
import time

import pytest

from store import Message, MessageStore
from store.base.errors import LeaderDeposedError, NotLeaderError, ReplicaAckTimeoutError
from store.files.replica_role import RoleFile, monotonic_ms
from store.proxy.worker_role import WorkerRole


@pytest.fixture
def worker(tmp_path):
    """``(store, role_file, make)``: a store, its role file (the server's side), and
    ``make(min_insync)`` installing a :class:`WorkerRole` on the store."""
    store = MessageStore.open(str(tmp_path / "s"))
    published = RoleFile.create(store.root)

    def make(min_insync: int = 2, timeout_ms: int = 300) -> WorkerRole:
        return WorkerRole(store, min_insync_replicas=min_insync,
                          replica_ack_timeout_ms=timeout_ms)
    yield store, published, make
    published.close()
    store.close()


def lead(published: RoleFile, epoch: int = 1, acked: int = -1, lease_ms: int = 10_000) -> None:
    published.write(epoch, True, monotonic_ms() + lease_ms, acked)


def test_nothing_is_appended_unless_the_replica_leads_within_its_lease(worker):
    store, published, make = worker
    role = make(min_insync=1)
    send = store.producer("g").send
    with pytest.raises(LeaderDeposedError, match="does not lead"):
        send(Message("t", b"x"))  # the file says "not leading" until the server says more
    with pytest.raises(NotLeaderError):
        role.check_write("SendMessage")
    lead(published)
    send(Message("t", b"a"))  # asynchronous replication: the role alone is checked
    lead(published, lease_ms=-1)  # the server stopped renewing
    end = store.confirmed_offset()
    with pytest.raises(LeaderDeposedError, match="lease ran out"):
        send(Message("t", b"y"))
    assert store.confirmed_offset() == end  # nothing of a refused write


def test_a_write_is_acknowledged_once_the_published_end_covers_it(worker):
    store, published, make = worker
    make(min_insync=2, timeout_ms=300)
    lead(published, acked=0)
    send = store.producer("g").send
    started = time.monotonic()
    with pytest.raises(ReplicaAckTimeoutError, match="did not hold it within 300 ms"):
        send(Message("t", b"a"))
    assert time.monotonic() - started >= 0.29
    end = store.confirmed_offset()

    def copies_come() -> None:  # the followers' reports, as the server publishes them
        time.sleep(0.1)
        lead(published, acked=end + 10_000)
    threading.Thread(target=copies_come).start()
    started = time.monotonic()
    send(Message("t", b"b"))
    assert 0.09 <= time.monotonic() - started < 0.3


def test_a_change_of_role_while_a_write_waits_fails_it_as_deposed(worker):
    store, published, make = worker
    make(min_insync=2, timeout_ms=5_000)
    lead(published, epoch=3, acked=0)
    send = store.producer("g").send
    for change in (lambda: published.write(3, False, 0, -1),        # deposed
                   lambda: lead(published, epoch=4, acked=1 << 40)):  # a later term
        threading.Timer(0.1, change).start()
        started = time.monotonic()
        with pytest.raises(LeaderDeposedError, match="changed role"):
            send(Message("t", b"a"))
        assert time.monotonic() - started < 2
        lead(published, epoch=3, acked=0)


def test_copied_but_the_lease_lapsed_is_not_acknowledged(worker):
    store, published, make = worker
    make(min_insync=2, timeout_ms=300)
    lead(published, lease_ms=100)  # the append is within the lease; the copies come after
    threading.Timer(0.15, lambda: published.write(  # it ran out, never renewed (frozen)
        1, True, monotonic_ms() - 1, 1 << 40)).start()
    with pytest.raises(LeaderDeposedError, match="stopped renewing"):
        store.producer("g").send(Message("t", b"a"))
