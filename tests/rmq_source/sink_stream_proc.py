"""A streaming job for the sink's kill test: JSON files -> ``writeStream.format("rmq")``.

Run as ``python sink_stream_proc.py STORE SOURCE CHECKPOINT MODE`` with MODE ``run`` (one file
per micro-batch until killed) or ``drain`` (``Trigger.AvailableNow``, then exit).
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    store, source, checkpoint, mode = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, ROOT)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("rmq-sink-kill")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.schema("topic string, body string, delay_ms long")
          .option("maxFilesPerTrigger", 1).json(source).repartition(2))
    writer = (df.writeStream.format("rmq").option("checkpointLocation", checkpoint))
    if mode == "drain":
        writer.trigger(availableNow=True).start(store).awaitTermination()
    else:
        print("started", flush=True)
        writer.trigger(processingTime="100 milliseconds").start(store).awaitTermination()


if __name__ == "__main__":
    main()
