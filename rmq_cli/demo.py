"""``rmq demo``: the order time-out pipeline, end to end, on an embedded store.

The scenario of the seed articles, with RocketMQ's 30-minute time-out scaled to seconds:

1. A producer thread creates orders (topic ``orders``).
2. Spark query ``scheduler`` reads the orders as a stream and schedules each one's delayed
   "close if unpaid" message (topic ``order_timeouts``, timer wheel, ``timeout_s`` ahead)
   through the exactly-once ``rmq`` sink (``writeStream.format("rmq")`` with ``delay_ms``).
3. Most orders are paid through transactional messages (topic ``payments``): committed at
   once, rolled back, or left UNKNOW for the check loop; a few are never paid.
4. Spark query ``pipeline`` reads orders, payments and time-outs as micro-batches and closes
   every order whose time-out surfaces while it is unpaid (topic ``order_closed``).
5. Spark query ``check_loop`` reads ``view=transaction_checks``, joins the half messages with
   the orders table (did the customer really pay?) and writes COMMIT / ROLLBACK back with
   ``action=end_transaction``.
6. "Remind every N seconds until paid": when the pipeline sees an order it adds a recurring
   schedule (key ``remind-<order>``, ``every_ms``) that fires a reminder into topic
   ``payment_reminders``; when it sees the order's payment, or closes the order, it removes
   the schedule.  The pipeline reads the reminders too.

At the end it checks the invariants (every time-out seen once and never early, exactly the
committed payments seen, exactly the unpaid orders closed; every reminder seen once and
never early, none fired after its order's schedule was removed, reminders reached the
pipeline, no schedule left) and prints a summary.  How many of the orders closed unpaid were
reminded first is a figure, not an invariant: it depends on how soon the pipeline sees an
order on a loaded machine (a schedule removed before its first due time fires nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .session import local_spark

ORDERS, PAYMENTS, TIMEOUTS, CLOSED = "orders", "payments", "order_timeouts", "order_closed"
REMINDERS = "payment_reminders"
SCHEDULE_KEY, FIRE_MS = "RMQ_SCHEDULE_KEY", "RMQ_SCHEDULE_FIRE_MS"  # on every reminder
WARMUP = "warm-up"  # key of the messages that start both queries before the orders flow

# how each order's payment goes (fractions of all orders)
OUTCOMES = (("commit", 0.70), ("rollback", 0.08), ("unknown_paid", 0.10),
            ("unknown_unpaid", 0.05), ("no_payment", 0.07))


@dataclass
class DemoState:
    """What the pipeline query has seen (updated on the driver by foreachBatch)."""

    created: set = field(default_factory=set)
    paid: dict = field(default_factory=dict)  # order id -> times seen
    timeouts_seen: dict = field(default_factory=dict)  # order id -> times seen
    closed: set = field(default_factory=set)
    paid_after_close: set = field(default_factory=set)
    early: list = field(default_factory=list)
    lateness_store_ms: list = field(default_factory=list)
    lateness_seen_ms: list = field(default_factory=list)
    warm: set = field(default_factory=set)  # topics whose warm-up message was seen
    reminding: set = field(default_factory=set)  # orders with a reminder schedule now
    reminder_removed_ms: dict = field(default_factory=dict)  # order -> when removed
    reminders: list = field(default_factory=list)  # (order, fire ms, stored ms, seen ms)
    batches: int = 0
    rows: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _PaymentListener:
    """Local transaction of the payment service: the outcome was decided per order."""

    def __init__(self, outcomes: dict) -> None:
        self.outcomes = outcomes

    def execute_local_transaction(self, message, arg):
        from store import LocalTransactionState

        outcome = self.outcomes.get(arg, "unknown_paid")
        if outcome == "commit":
            return LocalTransactionState.COMMIT_MESSAGE
        if outcome == "rollback":
            return LocalTransactionState.ROLLBACK_MESSAGE
        return LocalTransactionState.UNKNOW  # the check loop decides

    def check_local_transaction(self, message_view):
        from store import LocalTransactionState

        return LocalTransactionState.UNKNOW


def _produce(store, n: int, timeout_ms: int, outcomes: dict, rate_per_s: float,
             progress: dict, stop: threading.Event) -> None:
    from store import Message

    producer = store.producer("order-service")
    payer = store.transaction_producer("pay-service", _PaymentListener(outcomes))
    start = time.time()
    for i in range(n):
        if stop.is_set():
            return
        oid = f"o-{i:06d}"
        body = json.dumps({"order": oid, "amount": 10 + i % 90}).encode()
        producer.send(Message(ORDERS, body, tags="created", keys=oid))
        if outcomes[oid] != "no_payment":
            payer.send_in_transaction(Message(PAYMENTS, body, tags="paid", keys=oid), arg=oid)
        progress["produced"] = i + 1
        # pace the orders so that the run looks like a live system
        ahead = (i + 1) / rate_per_s - (time.time() - start)
        if ahead > 0:
            time.sleep(ahead)
    progress["produce_s"] = time.time() - start


def _pipeline_batch(state: DemoState, store_path: str, remind_ms: int):
    """foreachBatch handler of the pipeline query (runs on the driver)."""
    import pyarrow as pa

    from store import Message, MessageStore

    closer_store = {"s": None}

    def handle(df, batch_id: int) -> None:
        seen_ms = time.time_ns() // 1_000_000
        rows = df.select("topic", "keys", "store_timestamp", "deliver_timestamp",
                         "properties").collect()
        to_close = []
        new_orders = []
        with state.lock:
            state.batches += 1
            state.rows += len(rows)
            # payments before time-outs: a payment and its time-out may share a batch
            for r in rows:
                oid = r["keys"][0] if r["keys"] else None
                if oid == WARMUP:
                    state.warm.add(r["topic"])
                    continue
                if r["topic"] == ORDERS:
                    state.created.add(oid)
                    new_orders.append(oid)
                elif r["topic"] == PAYMENTS:
                    state.paid[oid] = state.paid.get(oid, 0) + 1
                    if oid in state.closed:  # paid after its time-out closed it: refund
                        state.paid_after_close.add(oid)
                elif r["topic"] == REMINDERS:
                    props = dict(r["properties"] or {})
                    state.reminders.append((
                        props.get(SCHEDULE_KEY, "").removeprefix("remind-"),
                        int(props.get(FIRE_MS, -1)),
                        int(r["store_timestamp"].timestamp() * 1000), seen_ms))
            for r in rows:
                if r["topic"] != TIMEOUTS or not r["keys"] or r["keys"][0] == WARMUP:
                    continue
                oid = r["keys"][0]
                state.timeouts_seen[oid] = state.timeouts_seen.get(oid, 0) + 1
                due = int(r["deliver_timestamp"].timestamp() * 1000)
                stored = int(r["store_timestamp"].timestamp() * 1000)
                state.lateness_store_ms.append(stored - due)
                state.lateness_seen_ms.append(seen_ms - due)
                if stored < due or seen_ms < due:
                    state.early.append(oid)
                if oid not in state.paid and oid not in state.closed:
                    state.closed.add(oid)
                    to_close.append(oid)
            # reminders: one schedule per open order, removed once it is paid or closed
            add = [o for o in new_orders if o not in state.paid and o not in state.closed]
            remove = [o for o in state.reminding if o in state.paid or o in state.closed]
            state.reminding.difference_update(remove)
            state.reminding.update(add)
        if closer_store["s"] is None and (to_close or add or remove):
            closer_store["s"] = MessageStore.open(store_path)
        if add or remove:
            keys = [f"remind-{o}" for o in remove + add]
            ops = pa.table({
                "key": keys,
                "body": [None] * len(remove) + [json.dumps({"order": o}).encode() for o in add],
                "tags": [None] * len(remove) + ["remind"] * len(add),
                "every_ms": pa.array([None] * len(remove) + [remind_ms] * len(add), pa.int64()),
            })
            closer_store["s"].producer("order-service").schedule_table(ops, topic=REMINDERS)
            done_ms = time.time_ns() // 1_000_000
            with state.lock:
                for o in remove:
                    state.reminder_removed_ms[o] = done_ms
        if to_close:
            producer = closer_store["s"].producer("order-closer")
            for oid in to_close:
                producer.send(Message(CLOSED, json.dumps({"order": oid}).encode(),
                                      tags="closed", keys=oid))

    return handle


class _NoLive:
    def update(self, *_):
        pass


def _render(progress: dict, state: DemoState, store, n: int, started: float):
    from rich.table import Table

    t = Table(title=f"rmq demo — {time.time() - started:5.1f} s", min_width=60)
    t.add_column("what")
    t.add_column("count", justify="right")
    with state.lock:
        rows = [
            ("orders produced", f"{progress.get('produced', 0)} / {n}"),
            ("orders seen by the pipeline", len(state.created)),
            ("payments seen (committed)", len(state.paid)),
            ("time-outs surfaced", len(state.timeouts_seen)),
            ("orders closed by time-out", len(state.closed)),
            ("payment reminders seen", len(state.reminders)),
            ("orders being reminded now", len(state.reminding)),
            ("check-loop answers", progress.get("checks", 0)),
            ("micro-batches", state.batches),
            ("early deliveries", len(state.early)),
        ]
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def run_demo(*, store_path: str | None = None, orders: int = 2000, timeout_s: float = 6.0,
             remind_s: float = 2.0, quiet: bool = False, seed: int = 7) -> bool:
    """Run the demo; return True when every invariant held."""
    from rich.console import Console
    from rich.live import Live

    from store import MessageStore, StoreConfig

    console = Console(stderr=False)
    tmp = tempfile.mkdtemp(prefix="rmq-demo-")
    path = store_path or os.path.join(tmp, "store")
    timeout_ms = int(timeout_s * 1000)
    rng = random.Random(seed)
    names = [o for o, _ in OUTCOMES]
    weights = [w for _, w in OUTCOMES]
    outcomes = {f"o-{i:06d}": rng.choices(names, weights)[0] for i in range(orders)}
    config = StoreConfig(timer_precision_ms=100, transaction_timeout_ms=1000)
    store = MessageStore.open(path, config)
    console.print(f"[bold]rmq demo[/bold]: {orders} orders, time-out {timeout_s:g} s, "
                  f"reminders every {remind_s:g} s until paid, store {path}")
    remind_ms = int(remind_s * 1000)
    console.print("starting Spark (local[2]) ...")
    spark = local_spark("rmq-demo", tmp)
    state = DemoState()
    progress: dict = {}
    started = time.time()
    ok = False
    queries = []
    stop = threading.Event()
    producer = None
    try:
        _start_queries(queries, spark, path, tmp, outcomes, state, timeout_ms, remind_ms)
        console.print("warming up the three streaming queries ...")
        _warm_up(store, state, queries)
        console.print(f"queries ready after {time.time() - started:.1f} s; producing orders")
        started = time.time()
        rate = max(50.0, orders / 15.0)  # produce for about 15 s
        producer = threading.Thread(target=_produce, daemon=True,
                                    args=(store, orders, timeout_ms, outcomes, rate, progress,
                                          stop))
        producer.start()
        deadline = time.time() + orders / rate + timeout_s + 60
        live_cm = (contextlib.nullcontext(_NoLive()) if quiet else
                   Live(_render(progress, state, store, orders, started), console=console,
                        refresh_per_second=4, transient=False))
        with live_cm as live:
            _watch(live, queries, producer, progress, state, store, orders, started, deadline,
                   remind_s)
        stop.set()
        producer.join(timeout=10)
        elapsed = time.time() - started
        _stop_queries(queries)  # (their batches change the state: the summary's is final)
        left = [s.key for s in store.schedules() if s.key.startswith("remind-")]
        with state.lock:
            ok = _summary(console, state, outcomes, progress, elapsed, left)
    finally:
        stop.set()
        if producer is not None:
            producer.join(timeout=30)
        _stop_queries(queries)
        spark.stop()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)  # checkpoints; a --store DIR lies outside
    return ok


def _start_queries(queries: list, spark, path: str, tmp: str, outcomes: dict,
                   state: DemoState, timeout_ms: int, remind_ms: int) -> None:
    """Start the demo's three streaming queries into ``queries`` (each as it starts, so that
    the caller stops the started ones whatever happens): the check loop's answers, each
    order's time-out scheduled through the exactly-once sink, and the pipeline."""
    from pyspark.sql import functions as F

    # the orders table the check loop joins against: did the customer really pay?
    table = spark.createDataFrame(
        [(oid, outcome == "unknown_paid") for oid, outcome in outcomes.items()
         if outcome.startswith("unknown")] + [(WARMUP, True)], "order_id string, paid boolean")
    checks = (spark.readStream.format("rmq").option("view", "transaction_checks")
              .load(path))
    decisions = (checks.withColumn("order_id", F.col("keys")[0])
                 .join(table, "order_id", "left")
                 .select("transaction_id",
                         F.when(F.col("paid"), "COMMIT").when(~F.col("paid"), "ROLLBACK")
                         .otherwise("UNKNOWN").alias("state")))

    queries.append(
        decisions.writeStream.format("rmq").option("action", "end_transaction")
        .option("checkpointLocation", os.path.join(tmp, "chk-checks"))
        .trigger(processingTime="500 milliseconds").start(path))
    # each order's time-out, scheduled through the exactly-once sink
    new_orders = (spark.readStream.format("rmq").option("subscribe", ORDERS)
                  .option("startingOffsets", "earliest").load(path))
    queries.append(
        new_orders.select(F.lit(TIMEOUTS).alias("topic"), "body",
                          F.lit("close_if_unpaid").alias("tags"), "keys",
                          F.lit(timeout_ms).cast("long").alias("delay_ms"))
        .writeStream.format("rmq").queryName("scheduler")
        .option("checkpointLocation", os.path.join(tmp, "chk-scheduler"))
        .trigger(processingTime="250 milliseconds").start(path))
    stream = (spark.readStream.format("rmq")
              .option("subscribe", f"{ORDERS},{PAYMENTS},{TIMEOUTS},{REMINDERS}")
              .option("startingOffsets", "earliest").load(path))
    queries.append(
        stream.writeStream.foreachBatch(_pipeline_batch(state, path, remind_ms))
        .option("checkpointLocation", os.path.join(tmp, "chk-pipeline"))
        .trigger(processingTime="250 milliseconds").start())


