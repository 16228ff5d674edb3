"""Delayed messages: enqueue and delivery rates, a burst due in one second, memory, Redis.

Run::

    PYTHONPATH=. /work/venv/bin/python bench/bench_timer.py [--messages 1000000]
        [--pending 1000000] [--spark] [--no-redis] [--precision-ms 1000]

Measures, in one run:

* **enqueue**: ``Producer.send(delay_ms=...)`` one message at a time; the burst's messages
  sent 10,000 rows per ``Producer.send_table`` call (a ``deliver_at`` column: the columnar
  write path); and ``deliver_due`` moving the queued timer records into the wheel.
* **burst**: ``--messages`` messages due within the same second (real clock, default config,
  ``timer_precision_ms`` 1000 as RocketMQ): time from the end of that second until every one is
  visible, the delivery rate inside ``deliver_due``, and the lateness p50 / p99 of
  ``store_timestamp - deliver_timestamp``.
* **levels**: the same number of messages sent at one of RocketMQ's 4.x delay levels
  (``delay_level`` column of ``send_table``, level 3 = 10 s), so they fall due as fast as
  they were sent; once the last is due, ``deliver_due`` restores them all: its rate, the time
  from the last due time until every one is visible, and the lateness p50 / p99.
* **spark** (``--spark``): the same burst read by a streaming query (``processingTime`` 200 ms,
  ``deliverDue`` on): when the last row reaches the sink, relative to the due second.
* **memory**: resident memory of a fresh process that opens a store holding ``--pending``
  pending timer messages and runs ``deliver_due`` (which enqueues them all into the wheel),
  against the same for an empty store (target: at most 64 MB more for 10,000,000).  Both
  processes load the compiled (numba) kernels first, a fixed cost of every process that
  delivers, reported on its own line.
* **redis**: the baseline, in the same run: Debian's ``redis-server`` started on 127.0.0.1,
  ``ZADD`` pipelined (score = due ms), then moving due members to a list with
  ``ZRANGEBYSCORE``/``ZREM``/``RPUSH`` pipelines, 10,000 at a time; skipped when
  ``redis-server`` or the ``redis`` package is absent.

Prints a table with each figure next to its target and the ratio against Redis.  Not
collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from store import Message, MessageStore, RecordSpec, StoreConfig  # noqa: E402

BATCH = 10_000
BODY = bytes(range(100))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def config(precision_ms: int) -> StoreConfig:
    return StoreConfig(timer_precision_ms=precision_ms)


def enqueue_batched(store: MessageStore, n: int, due_of, topic: str = "orders") -> float:
    """Append ``n`` timer messages 10,000 per call; return the seconds it took."""
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        k = min(BATCH, n - start)
        now = store.now_ms()
        ids = store.id_generator.next_ids(k, now)
        dues = due_of(start, k)
        specs = []
        for i in range(k):
            spec = RecordSpec(topic=topic, body=BODY, born_timestamp_ms=now,
                              properties={"TAGS": "TagA", "KEYS": f"k{start + i}",
                                          "UNIQ_KEY": ids[i]})
            specs.append(store.timer.rewrite(spec, int(dues[i]))[0])
        store.append(specs)
    return time.perf_counter() - t0


def enqueue_table(store: MessageStore, n: int, due_of, topic: str = "orders") -> float:
    """Send ``n`` timer messages as tables of 10,000 rows (``Producer.send_table`` with a
    ``deliver_at`` column, the columnar write path); return the seconds it took."""
    import pyarrow as pa

    producer = store.producer("bench")
    bodies = pa.array([BODY] * BATCH, pa.binary())
    tags = pa.array(["TagA"] * BATCH)
    keys = [pa.array([f"k{start + i}" for i in range(min(BATCH, n - start))])
            for start in range(0, n, BATCH)]  # built before the clock starts
    t0 = time.perf_counter()
    for j, start in enumerate(range(0, n, BATCH)):
        k = min(BATCH, n - start)
        producer.send_table(pa.table({
            "topic": pa.array([topic] * k), "body": bodies[:k], "tags": tags[:k],
            "keys": keys[j], "deliver_at": pa.array(due_of(start, k), pa.int64())}))
    return time.perf_counter() - t0


def lateness(store: MessageStore, topic: str) -> tuple[np.ndarray, int]:
    """``store_timestamp - deliver_timestamp`` (ms) of every message of ``topic``."""
    out = []
    for q in store.queue_ids(topic):
        hi = store.max_offset(topic, q)
        for start in range(0, hi, 200_000):
            batch = store.read_arrow(topic, q, start, min(hi, start + 200_000))
            st = batch.column("store_timestamp").cast("int64").to_numpy() // 1000
            dl = batch.column("deliver_timestamp").cast("int64").to_numpy() // 1000
            out.append(st - dl)
    lat = np.concatenate(out) if out else np.empty(0, np.int64)
    return lat, len(lat)


def pct(values, q):
    return float(np.percentile(values, q)) if len(values) else float("nan")


# ---------------------------------------------------------------------------- our store
def bench_enqueue(base: str, precision: int, single: int) -> dict:
    path = os.path.join(base, "enqueue")
    with MessageStore.open(path, config(precision)) as store:
        p = store.producer("bench")
        t0 = time.perf_counter()
        for i in range(single):
            p.send(Message("orders", BODY, tags="TagA", keys=f"k{i}"), delay_ms=3_600_000)
        send_rate = single / (time.perf_counter() - t0)
    shutil.rmtree(path)
    return {"send_per_message": send_rate}


def bench_burst(base: str, n: int, precision: int) -> dict:
    path = os.path.join(base, "burst")
    store = MessageStore.open(path, config(precision))
    lead = max(10_000, n // 100)  # ms until the due second: sending and enqueueing fit in it
    second = now_ms() + lead
    second -= second % 1000
    rng = np.random.default_rng(1)
    offsets = rng.integers(1, 1001, size=n)  # due at second + 1 .. second + 1000 ms
    # warm-up: a long-running process has loaded the compiled kernels already
    enqueue_batched(store, 1000, lambda s, k: np.full(k, now_ms() + 1), topic="warmup")
    time.sleep(0.01)
    store.deliver_due()
    append_s = enqueue_table(store, n, lambda s, k: second + offsets[s:s + k])
    t0 = time.perf_counter()
    # moves the queued records into the wheel (those already due, when sending took past
    # the due second, are delivered at once: counted, or the loop below would wait for them)
    delivered = store.deliver_due()
    wheel_s = time.perf_counter() - t0
    if now_ms() >= second:
        print(f"  warning: sending took past the due second; raise the lead ({lead} ms)")
    busy = 0.0
    while delivered < n:
        t0 = time.perf_counter()
        got = store.deliver_due()
        if got:  # calls that found nothing due yet are polling, not delivery
            busy += time.perf_counter() - t0
        delivered += got
        if delivered < n:
            time.sleep(0.02)
    all_visible = now_ms()
    lat, count = lateness(store, "orders")
    assert count == n, (count, n)
    store.close()
    shutil.rmtree(path)
    return {
        "append_batched_per_s": n / append_s, "wheel_enqueue_per_s": n / wheel_s,
        "deliver_per_s": n / busy, "deliver_busy_s": busy,
        "all_visible_after_due_second_s": (all_visible - (second + 1000)) / 1000,
        "lateness_p50_ms": pct(lat, 50), "lateness_p99_ms": pct(lat, 99),
    }


def bench_levels(base: str, n: int, level: int = 3) -> dict:
    """``n`` messages at delay level ``level``: send, wait until the last is due, deliver."""
    import pyarrow as pa

    path = os.path.join(base, "levels")
    store = MessageStore.open(path)
    delay_ms = store.config.delay_levels_ms[level - 1]
    producer = store.producer("bench")
    # warm-up: a long-running process has loaded the compiled kernels already
    producer.send_table(pa.table({"topic": ["warmup"] * 100, "body": [BODY] * 100,
                                  "delay_level": pa.array([1] * 100, pa.int32())}))
    time.sleep(store.config.delay_levels_ms[0] / 1000 + 0.1)
    store.deliver_due()
    bodies = pa.array([BODY] * BATCH, pa.binary())
    keys = [pa.array([f"k{start + i}" for i in range(min(BATCH, n - start))])
            for start in range(0, n, BATCH)]  # built before the clock starts
    first = now_ms()
    t0 = time.perf_counter()
    for j, start in enumerate(range(0, n, BATCH)):
        k = min(BATCH, n - start)
        producer.send_table(pa.table({
            "topic": pa.array(["orders"] * k), "body": bodies[:k],
            "tags": pa.array(["TagA"] * k), "keys": keys[j],
            "delay_level": pa.array([level] * k, pa.int32())}))
    send_s = time.perf_counter() - t0
    last_due = now_ms() + delay_ms  # every message is due by then
    if now_ms() >= first + delay_ms:
        print(f"  warning: sending took past the first due time ({delay_ms} ms)")
    while now_ms() < last_due:
        time.sleep(0.005)
    delivered, busy = 0, 0.0
    while delivered < n:
        t0 = time.perf_counter()
        got = store.deliver_due()
        if got:
            busy += time.perf_counter() - t0
        delivered += got
        if delivered < n:
            time.sleep(0.02)
    all_visible = now_ms()
    lat, count = lateness(store, "orders")
    assert count == n, (count, n)
    assert (lat >= 0).all(), "a message surfaced before its due time"
    store.close()
    shutil.rmtree(path)
    return {"levels_level": level, "levels_send_per_s": n / send_s,
            "levels_due_spread_s": (last_due - delay_ms - first) / 1000,
            "levels_deliver_per_s": n / busy,
            "levels_all_visible_after_last_due_s": (all_visible - last_due) / 1000,
            "levels_lateness_p50_ms": pct(lat, 50), "levels_lateness_p99_ms": pct(lat, 99)}


def bench_spark(base: str, n: int, precision: int, background: bool,
                show_progress: bool = False) -> dict:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = ROOT
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    path = os.path.join(base, "spark")
    store = MessageStore.open(path, config(precision))
    store.producer("bench").send(Message("orders", b"warm-up"))
    seen = {"rows": 0, "last": 0, "lat": []}

    def sink(df, batch_id):
        rows = df.selectExpr("unix_millis(deliver_timestamp) AS d").toPandas()["d"]
        wall = now_ms()
        seen["rows"] += len(rows)
        seen["last"] = wall
        seen["lat"].append(wall - rows.dropna().to_numpy(dtype=np.int64))

    query = (spark.readStream.format("rmq").option("subscribe", "orders")
             .option("deliverDue", str(not background).lower())
             .option("startingOffsets", "earliest").load(path).writeStream.foreachBatch(sink)
             .option("checkpointLocation", os.path.join(base, "spark-checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    while seen["rows"] < 1:
        time.sleep(0.1)
    lead = max(10_000, n // 100)
    second = now_ms() + lead
    second -= second % 1000
    offsets = np.random.default_rng(2).integers(1, 1001, size=n)
    enqueue_table(store, n, lambda s, k: second + offsets[s:s + k])
    store.deliver_due()  # into the wheel
    deadline = time.monotonic() + lead / 1000 + 600
    while seen["rows"] < n + 1 and time.monotonic() < deadline:
        if background:  # a deliverer beside the query, as a producer-side daemon would be
            store.deliver_due()
            time.sleep(0.05)
        else:
            time.sleep(0.1)
    if show_progress:
        time.sleep(2)  # the last batch's progress is posted after its sink returns
    progress = [(p["batchId"], p["numInputRows"], p["durationMs"]) for p in query.recentProgress]
    query.stop()
    spark.stop()
    store.close()
    if show_progress:
        for batch_id, rows, ms in progress:
            if rows:
                print(f"  batch {batch_id}: {rows:,} rows, durationMs {ms}")
    lat = np.concatenate(seen["lat"]) if seen["lat"] else np.empty(0)
    shutil.rmtree(path)
    return {"spark_rows": seen["rows"] - 1,
            "spark_all_seen_after_due_second_s": (seen["last"] - (second + 1000)) / 1000,
            "spark_seen_lateness_p50_ms": pct(lat, 50), "spark_seen_lateness_p99_ms": pct(lat, 99)}


_RSS_CHILD = """
import json, os, sys
sys.path.insert(0, {root!r})
from store import MessageStore, StoreConfig
def status():
    out = {{}}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[k] = int(v.split()[0]) * 1024
    return out
