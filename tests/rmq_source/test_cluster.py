"""The source and the sink on a store group under ``local-cluster[2,1,1024]``: separate
executor JVMs and Python workers, the stores on a directory they all share."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_group_source_and_sink_on_a_local_cluster(tmp_path):
    job = os.path.join(os.path.dirname(__file__), "cluster_job.py")
    proc = subprocess.run([sys.executable, job, str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["executors"] == 2 and out["worker_pids"] >= 2
    expected = sorted(f"order-{i}" for i in range(4000))
    assert sorted(out["orders"]) == expected  # each row once, delayed rows delivered
    assert sorted(out["copies"]) == expected
    assert min(out["per_store"].values()) > 1500  # both stores took a share
    assert out["open_halves"] == 0
