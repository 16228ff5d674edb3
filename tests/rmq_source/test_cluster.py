"""The source and the sink on a store group under ``local-cluster[2,1,1024]``: separate
executor JVMs and Python workers; the stores on a directory they all share, then served by two
``rmq serve`` processes on two loopback addresses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _check_local_group(out: dict) -> None:
    """The group of local directories (``cluster_job.run``)."""
    assert out["executors"] == 2 and out["worker_pids"] >= 2
    expected = sorted(f"order-{i}" for i in range(4000))
    assert sorted(out["orders"]) == expected  # each row once, delayed rows delivered
    assert sorted(out["copies"]) == expected
    assert min(out["per_store"].values()) > 1500  # both stores took a share
    assert out["open_halves"] == 0


def test_group_source_and_sink_on_a_local_cluster_local_and_served(tmp_path):
    """One cluster start for both (it costs most of a minute on two cores).  First a group of
    local directories every executor shares: the batch sink, a stream through the sink into a
    second group, each row once.  Then executors reach two `rmq serve --listen` servers
    (127.0.0.1, 127.0.0.2) through a group of rmq:// members, given only group.json and the
    token: the sink with delayed rows (none early), a replayed micro-batch, batch and stream
    reads, a server SIGKILLed and restarted under a running stream; every row once."""
    job = os.path.join(os.path.dirname(__file__), "cluster_remote_job.py")
    proc = subprocess.run([sys.executable, job, str(tmp_path)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    _check_local_group(out["local"])
    assert out["group_files"] == ["group.json"] and out["executors"] == 2
    first = sorted(f"order-{i}" for i in range(4000))
    if out["visible_checked_after_s"] < 20:  # (later, some may be due already)
        assert out["visible_at_once"] == 3600  # the 400 delayed rows not before their time
    assert out["delayed"] == 400 and out["early"] == 0  # stored at or after their due time
    assert sorted(out["orders"]) == first
    assert sorted(out["copies_after_replay"]) == first  # the replayed batch added nothing
    assert out["error_names_address"] and out["failed_within_s"] < 90
    late = sorted(f"late-{n}-{k}-{i}" for n in "ab" for k in range(3) for i in range(100))
    assert sorted(out["orders_final"]) == sorted(first + late)
    assert sorted(out["copies_final"]) == sorted(first + late)  # each row once
    assert min(out["per_store"].values()) > 1500