store = MessageStore.open(sys.argv[1], StoreConfig(timer_precision_ms={precision}),
                          flush_service=False)
opened = status()
# the compiled kernels (numba) every delivering process loads: a fixed cost, measured apart
from store import warm_up
warm_up()
before = status()
store.deliver_due()
store.deliver_due()
pending = store.timer.pending_count()
after = status()
maps, name = {{}}, None
for line in open("/proc/self/smaps"):
    head = line.split()
    if "-" in head[0] and len(head) >= 5:
        name = head[5] if len(head) > 5 else "[anon]"
    elif head[0] == "Rss:":
        maps[name] = maps.get(name, 0) + int(head[1]) * 1024
top = sorted(maps.items(), key=lambda kv: -kv[1])[:5]
store.close()
print(json.dumps({{"opened": opened, "before": before, "after": after, "pending": pending,
                  "top": top}}))
"""


def bench_memory(base: str, pending: int, precision: int) -> dict:
    full = os.path.join(base, "pending")
    empty = os.path.join(base, "empty")
    with MessageStore.open(empty, config(precision)):
        pass
    with MessageStore.open(full, config(precision), flush_service=False) as store:
        start = now_ms()
        rng = np.random.default_rng(3)
        day = 86_400_000
        send_s = enqueue_batched(store, pending, lambda s, k: start + rng.integers(
            3_600_000, 30 * day, size=k))  # none falls due while they are being sent
    script = _RSS_CHILD.format(root=ROOT, precision=precision)
    res = {}
    for name, path in (("empty", empty), ("full", full)):
        out = subprocess.run([sys.executable, "-c", script, path], capture_output=True,
                             text=True, check=True).stdout
        res[name] = json.loads(out.strip().splitlines()[-1])
    growth = {k: (res["full"]["after"][k] - res["empty"]["after"][k]) / 2**20
              for k in res["full"]["after"]}
    print("  largest mappings with the pending store:",
          [(name, round(b / 2**20, 1)) for name, b in res["full"]["top"]])
    disk = sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(full)
               for f in fs)
    shutil.rmtree(full)
    shutil.rmtree(empty)
    return {"pending": res["full"]["pending"], "append_for_pending_per_s": pending / send_s,
            "rss_empty_mb": res["empty"]["after"]["VmRSS"] / 2**20,
            "rss_full_mb": res["full"]["after"]["VmRSS"] / 2**20,
            "rss_growth_mb": growth["VmRSS"], "rss_anon_growth_mb": growth.get("RssAnon"),
            "kernels_rss_mb": (res["empty"]["before"]["VmRSS"]
                               - res["empty"]["opened"]["VmRSS"]) / 2**20,
            "store_disk_gb": disk / 2**30}


# ---------------------------------------------------------------------------- redis
def bench_redis(base: str, n: int) -> dict | None:
    server = shutil.which("redis-server")
    try:
        import redis
    except ImportError:
        redis = None
    if server is None or redis is None:
        print("  redis: skipped (redis-server or the redis package is absent)")
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = os.path.join(base, "redis")
    os.makedirs(workdir)
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        lead = max(20_000, n // 15)
        second = now_ms() + lead
        second -= second % 1000
        dues = second + np.random.default_rng(1).integers(1, 1001, size=n)
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            pipe = client.pipeline(transaction=False)
            mapping = {b"%d:" % (start + i) + BODY: int(dues[start + i])
                       for i in range(min(BATCH, n - start))}
            pipe.zadd("delayed", mapping)
            pipe.execute()
        enqueue_s = time.perf_counter() - t0
        while now_ms() < second + 1000:
            time.sleep(0.01)
        moved, busy, lat = 0, 0.0, []
        while moved < n:
            t0 = time.perf_counter()
            now = now_ms()
            items = client.zrangebyscore("delayed", "-inf", now, start=0, num=BATCH,
                                         withscores=True)
            if items:
                pipe = client.pipeline(transaction=True)
                members = [m for m, _ in items]
                pipe.zrem("delayed", *members)
                pipe.rpush("orders", *members)
                pipe.execute()
                done = now_ms()
                lat.append(done - np.array([sc for _, sc in items], dtype=np.int64))
                moved += len(items)
            busy += time.perf_counter() - t0
        all_moved = now_ms()
        lat = np.concatenate(lat)
        return {"redis_enqueue_per_s": n / enqueue_s, "redis_move_per_s": n / busy,
                "redis_all_moved_after_due_second_s": (all_moved - (second + 1000)) / 1000,
                "redis_lateness_p50_ms": pct(lat, 50), "redis_lateness_p99_ms": pct(lat, 99),
                "redis_rss_mb": client.info("memory")["used_memory_rss"] / 2**20}
    finally:
        proc.terminate()
        proc.wait(10)


# ---------------------------------------------------------------------------- report
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000, help="burst size")
    ap.add_argument("--pending", type=int, default=1_000_000,
                    help="pending messages for the memory measurement (target: 10,000,000)")
    ap.add_argument("--single", type=int, default=20_000, help="messages sent one at a time")
    ap.add_argument("--precision-ms", type=int, default=1000)
    ap.add_argument("--spark", action="store_true", help="also read the burst with Spark")
    ap.add_argument("--spark-deliverer", choices=("query", "background"), default="query",
                    help="who calls deliver_due: the query (deliverDue=true) or a loop beside it")
    ap.add_argument("--progress", action="store_true",
                    help="print each Spark micro-batch's rows and durationMs phases")
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated: enqueue,burst,levels,memory")
    ap.add_argument("--dir", default=None, help="where the stores go (a temp dir by default)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bench-timer-", dir=args.dir)
    skip = set(filter(None, args.skip.split(",")))
    results: dict = {"messages": args.messages, "precision_ms": args.precision_ms}
    try:
        if "enqueue" not in skip:
            print("enqueue ...", flush=True)
            results.update(bench_enqueue(base, args.precision_ms, args.single))
        if "burst" not in skip:
            print("burst ...", flush=True)
            results.update(bench_burst(base, args.messages, args.precision_ms))
        if "levels" not in skip:
            print("levels ...", flush=True)
            results.update(bench_levels(base, args.messages))
        if args.spark:
            print("spark ...", flush=True)
            results.update(bench_spark(base, args.messages, args.precision_ms,
                                       args.spark_deliverer == "background", args.progress))
            results["spark_deliverer"] = args.spark_deliverer
        if "memory" not in skip:
            print("memory ...", flush=True)
            results.update(bench_memory(base, args.pending, args.precision_ms))
        if not args.no_redis:
            print("redis ...", flush=True)
            results.update(bench_redis(base, args.messages) or {})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(results)


def report(r: dict) -> None:
    def row(name, value, target="", ratio=""):
        print(f"  {name:<52} {value:>14} {target:>22} {ratio:>10}")

    def f(key, fmt="{:,.0f}"):
        return fmt.format(r[key]) if key in r and r[key] is not None else "-"

    def ratio(ours, theirs, higher_is_better=True):
        if ours not in r or theirs not in r or not r[theirs]:
            return ""
        x = r[ours] / r[theirs] if higher_is_better else r[theirs] / max(r[ours], 1e-9)
        return f"{x:.2f}x"

    print(f"\ndelayed messages: {r['messages']:,} due in one second, "
          f"timer_precision_ms={r['precision_ms']}")
    row("figure", "value", "target", "vs redis")
    row("send(delay_ms) one at a time, msg/s", f("send_per_message"))
    row("delayed rows sent 10k per send_table, msg/s", f("append_batched_per_s"), ">= 500,000",
        ratio("append_batched_per_s", "redis_enqueue_per_s"))
    row("queued -> wheel (enqueue), msg/s", f("wheel_enqueue_per_s"), "~2,000,000")
    row("deliver_due, msg/s", f("deliver_per_s"), ">= 1,000,000",
        ratio("deliver_per_s", "redis_move_per_s"))
    row("all visible after the due second, s", f("all_visible_after_due_second_s", "{:.2f}"),
        "<= 1.5 s",
        ratio("all_visible_after_due_second_s", "redis_all_moved_after_due_second_s", False))
    row("lateness store-deliver p50, ms", f("lateness_p50_ms"), "<= precision")
    row("lateness store-deliver p99, ms", f("lateness_p99_ms"))
    if "levels_deliver_per_s" in r:
        row(f"levels: sent at delay level {r['levels_level']}, msg/s", f("levels_send_per_s"),
            ">= 500,000")
        row("levels: due within, s", f("levels_due_spread_s", "{:.2f}"))
        row("levels: deliver_due, msg/s", f("levels_deliver_per_s"), ">= 1,000,000")
        row("levels: all visible after the last was due, s",
            f("levels_all_visible_after_last_due_s", "{:.2f}"))
        row("levels: lateness store-deliver p50 / p99, ms",
            f"{r['levels_lateness_p50_ms']:.0f} / {r['levels_lateness_p99_ms']:.0f}")
    if "spark_rows" in r:
        row("spark: rows seen", f("spark_rows"))
        row("spark: all seen after the due second, s",
            f("spark_all_seen_after_due_second_s", "{:.2f}"), "<= 5 s")
        row("spark: seen - due p50, ms", f("spark_seen_lateness_p50_ms"))
        row("spark: seen - due p99, ms", f("spark_seen_lateness_p99_ms"))
    if "pending" in r:
        row(f"memory: RSS growth, {r['pending']:,} pending, MB", f("rss_growth_mb", "{:.1f}"),
            "<= 64 MB at 10M")
        row("memory: RssAnon growth, MB", f("rss_anon_growth_mb", "{:.1f}"))
        row("memory: compiled kernels loaded (both sides), MB", f("kernels_rss_mb", "{:.1f}"))
        row("memory: RSS empty / full store, MB",
            f"{r['rss_empty_mb']:.0f} / {r['rss_full_mb']:.0f}")
        row("memory: store on disk, GiB", f("store_disk_gb", "{:.2f}"))
    if "redis_enqueue_per_s" in r:
        row("redis: ZADD pipelined, msg/s", f("redis_enqueue_per_s"))
        row("redis: move due (ZRANGEBYSCORE/ZREM/RPUSH), msg/s", f("redis_move_per_s"))
        row("redis: all moved after the due second, s",
            f("redis_all_moved_after_due_second_s", "{:.2f}"))
        row("redis: lateness p50 / p99, ms",
            f"{r['redis_lateness_p50_ms']:.0f} / {r['redis_lateness_p99_ms']:.0f}")
        row("redis: server RSS, MB", f("redis_rss_mb", "{:.0f}"))
    print(json.dumps(r, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
