"""Spark Connect: a readStream/writeStream pipeline and batch reads through a Connect session
against a served store (notebook users on Connect-based platforms)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_a_pipeline_through_spark_connect(tmp_path):
    job = os.path.join(os.path.dirname(__file__), "connect_job.py")
    proc = subprocess.run([sys.executable, job, str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["connect"] == "pyspark.sql.connect.session"  # a Connect session, not classic
    assert out["orders"] == 450  # the 50 delayed rows are not due: never early
    assert out["copies"] == out["distinct_copies"] == 450  # each row once through the sink
