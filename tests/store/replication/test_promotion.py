"""Epochs and manual promotion (``rmq promote``): the leader's terms are copied to its
followers; a stopped follower holding everything its leader acknowledged becomes leader of a
new term; one behind is refused unless forced; the file must then name it."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from test_replica_set import SMALL, caught_up, commitlog_bytes, free_port, replica_file

from store import Message, NotLeaderError, ReplicaBehindError, StoreServer, connect, promote_replica
from store.base.errors import InvalidConfigError, StoreError
from store.files.epoch_file import read_epochs
from store.replication.replica import read_state


def start(tmp_path, name, port, rs):
    return StoreServer(str(tmp_path / name), SMALL, listen=f"127.0.0.1:{port}", replica_set=rs)


def test_a_caught_up_follower_is_promoted_and_the_old_leader_follows_it(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    leader, follower = start(tmp_path, "a", ports[0], rs), start(tmp_path, "b", ports[1], rs)
    try:
        with connect(leader.url) as remote:
            for i in range(20):
                remote.producer("g").send(Message("t", b"m%d" % i))
        end = caught_up(leader, follower)
        assert read_epochs(leader.path) == read_epochs(follower.path) == [(1, 0)]
        with pytest.raises(StoreError, match="server runs"):  # (its loop does not run here)
            promote_replica(follower.path, timeout_s=0.3)
        os.remove(os.path.join(follower.path, "config", "promote.request"))
    finally:
        follower.close()
        leader.close()
    done = promote_replica(str(tmp_path / "b"))
    assert done == {"epoch": 2, "start_offset": end, "leader_end": end, "lost_bytes": 0,
                    "forced": False}
    assert read_epochs(str(tmp_path / "b")) == [(1, 0), (2, end)]
    state = read_state(str(tmp_path / "b"))
    assert state["role"] == "leader" and state["promoted"] and state["epoch"] == 2
    with pytest.raises(StoreError, match="leads"):
        promote_replica(str(tmp_path / "b"))
    with pytest.raises(InvalidConfigError, match="promoted"):  # the file still names a
        start(tmp_path, "b", ports[1], rs)                     # leads: no second leader
    rs = replica_file(tmp_path, ports, leader=f"rmq://127.0.0.1:{ports[1]}")
    new, old = start(tmp_path, "b", ports[1], rs), start(tmp_path, "a", ports[0], rs)
    try:
        assert new.replica.role == "leader" and new.replica.epoch == 2
        with connect(new.url) as remote:
            remote.producer("g").send(Message("t", b"after"))
        with connect(old.url) as remote, pytest.raises(NotLeaderError, match=new.url):
            remote.producer("g").send(Message("t", b"refused"))
        end = caught_up(new, old)
        assert commitlog_bytes(old.path, end) == commitlog_bytes(new.path, end)
        assert read_epochs(old.path) == [(1, 0), (2, done["start_offset"])]
        assert old.replica.status()["epoch"] == 2
    finally:
        old.close()
        new.close()
    assert read_epochs(str(tmp_path / "b")) == [(1, 0), (2, done["start_offset"])]


def test_a_follower_behind_its_leader_is_promoted_only_when_forced(tmp_path):
    ports = free_port(), free_port()
    rs = replica_file(tmp_path, ports)
    lonely = start(tmp_path, "b", ports[1], rs)  # no leader runs: it never hears of one
    lonely.close()
    with pytest.raises(ReplicaBehindError, match="never heard"):
        promote_replica(str(tmp_path / "b"))
    leader, follower = start(tmp_path, "a", ports[0], rs), start(tmp_path, "b", ports[1], rs)
    try:
        leader.store.producer("g").send(Message("t", b"x"))
        end = caught_up(leader, follower)
    finally:
        follower.close()
        leader.close()
    status_path = tmp_path / "b" / "config" / "serve.json"
    status = json.loads(status_path.read_text())
    status["replication"]["leader_end"] = end + 500  # the leader had acknowledged more
    status_path.write_text(json.dumps(status))
    runner = CliRunner()
    from rmq_cli.cli import main

    refused = runner.invoke(main, ["promote", "--store", str(tmp_path / "b")])
    assert refused.exit_code == 1 and "500 bytes would be lost" in refused.output
    assert read_state(str(tmp_path / "b"))["role"] == "follower"
    forced = runner.invoke(main, ["promote", "--store", str(tmp_path / "b"), "--force",
                                  "--json"])
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.output) == {"epoch": 2, "start_offset": end,
                                         "leader_end": end + 500, "lost_bytes": 500,
                                         "forced": True}
    assert not os.path.exists(tmp_path / "c")
    with pytest.raises(InvalidConfigError, match="no replica set"):
        promote_replica(str(tmp_path / "a" / "commitlog"))
