"""What a replica's server publishes to its gRPC workers (:mod:`store.replication.role_publisher`),
with a stand-in replica."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from store.files.replica_role import LEASE_MS, RENEW_MS, RoleFile, monotonic_ms
from store.replication.role_publisher import RolePublisher


def stand_in(tmp_path, **more):
    os.makedirs(tmp_path / "config", exist_ok=True)
    store = SimpleNamespace(root=str(tmp_path), appender=SimpleNamespace(not_leading=None))
    fields = {"store": store, "role": "leader", "epoch": 4, "elected": False,
              "lease_until": 0.0, "clock": time.monotonic, "acks": None}
    return SimpleNamespace(**{**fields, **more})


def test_a_leader_publishes_its_epoch_lease_and_acknowledged_end(tmp_path):
    replica = stand_in(tmp_path, acks=SimpleNamespace(acked=123))
    publisher = RolePublisher(replica)
    reader = RoleFile.open(str(tmp_path))
    try:
        role = reader.read()
        now = monotonic_ms()
        assert (role.epoch, role.leading, role.acked_end) == (4, True, 123)
        assert now < role.lease_until_ms <= now + LEASE_MS
        first = role.lease_until_ms
        time.sleep(3 * RENEW_MS / 1000)
        assert reader.read().lease_until_ms > first  # renewed
        replica.store.appender.not_leading = "deposed"  # (as _refuse_writes, then publishes)
        publisher.publish()
        assert not reader.read().takes_writes(monotonic_ms())
        replica.store.appender.not_leading = None
        publisher.publish()
        publisher.close()
        assert not reader.read().leading  # a stopped server's workers take no writes
    finally:
        reader.close()
        publisher.close()


def test_an_elected_leaders_workers_never_outlive_its_lease_from_the_voters(tmp_path):
    replica = stand_in(tmp_path, elected=True)
    replica.lease_until = replica.clock() + 0.05
    publisher = RolePublisher(replica)
    reader = RoleFile.open(str(tmp_path))
    try:
        role = reader.read()
        assert role.leading and role.lease_until_ms <= monotonic_ms() + 50
        time.sleep(0.1)  # the voters did not renew it: neither does the server
        assert not reader.read().takes_writes(monotonic_ms())
    finally:
        reader.close()
        publisher.close()
