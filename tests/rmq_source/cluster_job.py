"""A job for the cluster test: the sink and the source on a store group under Spark's
``local-cluster[2,1,1024]`` master (two executor JVMs, each with its own Python workers).

Run as ``python cluster_job.py WORKDIR``; prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def session(app: str):
    """The shared ``local-cluster[2,1,1024]`` session of the cluster jobs."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, ROOT)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    spark = session("rmq-cluster")
    out = run(spark, sys.argv[1])
    spark.stop()
    print(json.dumps(out), flush=True)


def run(spark, work: str) -> dict:
    """The sink and the source on a store group of directories under ``work``."""
    from store import StoreGroup

    out: dict = {}
    group = os.path.join(work, "group")
    StoreGroup.create(group, 2).close()

    # batch sink: 4 tasks, which may run in either executor
    (spark.range(4000).selectExpr("'orders' AS topic", "concat('order-', id) AS body",
                                  "CASE WHEN id % 10 = 0 THEN 1500 END AS delay_ms")
     .repartition(4).write.format("rmq").mode("append").save(group))
    # where the tasks ran: executor ids and worker pids seen by a throw-away job
    seen = (spark.range(0, 8, 1, 8).rdd
            .map(lambda _: (__import__("pyspark").TaskContext.get().stageId(), os.getpid()))
            .collect())
    out["worker_pids"] = len({pid for _, pid in seen})
    # executors that registered (the driver is listed too); they start with the first job
    out["executors"] = len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1

    # streaming: the group read as one stream, written through the sink to a second group
    mirror = os.path.join(work, "mirror")
    StoreGroup.create(mirror, 2).close()
    import time

    time.sleep(2.0)  # the delayed rows fall due
    (spark.readStream.format("rmq").option("subscribe", "orders")
     .option("startingOffsets", "earliest").load(group)
     .selectExpr("'copies' AS topic", "body")
     .writeStream.format("rmq").option("checkpointLocation", os.path.join(work, "chk"))
     .trigger(availableNow=True).start(mirror).awaitTermination())

    def bodies(path, topic):
        rows = spark.read.format("rmq").option("subscribe", topic).load(path).select("body")
        return [bytes(r.body).decode() for r in rows.collect()]

    out["orders"] = bodies(group, "orders")
    out["copies"] = bodies(mirror, "copies")
    with StoreGroup.open(group, read_only=True) as g:
        out["per_store"] = {name: sum(s.max_offset("orders", q) for q in s.queue_ids("orders"))
                            for name, s in g.stores()}
    with StoreGroup.open(mirror) as g:
        out["open_halves"] = sum(s.pending_transaction_stats()["pending"] for _, s in g.stores())
    return out


if __name__ == "__main__":
    main()
