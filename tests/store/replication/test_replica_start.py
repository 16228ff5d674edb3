"""A replica-set member takes no write as a lone store while its server starts.

Found by the fault run (tools/fault_run.py, seed 1, three replicas, synchronous): a follower
SIGKILLed and restarted took client sends in the moment between its Flight face starting to
listen and its replica role being attached.  It answered the clients' ``leader`` question
with "leading" (a lone store leads itself) and acknowledged their sends with no copy on any
other replica; the sends were then missing from the elected leader's log, and the
restarted replica's log no longer a prefix of the leader's (it stopped following,
"diverged")."""

from __future__ import annotations

import json

import pytest
from test_replica_set import SMALL, free_port

from store import Message, MessageStore, NotLeaderError, StoreError, StoreServer, connect
from store.replication import replica as replica_module


def test_no_write_is_taken_before_the_replica_role_is_attached(tmp_path, monkeypatch):
    port, other, witness = free_port(), free_port(), free_port()
    urls = [f"rmq://127.0.0.1:{p}" for p in (port, other, witness)]
    rs = tmp_path / "replicas.json"
    rs.write_text(json.dumps({"replicas": urls[:2], "witness": urls[2],
                              "min_insync_replicas": 2}))
    tried = []
    original = replica_module.Replica.__init__

    def attach(self, *args, **kwargs):
        # a client's send arriving while the server attaches its replica role
        try:
            with connect(urls[0], timeout_s=2) as client:
                tried.append(client.producer("g").send(Message("t", b"early")))
        except StoreError as exc:
            tried.append(exc)
        original(self, *args, **kwargs)

    monkeypatch.setattr(replica_module.Replica, "__init__", attach)
    server = StoreServer(str(tmp_path / "a"), SMALL, listen=f"127.0.0.1:{port}",
                         replica_set=str(rs))
    try:
        assert len(tried) == 1 and isinstance(tried[0], StoreError), tried
        # started, it follows nobody until the voters name a leader: writes refused
        with connect(urls[0], timeout_s=5) as client:
            assert not client._action("leader")["leading"]
            with pytest.raises(NotLeaderError):
                client.producer("g").send(Message("t", b"refused"))
    finally:
        server.close()
    with MessageStore.open(str(tmp_path / "a"), SMALL) as store:
        assert "t" not in store.topics()  # nothing was stored
