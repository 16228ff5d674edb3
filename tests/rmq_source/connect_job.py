"""A job for the Spark Connect test: a ``readStream`` / ``writeStream`` pipeline and batch reads
through a Spark Connect session (``SparkSession.builder.remote("local[2]")`` starts a local
Connect server) against a store served by ``rmq serve --listen``: what a notebook user on a
Connect-based platform runs.

Run as ``python connect_job.py WORKDIR``; prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "connect-token"


def main() -> None:
    work = sys.argv[1]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, ROOT)
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from store import StoreServer, connect

    server = StoreServer(os.path.join(work, "store"), listen="127.0.0.1:0", token=TOKEN)
    out: dict = {}
    try:
        url = server.url
        with connect(url, token=TOKEN) as remote:
            remote.producer("g").send_table(pa.table({
                "body": [b"order-%d" % i for i in range(500)],
                "delay_ms": pa.array([600_000 if i < 50 else None for i in range(500)],
                                     pa.int64())}), topic="orders")
        spark = SparkSession.builder.remote("local[2]").getOrCreate()
        out["connect"] = type(spark).__module__
        orders = (spark.read.format("rmq").option("subscribe", "orders")
                  .option("token", TOKEN).load(url))
        out["orders"] = orders.count()  # the 50 delayed ones are not due
        (spark.readStream.format("rmq").option("subscribe", "orders")
         .option("startingOffsets", "earliest").option("token", TOKEN).load(url)
         .selectExpr("'copies' AS topic", "body")
         .writeStream.format("rmq").option("token", TOKEN)
         .option("checkpointLocation", os.path.join(work, "chk"))
         .trigger(availableNow=True).start(url).awaitTermination())
        copies = (spark.read.format("rmq").option("subscribe", "copies")
                  .option("token", TOKEN).load(url).select("body").collect())
        out["copies"] = len(copies)
        out["distinct_copies"] = len({bytes(r.body) for r in copies})
        spark.stop()
    finally:
        server.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
