"""``store`` never imports PySpark (and ``rmq_source`` loads it only when the source is used)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHECK = """
import sys
import {module}
loaded = sorted(m for m in sys.modules if m == "pyspark" or m.startswith("pyspark."))
print(len(loaded))
"""


def _pyspark_modules_after(statement: str) -> int:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", CHECK.format(module=statement)], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_import_store_leaves_pyspark_out():
    assert _pyspark_modules_after("store") == 0
    assert _pyspark_modules_after("store.core.arrow_decode") == 0


def test_rmq_source_package_and_options_do_not_need_pyspark():
    assert _pyspark_modules_after("rmq_source, rmq_source.options, rmq_source.offsets") == 0
    # ...while the data source itself does (the check above can fail)
    assert _pyspark_modules_after("pyspark_rmq") > 0
