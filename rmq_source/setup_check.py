"""Why ``format("rmq")`` or ``import store`` may fail on a user's machine, said plainly.

Two set-up mistakes give errors that name neither cause:

* a module named ``store`` (a ``store.py`` or ``store/`` folder in the job's directory, which
  comes first on ``sys.path``) shadows the rmq package: imports fail with "cannot import
  name ... from 'store'", and Spark's automatic registration finds no ``rmq`` source at all
  (``DATA_SOURCE_NOT_FOUND``);
* Spark's Python workers run another interpreter (``PYSPARK_PYTHON`` unset and ``python3`` on
  the ``PATH`` is not the one rmq is installed in).

:func:`store_package_problem` detects the first in this process.  :func:`check_spark` (and
``rmq doctor``) checks a running Spark session for both: it runs one tiny Python task on the
workers, with nothing of rmq in it, asks which interpreter runs there and what it can import,
then tries ``format("rmq")`` itself.  Imports nothing of PySpark.
"""

from __future__ import annotations

import importlib.util
import os
import re
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


#: What Spark's Python workers must be able to import for ``format("rmq")``.
WORKER_MODULES = ("store", "rmq_source", "pyspark_rmq", "pyarrow")


def check_spark(spark) -> list[str]:
    """What keeps ``format("rmq")`` from working in ``spark`` (``[]``: nothing).

    Runs one Python task on the workers (the probe is shipped by value, so it runs even
    where rmq is not installed) and one read of a directory that does not exist (which
    the rmq source refuses by name, unless Spark cannot find the source at all).
    """
    def probe(_, names=WORKER_MODULES):  # nested: pickled by value, needs no rmq there
        import importlib.util as util
        import sys as worker_sys

        found = {}
        for name in names:
            try:
                spec = util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            found[name] = None if spec is None else spec.origin
        return worker_sys.executable, "%d.%d" % worker_sys.version_info[:2], found

    try:
        worker = spark.sparkContext.parallelize([0], 1).map(probe).collect()[0]
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        worker = ("?", "?", {"error": str(exc).strip().splitlines()[0][:300]})
    source_error = None
    try:
        (spark.read.format("rmq").option("subscribe", "rmq-doctor")
         .option("deliverDue", "false").load("/nonexistent/rmq-doctor-check").collect())
    except Exception as exc:  # noqa: BLE001
        source_error = str(exc)
    return spark_problems(sys.executable, "%d.%d" % sys.version_info[:2], worker, source_error)


def spark_problems(driver: str, driver_version: str, worker: tuple, source_error: str | None
                   ) -> list[str]:
    """The findings of :func:`check_spark` from what it observed (a pure function)."""
    executable, version, found = worker
    problems = []
    if "error" in found:
        problems.append(f"Spark could not run a Python task on its workers: {found['error']}; "
                        + worker_python_hint())
    else:
        missing = [name for name in WORKER_MODULES if found.get(name) is None]
        if missing:
            problems.append(
                f"Spark's Python workers run {executable} (Python {version}), which cannot "
                f"import {', '.join(missing)}; this process runs {driver} (Python "
                f"{driver_version}). " + worker_python_hint())
        origin = found.get("store")
        if origin and not os.path.exists(
                os.path.join(os.path.dirname(os.path.dirname(origin)), _MARKER)):
            problems.append(f"on Spark's workers `store` is {origin!r}, not rmq's package: a "
                            "store.py or store/ folder shadows it there; rename it")
        if version != driver_version:
            problems.append(f"Spark's workers run Python {version} and this process Python "
                            f"{driver_version}; PySpark needs the same version on both. "
                            + worker_python_hint())
    if source_error is not None and ("DATA_SOURCE_NOT_FOUND" in source_error
                                     or "not an rmq store" not in source_error):
        causes = re.findall(r"^\s*([\w.]*(?:Error|Exception|NOT_FOUND\]).*)$", source_error,
                            re.M)
        first = (causes[-1] if causes else source_error.strip().splitlines()[0]
                 if source_error.strip() else "?")[:300]
        problems.append(
            f"format(\"rmq\") does not work: {first}. Spark finds the source by importing "
            "`pyspark_rmq` in its workers' Python: install rmq there with `pip install .` (an "
            "editable install is not found by Spark's scan)")
    elif source_error is None:
        problems.append("format(\"rmq\") read a directory that does not exist without an "
                        "error; an older rmq may be installed for Spark's workers")
    return problems
