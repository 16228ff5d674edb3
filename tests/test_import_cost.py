"""What importing the store costs a process: every ``rmq`` command, server, worker process
and Spark worker imports ``store`` first, so nothing heavy it does not use is pulled in at
import time (pandas alone is one to several seconds of a process's start)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_after(statement: str, names: list[str]) -> dict[str, bool]:
    code = (f"import sys\n{statement}\n"
            f"print(','.join(str(n in sys.modules) for n in {names!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    return dict(zip(names, (v == "True" for v in out.stdout.strip().split(","))))


def test_importing_the_store_imports_neither_pandas_nor_pyspark():
    found = modules_after("import store", ["pandas", "pyspark"])
    assert found == {"pandas": False, "pyspark": False}, found
