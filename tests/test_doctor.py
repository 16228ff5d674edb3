"""``rmq doctor``: whether Spark's workers can use the rmq source, said plainly (issue: what a
newcomer trips on, item 2: a mismatched worker Python)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rmq_source.setup_check import spark_problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.spark, pytest.mark.slow]

OK_FOUND = {"store": f"{ROOT}/store/__init__.py", "rmq_source": "x", "pyspark_rmq": "x",
            "pyarrow": "x"}
NOT_RMQ = "option path='/nonexistent': not an rmq store"


def _doctor(env):
    return subprocess.run([sys.executable, "-c", "from rmq_cli.cli import main; main()",
                           "doctor"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def test_a_working_setup_is_ok():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=ROOT)
    done = _doctor(env)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "ok: Spark's workers import rmq" in done.stdout


def test_workers_running_a_python_without_rmq_are_named(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    worker = str(bare / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYSPARK_PYTHON"] = worker
    done = _doctor(env)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert f"Spark's Python workers run {worker}" in done.stdout
    # it finds rmq itself through the working directory, never the environment's pyarrow
    (line,) = [ln for ln in done.stdout.splitlines() if "which cannot import" in ln]
    assert "pyarrow" in line and "PYSPARK_PYTHON" in line


def test_findings_from_what_was_observed():
    assert spark_problems("/v/python", "3.11", ("/v/python", "3.11", OK_FOUND), NOT_RMQ) == []
    (p,) = spark_problems("/v/python", "3.11", ("/usr/bin/python3", "3.11",
                                                dict(OK_FOUND, store=None)), NOT_RMQ)
    assert "/usr/bin/python3" in p and "cannot import store" in p
    problems = spark_problems("/v/python", "3.11", ("/usr/bin/python3", "3.9", OK_FOUND),
                              "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: rmq")
    assert any("Python 3.9" in p for p in problems)
    assert any("pip install ." in p for p in problems)
    (p,) = spark_problems("/v/python", "3.11", ("/w", "3.11", dict(
        OK_FOUND, store="/job/store.py")), NOT_RMQ)
    assert "/job/store.py" in p and "shadows" in p
