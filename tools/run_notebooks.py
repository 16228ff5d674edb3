"""Execute every notebook in ``notebooks/`` and save it with its outputs and figures.

Run ``python tools/run_notebooks.py`` (from the repository, with the test extras installed)
after changing a notebook; the notebooks are committed executed, so that a reader on a code
host sees the results.  ``tests/test_notebooks.py`` re-executes them and checks they still run.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import nbformat
    from nbclient import NotebookClient

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    paths = sys.argv[1:] or sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        with tempfile.TemporaryDirectory() as cwd:
            NotebookClient(nb, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": cwd}}).execute()
        for cell in nb.cells:  # no machine-specific noise in the committed file
            cell.get("metadata", {}).pop("execution", None)
            if cell.cell_type == "code":  # Spark's log lines and progress bars
                cell.outputs = [o for o in cell.outputs
                                if not (o.output_type == "stream" and o.get("name") == "stderr")]
        nbformat.write(nb, path)
        print("executed", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
