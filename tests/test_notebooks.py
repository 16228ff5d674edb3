"""Every notebook runs top to bottom on a fresh kernel (they start their own Spark), then again
in the same live kernel as a user's second "Run All", on one store (``RMQ_NOTEBOOK_STORE``),
leaving no checkpoint directory behind.

The notebooks are committed executed, with their outputs and figures
(``python tools/run_notebooks.py``), so that a reader on a code host sees the results; this
test re-executes each one from scratch and checks it still runs.
"""

from __future__ import annotations

import glob
import os

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks", "*.ipynb")))

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names == ["01_quickstart.ipynb", "02_delayed_messages.ipynb",
                     "03_transactions.ipynb", "04_backfill.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_twice_on_one_store(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # the kernel imports store / rmq_source from this checkout even when not installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.setenv("RMQ_NOTEBOOK_STORE", str(tmp_path / "store"))
    scratch = tmp_path / "tmp"  # the kernel's temporary directory
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    from nbclient import NotebookClient

    committed_nb = nbformat.read(path, as_version=4)
    committed = [o for c in committed_nb.cells if c.cell_type == "code"
                 for o in c.get("outputs", [])]
    assert committed, "notebooks are committed executed: run python tools/run_notebooks.py"
    assert not [o for o in committed if o.output_type == "error"]
    client = None
    for run in range(2):  # the second run finds the first one's messages in the store
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:  # run from scratch
            if cell.cell_type == "code":
                cell.outputs = []
        if client is None:
            client = NotebookClient(nb, timeout=300, kernel_name="python3",
                                    resources={"metadata": {"path": str(tmp_path)}})
        client.nb = nb
        # "Run All" again in the same live kernel, as a user re-runs a notebook: its Spark
        # session, store handles and queries of the first run are still there (a fresh
        # kernel is the first run's case)
        client.execute(cleanup_kc=(run == 1))
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                  if o.output_type == "error"]
        assert not errors
        if os.path.basename(path) == "02_delayed_messages.ipynb":  # the figure is shown
            assert any("image/png" in o.get("data", {}) for c in nb.cells
                       if c.cell_type == "code" for o in c.outputs)
    checkpoints = [d for d, subdirs, _ in os.walk(scratch) if "commits" in subdirs]
    assert checkpoints == [], "a notebook left its streaming checkpoint behind"
