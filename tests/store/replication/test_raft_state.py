"""A voter's Raft state (its current term and its vote) outlives a killed process: Raft's
election safety (one leader a term) rests on a voter never voting twice in one term, so
``currentTerm`` and ``votedFor`` must be on disk before a vote is sent.  rmq keeps them in
the journal it gives pysyncobj (``config/raft/`` of a data replica, ``--store DIR`` of a
witness); this checks, with a real process SIGKILLed, that the library restores them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from store.replication.election import _import_pysyncobj

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# A voter process: it prints its term at start (before its first election can be due) and
# at each change.
VOTER = textwrap.dedent("""
    import json, sys, time
    from store.replication.election import _state_class, raft_conf
    me, others, journal = sys.argv[1], sys.argv[2].split(","), sys.argv[3] or None
    raft = _state_class()(me, others, raft_conf(0.5, journal, me), lambda: None)
    seen = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        term = raft.getStatus()["raft_term"]
        if term != seen:
            seen = term
            print(json.dumps({"term": term}), flush=True)
        time.sleep(0.01)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_voters(voters: list[str], journals: list[str | None], until_term: int) -> list[int]:
    """Start a process per voter; the terms the first one printed until one reached
    ``until_term`` (or it printed its first line, with ``until_term`` 0); then SIGKILL every
    one."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-c", VOTER, me,
                               ",".join(v for v in voters if v != me), journal or ""],
                              stdout=subprocess.PIPE, text=True, env=env)
             for me, journal in zip(voters, journals)]
    terms = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = procs[0].stdout.readline()
            if not line:
                break
            terms.append(json.loads(line)["term"])
            if terms[-1] >= until_term:
                break
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
    return terms


def three_voters() -> list[str]:
    return [f"127.0.0.1:{free_port()}" for _ in range(3)]


@pytest.mark.slow
def test_a_voter_killed_and_restarted_keeps_its_term_and_vote(tmp_path):
    a, b, c = three_voters()  # c never starts: a and b are a majority
    journals = [str(tmp_path / "a"), str(tmp_path / "b")]
    before = run_voters([a, b, c], journals, until_term=1)
    assert before and before[-1] >= 1, before
    meta = tmp_path / "a" / "journal.meta"
    assert meta.exists(), os.listdir(journals[0])
    after = run_voters([a, b, c], journals[:1], until_term=0)  # a alone, its first line
    # the restarted voter starts in the term it was killed in, not back at 0: it cannot
    # vote again in a term it voted in
    assert after[0] >= before[-1], (before, after)
    _import_pysyncobj()  # (a bare import would replace socket.inet_ntop for every later test)
    from pysyncobj.journal import MetaStorer

    stored = MetaStorer(str(meta)).getMeta()
    assert stored["currentTerm"] >= before[-1]
    assert stored["votedForNodeId"] is not None  # its vote in that term is on disk


@pytest.mark.slow
def test_without_a_journal_a_restarted_voter_starts_over(tmp_path):
    """The counterpart (why a witness should be given a directory): in memory, the term
    is lost with the process."""
    a, b, c = three_voters()
    before = run_voters([a, b, c], [None, None], until_term=1)
    assert before[-1] >= 1, before
    after = run_voters([a, b, c], [None], until_term=0)
    assert after[0] < before[-1], (before, after)