def _raise_if_failed(queries: list) -> None:
    for q in queries:
        if q.exception() is not None:
            raise RuntimeError(f"query {q.name or q.id} failed: {q.exception()}")


def _warm_up(store, state: DemoState, queries: list) -> None:
    """One order and one UNKNOWN payment go through the queries before the orders flow, so
    Spark's cold start does not count as lateness."""
    from store import Message

    store.producer("order-service").send(Message(ORDERS, b"{}", keys=WARMUP))
    store.transaction_producer("pay-service", _PaymentListener({})).send_in_transaction(
        Message(PAYMENTS, b"{}", keys=WARMUP), arg=WARMUP)
    warm_deadline = time.time() + 120

    def scheduled() -> int:
        return sum(p.get("numInputRows", 0) for p in queries[1].recentProgress)

    while ({ORDERS, PAYMENTS} - state.warm or not scheduled()) \
            and time.time() < warm_deadline:
        _raise_if_failed(queries)
        time.sleep(0.2)
    if {ORDERS, PAYMENTS} - state.warm or not scheduled():
        raise RuntimeError("the streaming queries did not start within 120 s")


def _watch(live, queries: list, producer, progress: dict, state: DemoState, store,
           orders: int, started: float, deadline: float, remind_s: float) -> None:
    """Show the counts until every time-out surfaced (or ``deadline``), then a little longer:
    reminders stop once removed, and anything still firing shows in this wait."""
    while time.time() < deadline:
        _raise_if_failed(queries)
        progress["checks"] = sum(p.get("numInputRows", 0)
                                 for p in queries[0].recentProgress)
        live.update(_render(progress, state, store, orders, started))
        with state.lock:
            done = len(state.timeouts_seen) >= orders and not producer.is_alive() \
                and not state.reminding
        if done:
            break
        time.sleep(0.25)
    quiet_until = time.time() + 2 * remind_s + 1
    while time.time() < quiet_until:
        live.update(_render(progress, state, store, orders, started))
        time.sleep(0.25)
    live.update(_render(progress, state, store, orders, started))


