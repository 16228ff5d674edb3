"""Why ``format("rmq")`` or ``import store`` may fail on a user's machine, said plainly.

Two set-up mistakes give errors that name neither cause:

* a module named ``store`` (a ``store.py`` or ``store/`` folder in the job's directory, which
  comes first on ``sys.path``) shadows the rmq package: imports fail with "cannot import
  name ... from 'store'", and Spark's automatic registration finds no ``rmq`` source at all
  (``DATA_SOURCE_NOT_FOUND``);
* Spark's Python workers run another interpreter (``PYSPARK_PYTHON`` unset and ``python3`` on
  the ``PATH`` is not the one rmq is installed in).

:func:`store_package_problem` detects the first; :func:`worker_python_hint` is the text for
the second.  Imports nothing of PySpark.
"""

from __future__ import annotations

import importlib.util
import os
import sys

#: The file every rmq ``store`` package has (a shadowing module lacks it).
_MARKER = os.path.join("store", "core", "store_core.py")


def store_package_problem() -> str | None:
    """A message when ``import store`` would not give rmq's package, else ``None``."""
    loaded = sys.modules.get("store")
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is None:
        spec = importlib.util.find_spec("store")
        if spec is None:
            return ("the rmq package `store` is not installed for this Python "
                    f"({sys.executable}); install rmq into it (pip install rmq / pip install .)"
                    " or run with the Python it is installed in")
        origin = spec.origin
    if origin is None or not os.path.exists(
            os.path.join(os.path.dirname(os.path.dirname(origin)), _MARKER)):
        return (f"the module `store` found by Python is {origin!r}, not rmq's package: a "
                "store.py or store/ folder in the job's directory shadows it; rename it (or "
                "run from another directory) so that `import store` finds rmq")
    return None


def worker_python_hint() -> str:
    return ("Spark's Python workers use PYSPARK_PYTHON, else `python3` on the PATH; set "
            "os.environ['PYSPARK_PYTHON'] = sys.executable before creating the SparkSession "
            "(or activate the virtual environment rmq is installed in)")
