"""A job for the cluster test over the network: Spark's ``local-cluster[2,1,1024]`` master
(two executor JVMs with their own Python workers) reaching two stores served by ``rmq serve
--listen`` on 127.0.0.1 and 127.0.0.2 (two "hosts") through a store group whose members are
``rmq://`` URLs. Spark is given the group's directory (only ``group.json``) and the token;
the served stores' directories are named nowhere in its configuration.

The same cluster first runs ``cluster_job.run`` (a group of local directories that every
executor shares); its figures are under ``"local"``.

Run as ``python cluster_remote_job.py WORKDIR``; prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "cluster-token"


def _with_causes(exc: BaseException) -> str:
    """The error's text with its JVM causes (Spark wraps a task's error: "Writing job
    failed", the task's Python error as a cause)."""
    parts = [str(exc)]
    cause = getattr(exc, "_origin", None)
    while cause is not None and len(parts) < 20:
        parts.append(str(cause.toString()))
        cause = cause.getCause()
    return "\n".join(parts)


def serve(store_dir: str, listen: str, token_file: str) -> tuple[subprocess.Popen, str]:
    from store import server_status

    proc = subprocess.Popen([sys.executable, "-m", "rmq_cli.cli", "serve", "--store", store_dir,
                             "--create",
                             "--listen", listen, "--token-file", token_file,
                             "--log-level", "ERROR"], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        status = server_status(store_dir)
        if status and status.get("attached") and status.get("pid") == proc.pid \
                and status.get("listen"):
            return proc, status["listen"]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"rmq serve did not start: {status}")
        time.sleep(0.05)


def main() -> None:
    servers: dict = {}
    try:
        run(sys.argv[1], servers)
    finally:  # never leave a server behind (it would hold the test's pipes open)
        for proc, _ in servers.values():
            if proc.poll() is None:
                proc.kill()


def run(work: str, servers: dict) -> None:
    import cluster_job  # beside this file: the session and the local-directory group's part

    sys.path.insert(0, ROOT)
    from store import StoreGroup, connect

    token_file = os.path.join(work, "token")
    with open(token_file, "w") as fh:
        fh.write(TOKEN + "\n")
    hidden = os.path.join(work, "hosts")  # where the servers keep their stores
    for i, host in enumerate(("127.0.0.1", "127.0.0.2")):
        servers[i] = serve(os.path.join(hidden, f"host-{i}"), f"{host}:0", token_file)
    urls = [servers[i][1] for i in range(2)]
    group = os.path.join(work, "group")
    StoreGroup.create(group, ["a", "b"], paths=urls, remote={"token": TOKEN}).close()
    out: dict = {"group_files": sorted(os.listdir(group))}

    spark = cluster_job.session("rmq-cluster")
    # first the group of local directories that every executor shares (one cluster start
    # serves both: it takes most of a minute on two cores)
    os.makedirs(os.path.join(work, "local"))
    out["local"] = cluster_job.run(spark, os.path.join(work, "local"))

    def bodies(topic):
        rows = (spark.read.format("rmq").option("subscribe", topic).option("token", TOKEN)
                .load(group).select("body"))
        return [bytes(r.body).decode() for r in rows.collect()]

    spark.range(8).repartition(4).count()  # the executors started (they take seconds)
    # batch sink with delayed rows: nothing early
    written = time.monotonic()
    (spark.range(4000).selectExpr("'orders' AS topic", "concat('order-', id) AS body",
                                  "CASE WHEN id % 10 = 0 THEN 20000 END AS delay_ms")
     .repartition(4).write.format("rmq").option("token", TOKEN).mode("append").save(group))
    out["visible_at_once"] = len(bodies("orders"))
    out["visible_checked_after_s"] = round(time.monotonic() - written, 1)
    out["executors"] = len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1
    while len(bodies("orders")) < 4000 and time.monotonic() < written + 90:
        time.sleep(1.0)  # the servers deliver them once due
    out["orders"] = bodies("orders")
    delayed = (spark.read.format("rmq").option("subscribe", "orders").option("token", TOKEN)
               .load(group).where("deliver_timestamp IS NOT NULL"))
    out["delayed"] = delayed.count()
    out["early"] = delayed.where("store_timestamp < deliver_timestamp").count()

    # a stream through the sink, then its last micro-batch replayed
    chk = os.path.join(work, "chk")

    def copy(start_trigger="availableNow"):
        writer = (spark.readStream.format("rmq").option("subscribe", "orders")
                  .option("startingOffsets", "earliest").option("token", TOKEN)
                  .option("maxOffsetsPerTrigger", "1500").load(group)
                  .selectExpr("'copies' AS topic", "body")
                  .writeStream.format("rmq").option("token", TOKEN)
                  .option("checkpointLocation", chk))
        if start_trigger == "availableNow":
            writer.trigger(availableNow=True).start(group).awaitTermination()
            return None
        return writer.trigger(processingTime="300 milliseconds").start(group)

    copy()
    commits = sorted(int(f) for f in os.listdir(os.path.join(chk, "commits")) if f.isdigit())
    os.remove(os.path.join(chk, "commits", str(commits[-1])))  # Spark replays that batch
    crc = os.path.join(chk, "commits", f".{commits[-1]}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    copy()
    out["copies_after_replay"] = bodies("copies")

    # a server SIGKILLed under a running stream, then restarted: nothing lost or doubled
    with connect(urls[0], token_file=token_file) as a, connect(urls[1], token_file=token_file) \
            as b:
        query = copy("running")
        for k in range(3):
            for target, name in ((a, "a"), (b, "b")):
                target.producer("late").send_batch([
                    __import__("store").Message("orders", f"late-{name}-{k}-{i}".encode())
                    for i in range(100)])
            time.sleep(0.5)
        proc, url = servers[1]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        started = time.monotonic()
        error = None
        try:
            query.awaitTermination(120)
        except Exception as exc:  # noqa: BLE001 - the failure we wait for
            error = _with_causes(exc)
        out["failed_within_s"] = round(time.monotonic() - started, 1)
        out["error_names_address"] = bool(error) and url.split("//")[1] in error
        if query.isActive:
            query.stop()
        servers[1] = serve(os.path.join(hidden, "host-1"), url.split("//")[1], token_file)
        copy()
    out["orders_final"] = bodies("orders")
    out["copies_final"] = bodies("copies")
    with StoreGroup.open(group, remote={"token": TOKEN}) as g:
        out["per_store"] = {name: sum(s.max_offset("orders", q) for q in s.queue_ids("orders"))
                            for name, s in g.stores()}
    spark.stop()
    for proc, _ in servers.values():
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
