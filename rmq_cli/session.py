"""A quiet local Spark session for the demo and the benchmarks.

Workers use this interpreter (``PYSPARK_PYTHON``), so they find pyarrow and the ``rmq``
source; log output below ERROR and the console progress bar are off.
"""

from __future__ import annotations

import os
import sys
import warnings

_LOG4J = ("rootLogger.level = error\nrootLogger.appenderRef.stdout.ref = console\n"
          "appender.console.type = Console\nappender.console.name = console\n"
          "appender.console.layout.type = PatternLayout\n"
          "appender.console.layout.pattern = %d %p %c: %m%n\n")


def local_spark(app_name: str, workdir: str, *, extra_conf: dict[str, str] | None = None,
                pythonpath: str | None = None):
    """``local[2]`` session writing its log config and warehouse under ``workdir``.

    ``pythonpath`` is prepended to ``PYTHONPATH`` for the workers (a source checkout that
    is not installed).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if pythonpath:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from pyspark.sql import SparkSession

    log4j = os.path.join(workdir, "log4j2.properties")
    with open(log4j, "w") as fh:
        fh.write(_LOG4J)
    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.warehouse.dir", os.path.join(workdir, "warehouse"))
               .config("spark.driver.extraJavaOptions",
                       f"-Dlog4j2.configurationFile=file:{log4j}"))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
