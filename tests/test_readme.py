"""The README's Quick start runs as written, twice in a row, with the rows it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quick_start_code() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the Quick start has one Python block"
    return blocks[0]


@pytest.mark.slow
@pytest.mark.spark
def test_quick_start_runs_twice_as_written(tmp_path):
    code = quick_start_code().replace("/tmp/rmq-quickstart", str(tmp_path / "store"))
    script = tmp_path / "quickstart.py"
    script.write_text(code + "\nquery = None\n" + code)  # the whole script, run twice
    env = {**os.environ, "PYTHONPATH": ROOT, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # each run: the batch read shows the one order already visible, as text
    assert out.count('{"id": 1}') >= 2 and '"close": true' not in out
    # the stream printed the order and the three reminders, once per run
    assert out.count("remind-0") == 2 and out.count("remind-2") == 2
    # quiet: no progress bars, no WARN lines once the session is made (the JVM's own start-up
    # line about native Hadoop libraries comes before the script can lower the level)
    assert "[Stage " not in done.stderr, done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines()
                if " WARN " in line and "NativeCodeLoader" not in line]
    assert warnings == [], warnings
