"""A follower takes its leader's new term before it copies a byte of it, also when the
voters name the same leader again in a later epoch (its lease lapsed and was renewed by a
new election): the follower's connection goes on, and it used to copy the new term's bytes
under its old terms.

Found by the fault run (tools/fault_run.py, seed 1, three replicas, synchronous): the
follower's epoch file then said that it held bytes of the older term only, so an election
compared it as ``(older epoch, end)`` and could name a replica holding less (an
acknowledged message lost), and at its next connection it cut, and set aside, the new
term's bytes it held although they were its leader's own."""

from __future__ import annotations

import pytest
from test_replica_set import SMALL, caught_up, pair  # noqa: F401 - the fixture

from store import Message, NotLeaderError, connect
from store.core.replica_log import LogChunk
from store.files.epoch_file import held_epoch, read_epochs
from store.remote.replication_stream import clipped


def test_a_follower_takes_its_leader_s_new_term_before_copying_its_bytes(pair):  # noqa: F811
    leader, follower = pair
    p = leader.store.producer("g")
    p.send_batch([Message("t", b"one-%d" % i) for i in range(50)])
    caught_up(leader, follower)
    started = leader.replica.become_leader(epoch=2, force=True)  # named again, epoch 2
    p.send_batch([Message("t", b"two-%d" % i) for i in range(50)])
    end = caught_up(leader, follower)
    terms = read_epochs(follower.path)
    assert terms[-1] == (2, started["start_offset"]), terms
    assert held_epoch(terms, end) == 2
    assert follower.replica.epoch == 2
    assert follower.replica.last_cut is None  # nothing of the leader's own was cut


def test_an_older_epoch_is_refused_and_no_answer_crosses_a_new_term(pair):  # noqa: F811
    leader, _ = pair
    leader.store.producer("g").send(Message("t", b"one"))
    leader.replica.become_leader(epoch=2, force=True)
    with connect(leader.url, timeout_s=10) as remote:
        with pytest.raises(NotLeaderError, match="asked under epoch 1"):
            list(remote.log_chunks(0, tail_crc=0, file_size=SMALL["commitlog_file_size_bytes"],
                                   max_bytes=1 << 20, wait_ms=0, epoch=1))
        assert list(remote.log_chunks(0, tail_crc=0, max_bytes=1 << 20, wait_ms=0, epoch=2,
                                      file_size=SMALL["commitlog_file_size_bytes"]))
    chunk = LogChunk(100, b"a" * 50, 150, 150)
    assert clipped(chunk, None) is chunk and clipped(chunk, 150) is chunk
    assert clipped(chunk, 120) == LogChunk(100, b"a" * 20, 120, 150)
    assert clipped(chunk, 100) == LogChunk(100, b"", 100, 150)