def _stop_queries(queries: list) -> None:
    """Stop every streaming query (each ``stop`` returns once its batch in flight ended)."""
    for q in queries:
        try:
            q.stop()
        except Exception:  # noqa: BLE001 - a query that failed or stopped already
            pass


def _summary(console, state: DemoState, outcomes: dict, progress: dict, elapsed: float,
             schedules_left: list) -> bool:
    from rich.table import Table

    paid_expected = {o for o, k in outcomes.items() if k in ("commit", "unknown_paid")}
    unpaid_expected = set(outcomes) - paid_expected
    n = len(outcomes)
    lat_store = np.array(state.lateness_store_ms or [0])
    lat_seen = np.array(state.lateness_seen_ms or [0])
    produced_msgs = n * 2 + sum(1 for k in outcomes.values() if k != "no_payment")
    fires = [(o, f) for o, f, _, _ in state.reminders]
    early_reminders = [o for o, f, stored, seen in state.reminders if f < 0 or stored < f]
    late_reminders = [o for o, f, _, _ in state.reminders
                      if o in state.reminder_removed_ms and f > state.reminder_removed_ms[o]]
    reminded = {o for o, _, _, _ in state.reminders}
    per_unpaid = [sum(1 for o, *_ in state.reminders if o == u) for u in state.closed]
    checks = [
        ("every order produced", progress.get("produced", 0) == n),
        ("every time-out surfaced exactly once",
         len(state.timeouts_seen) == n and all(v == 1 for v in state.timeouts_seen.values())),
        ("nothing surfaced early", not state.early),
        ("exactly the committed payments seen, once each",
         set(state.paid) == paid_expected and all(v == 1 for v in state.paid.values())),
        ("every unpaid order closed, and no order paid before its time-out",
         state.closed == unpaid_expected | state.paid_after_close
         and state.paid_after_close <= paid_expected),
        ("every reminder seen once, never early",
         len(fires) == len(set(fires)) and not early_reminders),
        ("no reminder fired after its order's schedule was removed", not late_reminders),
        ("reminders reached the pipeline", bool(state.reminders) or not unpaid_expected),
        ("no reminder schedule left once every order was paid or closed",
         not schedules_left and not state.reminding),
    ]
    t = Table(title="summary")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("orders", str(n))
    t.add_row("paid (committed at once / after the check loop)",
              f"{len(state.paid)} ({sum(k == 'commit' for k in outcomes.values())} / "
              f"{sum(k == 'unknown_paid' for k in outcomes.values())})")
    t.add_row("closed by time-out", str(len(state.closed)))
    t.add_row("paid only after the time-out closed them (refunds)",
              str(len(state.paid_after_close)))
    t.add_row("delivered early", str(len(state.early)))
    closed_unpaid = unpaid_expected & state.closed
    t.add_row("payment reminders (orders reminded; per order closed unpaid, mean)",
              f"{len(state.reminders)} ({len(reminded)}; "
              f"{np.mean(per_unpaid) if per_unpaid else 0:.1f})")
    t.add_row("orders closed unpaid that were reminded first",
              f"{len(closed_unpaid & reminded)} of {len(closed_unpaid)}")
    t.add_row("lateness p50 / p99 (store - due)",
              f"{np.percentile(lat_store, 50):.0f} / {np.percentile(lat_store, 99):.0f} ms")
    t.add_row("lateness p50 / p99 (seen by Spark - due)",
              f"{np.percentile(lat_seen, 50):.0f} / {np.percentile(lat_seen, 99):.0f} ms")
    t.add_row("messages produced per second (the producer is paced)",
              f"{produced_msgs / max(progress.get('produce_s', elapsed), 1e-9):.0f}")
    t.add_row("rows through the pipeline per second (same pace)", f"{state.rows / elapsed:.0f}")
    t.add_row("micro-batches", str(state.batches))
    console.print(t)
    for name, passed in checks:
        console.print(("[green]PASS[/green] " if passed else "[red]FAIL[/red] ") + name)
    return all(p for _, p in checks)
