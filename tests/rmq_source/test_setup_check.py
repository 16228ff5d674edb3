"""Set-up mistakes said plainly: a ``store.py`` shadowing rmq's package, in the CLI and the
Spark entry point (``pyspark_rmq``), instead of bare import or DATA_SOURCE_NOT_FOUND errors."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str, cwd: str) -> subprocess.CompletedProcess:
    # the job's directory first on sys.path, as when a user runs `python job.py` there
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((cwd, ROOT))}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_no_problem_with_rmqs_own_package(tmp_path):
    done = _run("from rmq_source.setup_check import store_package_problem as p; print(p())",
                str(tmp_path))
    assert done.stdout.strip() == "None", done.stderr


def test_a_shadowing_store_py_is_named(tmp_path):
    (tmp_path / "store.py").write_text("X = 1\n")
    done = _run("from rmq_source.setup_check import store_package_problem as p; print(p())",
                str(tmp_path))
    assert "store.py" in done.stdout and "shadows" in done.stdout, done.stderr
    # the CLI says it in one line, exit code 1
    done = _run("import sys; sys.argv = ['rmq', 'stats', '--store', 'x']\n"
                "from rmq_cli.cli import main\nmain()", str(tmp_path))
    assert done.returncode == 1
    assert "rmq: error:" in done.stderr and "shadows" in done.stderr
    # the Spark entry point: loading the source names the cause
    done = _run("import pyspark_rmq\n"
                "try:\n    pyspark_rmq.DefaultSource({}).schema()\n"
                "except ImportError as exc:\n    print('ERR', exc)", str(tmp_path))
    assert "ERR the rmq data source cannot load" in done.stdout, done.stderr
    assert "shadows" in done.stdout
