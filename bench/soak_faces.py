"""Soak of the network faces: ``rmq serve --listen`` (Arrow Flight) and ``--grpc`` (RocketMQ 5)
under mixed clients for a long time, then a check that nothing acknowledged was lost or doubled
and that the server's memory, threads and open files came back to where they were.

Run::

    PYTHONPATH=. python bench/soak_faces.py [--minutes 30] [--dir DIR] [--flight-producers 2]
        [--flight-readers 2] [--sinks 1] [--grpc-producers 2] [--grpc-consumers 2]
        [--vanishing 1]

One server in a process of its own (``rmq serve --store DIR/store --create --listen
127.0.0.1:P --token-file T --grpc 127.0.0.1:G``) and every client in a process of its own,
each bounded in rate (a few hundred operations a second in all, so that a 2-core machine is
not merely saturated):

* ``flight-producer``  ``producer.send`` of one message and ``send_table`` of 50 rows, in turns;
* ``flight-reader``    ``pull`` over the queues of the Flight topic, and a ``follow`` of the
  sink's topic, in turns;
* ``sink``             ``remote.sink(id)``: two stages of 100 rows, then the batch's commit;
* ``grpc-producer``    the official client's ``Producer.send``, one in four delayed 1-4 s;
* ``grpc-consumer``    the official ``SimpleConsumer``: ``receive`` (long poll 2 s) and ``ack``;
* vanishing clients, each SIGKILLed at a random moment (1-12 s after its start) and started
  again, for the whole run: a Flight client sending 500-row tables (DoExchange) and
  staging 500-row sink batches (DoPut) then committing; a gRPC producer; a gRPC
  ``SimpleConsumer`` in long polls of 20 s.

Every message carries a unique body ``worker:incarnation:seq``.  Before a send the client
appends the ids it is about to send to its ``attempt`` file, after the acknowledgement to its
``ack`` file (flushed at once).  The server's ``VmRSS``, ``RssAnon``, thread count and open
files are sampled from the end of a warm-up (at least 2 min, a sixth of shorter runs, then
until the heap has settled, at most a third of the run: see ``_warm_up``), every 30 s, and
at the end after the clients stopped and a settle period (30 s; delayed messages come due
meanwhile).  Then
the server is stopped (SIGTERM), the store opened and checked (after one ``deliver_due()`` of
the stopped store, which delivers what a server that died left pending):

* every acknowledged id is stored exactly once (delayed ones in their topic, delivered);
* no id is stored twice, and none that no client tried to send (a killed client's rows
  that were never acknowledged may be there, once, or not at all);
* no request is stored in part (a table or a sink batch: all of its rows or none);
* ``RssAnon`` (the heap), threads and open files at the end are at most 1.10x the
  warm-up's and 1.05x the run's middle, and the heap settled within the first third of the
  run (``VmRSS`` is reported too: it counts the mapped pages of the growing store); the
  heap's growth after the warm-up is reported in MiB per 10 minutes.

Prints a JSON summary; exits 1 on any violation.  Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_grpc import free_port, wait_port

T_FLIGHT = "soak-flight"
T_SINK = "soak-sink"
T_GRPC = "soak-grpc"
T_VANISH = "soak-vanish"
TOPICS = (T_FLIGHT, T_SINK, T_GRPC, T_VANISH)
PAD = b"." * 64


# --------------------------------------------------------------------------- records
class Log:
    """The ids a client tried to send and those acknowledged, as ranges ``start end``."""

    def __init__(self, run: str, worker: str, inc: int) -> None:
        self.worker, self.inc, self.seq = worker, inc, 0
        base = os.path.join(run, "records", f"{worker}.{inc}")
        self._attempt = open(base + ".attempt", "a", buffering=1)  # noqa: SIM115
        self._ack = open(base + ".ack", "a", buffering=1)  # noqa: SIM115
        self.ops: Counter = Counter()

    def body(self, seq: int) -> bytes:
        return f"{self.worker}:{self.inc}:{seq}:".encode() + PAD

    def take(self, n: int) -> tuple[int, int]:
        """Reserve ``n`` ids and note them tried (before the send)."""
        start = self.seq
        self.seq += n
        self._attempt.write(f"{start} {self.seq}\n")
        self._attempt.flush()
        return start, self.seq

    def acked(self, span: tuple[int, int], op: str) -> None:
        self._ack.write(f"{span[0]} {span[1]}\n")
        self._ack.flush()
        self.ops[op] += 1

    def stats(self, run: str, **more) -> None:
        with open(os.path.join(run, "stats", f"{self.worker}.{self.inc}.json"), "w") as f:
            json.dump({"worker": self.worker, "ops": dict(self.ops), **more}, f)


def bodies(log: Log, span: tuple[int, int]) -> list[bytes]:
    return [log.body(s) for s in range(*span)]


class Pace:
    """At most ``rate`` calls a second (sleeps the rest)."""

    def __init__(self, rate: float) -> None:
        self.step, self.next = 1.0 / rate, time.monotonic()

    def __call__(self) -> None:
        self.next += self.step
        delay = self.next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            self.next = time.monotonic()


def quiet() -> None:
    import logging

    logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
    logging.getLogger("rocketmq").setLevel(logging.CRITICAL)


def guarded(fn, errors: Counter, name: str) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 -- a refused or failed call: counted, the client goes on
        errors[f"{name}: {type(exc).__name__}"] += 1
        time.sleep(0.2)


def until_stopped(stop, pace: Pace, fn, errors: Counter, name: str, close) -> None:
    """``fn`` at the pace until ``stop`` is set, then ``close``."""
    try:
        while not stop.is_set():
            guarded(fn, errors, name)
            pace()
    finally:
        close()


# --------------------------------------------------------------------------- Flight clients
def flight_producer(cfg: dict, worker: str, inc: int, stop) -> None:
    import pyarrow as pa

    from store import Message, connect

    log, errors, pace = Log(cfg["run"], worker, inc), Counter(), Pace(cfg["rate"])
    with connect(cfg["url"], token_file=cfg["token_file"]) as remote:
        producer = remote.producer("soak-flight")

        def send():
            span = log.take(1)
            producer.send(Message(T_FLIGHT, log.body(span[0])))
            log.acked(span, "send")

        def send_table():
            span = log.take(50)
            producer.send_table(pa.table({"body": pa.array(bodies(log, span), pa.binary())}),
                                topic=T_FLIGHT)
            log.acked(span, "send_table")

        i = 0
        while not stop.is_set():
            guarded(send if i % 2 else send_table, errors, "flight")
            i += 1
            pace()
    log.stats(cfg["run"], errors=dict(errors))


def flight_reader(cfg: dict, worker: str, inc: int, stop) -> None:
    from store import connect

    log, errors, pace = Log(cfg["run"], worker, inc), Counter(), Pace(cfg["rate"])
    rows = Counter()
    with connect(cfg["url"], token_file=cfg["token_file"]) as remote:
        offsets: dict[int, int] = {}

        def pull():
            remote.refresh()
            for q in remote.queue_ids(T_FLIGHT):
                at = max(offsets.get(q, 0), remote.min_offset(T_FLIGHT, q))
                got = remote.pull(T_FLIGHT, q, at, 64)
                offsets[q] = at + len(got)
                rows["pull"] += len(got)
            log.ops["pull"] += 1

        def follow():
            end = time.monotonic() + 1.0
            for _ in remote.follow(T_SINK, start="latest", poll_interval_s=0.2,
                                   stop=lambda: time.monotonic() > end or stop.is_set()):
                rows["follow"] += 1
            log.ops["follow"] += 1

        i = 0
        while not stop.is_set():
            guarded(follow if i % 4 == 3 else pull, errors, "reader")
            i += 1
            pace()
    log.stats(cfg["run"], errors=dict(errors), rows=dict(rows))


def flight_sink(cfg: dict, worker: str, inc: int, stop, rows_per_stage: int = 100,
                vanishing: bool = False) -> None:
    import pyarrow as pa

    from store import connect

    log, errors, pace = Log(cfg["run"], worker, inc), Counter(), Pace(cfg["rate"])
    topic = T_VANISH if vanishing else T_SINK
    with connect(cfg["url"], token_file=cfg["token_file"]) as remote:
        sink = remote.sink(f"soak-{worker}")
        producer = remote.producer("soak-vanish")
        batch = [int(time.time() * 1000) * 10]

        def one_batch():
            halves, spans = [], []
            for _ in range(2):
                span = log.take(rows_per_stage)
                table = pa.table({"topic": [topic] * rows_per_stage,
                                  "body": pa.array(bodies(log, span), pa.binary())})
                halves += sink.stage(table)
                spans.append(span)
                log.ops["stage"] += 1
            batch[0] += 1
            sink.commit(batch[0], halves)
            for span in spans:
                log.acked(span, "commit")
            log.ops["commit"] -= len(spans) - 1

        def big_table():
            span = log.take(rows_per_stage)
            producer.send_table(pa.table({"body": pa.array(bodies(log, span), pa.binary())}),
                                topic=T_VANISH)
            log.acked(span, "send_table")

        i = 0
        while not stop.is_set():
            guarded(big_table if vanishing and i % 2 else one_batch, errors, "sink")
            i += 1
            pace()
    log.stats(cfg["run"], errors=dict(errors))


# --------------------------------------------------------------------------- gRPC clients
def grpc_config(cfg: dict):
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(cfg["grpc"], Credentials(), request_timeout=10)


def grpc_producer(cfg: dict, worker: str, inc: int, stop) -> None:
    quiet()
    from rocketmq import Message, Producer

    log, errors, pace = Log(cfg["run"], worker, inc), Counter(), Pace(cfg["rate"])
    topic = T_VANISH if worker.startswith("vanish") else T_GRPC
    producer = Producer(grpc_config(cfg), (topic,))
    producer.startup()
    rng = random.Random(f"{worker}{inc}")

    def send():
        span = log.take(1)
        m = Message()
        m.topic, m.body = topic, log.body(span[0])
        delayed = rng.random() < 0.25
        if delayed:
            m.delivery_timestamp = int(time.time() * 1000) + rng.randint(1000, 4000)
        producer.send(m)
        log.acked(span, "send_delayed" if delayed else "send")

    until_stopped(stop, pace, send, errors, "grpc-producer", producer.shutdown)
    log.stats(cfg["run"], errors=dict(errors))


def grpc_consumer(cfg: dict, worker: str, inc: int, stop) -> None:
    quiet()
    from rocketmq import FilterExpression, SimpleConsumer

    log, errors, pace = Log(cfg["run"], worker, inc), Counter(), Pace(cfg["rate"])
    vanishing = worker.startswith("vanish")
    topic = T_VANISH if vanishing else T_GRPC
    consumer = SimpleConsumer(grpc_config(cfg), f"soak-cg-{'vanish' if vanishing else 'main'}",
                              {topic: FilterExpression()}, await_duration=20 if vanishing else 2)
    consumer.startup()
    seen: Counter = Counter()

    def receive():
        got = consumer.receive(16, 30)
        log.ops["receive"] += 1
        for m in got:
            seen[bytes(m.body)] += 1
            consumer.ack(m)
            log.ops["ack"] += 1

    until_stopped(stop, pace, receive, errors, "grpc-consumer", consumer.shutdown)
    log.stats(cfg["run"], errors=dict(errors), received=len(seen),
              received_again=sum(1 for c in seen.values() if c > 1))


def vanishing_flight(cfg: dict, worker: str, inc: int, stop) -> None:
    flight_sink(cfg, worker, inc, stop, rows_per_stage=500, vanishing=True)


KINDS = {"flight-producer": flight_producer, "flight-reader": flight_reader,
         "sink": flight_sink, "grpc-producer": grpc_producer, "grpc-consumer": grpc_consumer,
         "vanish-flight": vanishing_flight, "vanish-grpc-producer": grpc_producer,
         "vanish-grpc-consumer": grpc_consumer}
RATES = {"flight-producer": 20, "flight-reader": 10, "sink": 1, "grpc-producer": 20,
         "grpc-consumer": 10, "vanish-flight": 2, "vanish-grpc-producer": 20,
         "vanish-grpc-consumer": 5}


def child(kind: str, cfg: dict, worker: str, inc: int, stop) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if stop is None:  # a vanishing client: never asked to stop, only killed
        stop = threading.Event()
    KINDS[kind]({**cfg, "rate": RATES[kind]}, worker, inc, stop)


# --------------------------------------------------------------------------- the server
def fd_kinds(pid: int, top: int = 6) -> dict:
    """The most frequent targets of the open files (a leak shows which file it keeps)."""
    kinds: Counter = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":")[0] if ":" in target else target] += 1
    return dict(kinds.most_common(top))


def maps_kinds(pid: int, top: int = 4) -> dict:
    """The most frequently mapped files (count of mappings)."""
    kinds: Counter = Counter()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                kinds[parts[5].strip()] += 1
    return dict(kinds.most_common(top))


def sample(pid: int, detail: bool = False) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                fields[key] = int(value.split()[0])
    return {"rss_kib": fields["VmRSS"], "rss_anon_kib": fields["RssAnon"],
            "rss_file_kib": fields["RssFile"], "threads": fields["Threads"],
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "t": round(time.time(), 1),
            **({"fd_targets": fd_kinds(pid), "mapped": maps_kinds(pid)} if detail else {})}


def _mallinfo() -> dict:
    """glibc's own view of its heap (``mallinfo2``): bytes in use vs held free, in arenas and
    in ``mmap``-ed blocks; empty where the C library has no ``mallinfo2``."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = Info
    info = fn()
    return {"arena_mib": info.arena >> 20, "mmap_mib": info.hblkhd >> 20,
            "in_use_mib": info.uordblks >> 20, "free_mib": info.fordblks >> 20}


def _containers(min_len: int = 64) -> dict:
    """The dicts, lists, sets and deques held as attributes of rmq's and gRPC's objects,
    by ``Class.attribute``, with at least ``min_len`` items (summed over instances): where a
    map that grows with clients or calls shows itself."""
    import collections
    import gc

    sizes: Counter = Counter()
    kinds = (dict, list, set, collections.deque, collections.OrderedDict)
    for obj in gc.get_objects():
        module = getattr(type(obj), "__module__", None)
        if not isinstance(module, str) or not module.startswith(
                ("store.", "rmq_cli", "grpc", "rocketmq")):
            continue
        attributes = getattr(obj, "__dict__", None)
        for name, value in (attributes.items() if isinstance(attributes, dict) else ()):
            if isinstance(value, kinds):
                sizes[f"{type(obj).__name__}.{name}"] += len(value)
    return {k: v for k, v in sizes.most_common(25) if v >= min_len}


def _heap_tracer(out_dir: str, every_s: float, frames: int) -> None:
    """Every ``every_s``: the server's heap by owner, appended to ``out_dir/heap.jsonl``:
    ``RssAnon``; Arrow's memory pool; glibc's ``mallinfo2`` (in use and held free); threads;
    the most numerous live object types; the largest containers of rmq's and gRPC's objects
    (:func:`_containers`); with ``frames`` > 0, what ``tracemalloc`` traces and its 25
    largest growths since the first sample (by traceback of ``frames`` frames; slow: a
    snapshot walks every traced block)."""
    import gc
    import tracemalloc

    import pyarrow as pa

    first = None
    t0 = time.monotonic()
    with open(os.path.join(out_dir, "heap.jsonl"), "a", buffering=1) as out:
        while True:
            time.sleep(every_s)
            with open("/proc/self/status") as f:
                status = dict(line.split(":", 1) for line in f)
            row = {"minute": round((time.monotonic() - t0) / 60, 1),
                   "rss_anon_mib": int(status["RssAnon"].split()[0]) >> 10,
                   "threads": int(status["Threads"]),
                   "arrow_pool_mib": round(pa.total_allocated_bytes() / 2**20, 1),
                   "malloc": _mallinfo(),
                   "objects": Counter(type(o).__name__ for o in gc.get_objects()
                                      ).most_common(15),
                   "containers": _containers()}
            if frames:
                snap = tracemalloc.take_snapshot()  # (no filter_traces: a Python loop a trace)
                first = first or snap
                row["traced_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
                row["growth"] = [[round(st.size_diff / 2**10), st.count_diff,
                                  [f"{fr.filename.rsplit('/', 3)[-1]}:{fr.lineno}"
                                   for fr in st.traceback[:frames]]]
                                 for st in snap.compare_to(first, "traceback")[:25]]
            out.write(json.dumps(row) + "\n")


def serve_traced(argv: list[str]) -> None:
    """``rmq serve`` with its heap by owner written every 30 s to ``heap.jsonl`` in the
    soak's directory (``--heap-log``; see :func:`_heap_tracer`), a crash's stacks to its
    log; with ``--trace-frames N`` under ``tracemalloc`` too.  A diagnostic: the samples
    (and tracing, much more) take the server's time, so the soak's figures are not the
    stock server's."""
    import faulthandler
    import tracemalloc

    faulthandler.enable(all_threads=True)
    out_dir, frames = argv[0], int(argv[1])
    if frames:
        tracemalloc.start(frames)
    threading.Thread(target=_heap_tracer, args=(out_dir, 30.0, frames), daemon=True,
                     name="soak-heap-tracer").start()
    from rmq_cli.cli import main as cli_main

    sys.argv = ["rmq", *argv[2:]]
    cli_main()


# --------------------------------------------------------------------------- the check
def read_ranges(path: str) -> list[tuple[int, int]]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:  # a line cut by a SIGKILL is not a record
                out.append((int(parts[0]), int(parts[1])))
    return out


def check_store(store_path: str, run: str) -> dict:
    import numpy as np

    from store import MessageStore, StoreReader

    # delayed messages still pending when the server stopped (or died) are delivered by the
    # next open of the store, as by a restarted server: the check counts them where they go
    time.sleep(5)  # the delays are at most 4 s
    with MessageStore.open(store_path) as store:
        delivered = store.deliver_due()
    stored: dict[tuple[str, int], list[int]] = defaultdict(list)
    strangers = 0
    per_topic = {}
    reader = StoreReader.open(store_path)
    try:
        for topic in TOPICS:
            n = 0
            for q in reader.queue_ids(topic) if topic in reader.topics() else []:
                lo, hi = reader.min_offset(topic, q), reader.max_offset(topic, q)
                for start in range(lo, hi, 65_536):
                    batch = reader.read_arrow(topic, q, start, min(hi, start + 65_536))
                    for body in batch.column("body").to_pylist():
                        n += 1
                        parts = body.split(b":")
                        if len(parts) != 4 or not parts[2].isdigit():
                            strangers += 1
                            continue
                        stored[(parts[0].decode(), int(parts[1]))].append(int(parts[2]))
            per_topic[topic] = n
    finally:
        reader.close()
    lost = doubled = unsent = acked_total = unacked_stored = partial = 0
    unacked_by_kind: dict[str, int] = {}
    examples: list[str] = []
    keys = set(stored)
    for name in os.listdir(os.path.join(run, "records")):
        if name.endswith(".attempt"):
            worker, inc = name[:-len(".attempt")].rsplit(".", 1)
            keys.add((worker, int(inc)))
    for key in sorted(keys):
        base = os.path.join(run, "records", f"{key[0]}.{key[1]}")
        seqs = np.array(stored.get(key, []), dtype=np.int64)
        values, counts = np.unique(seqs, return_counts=True)
        dup = values[counts > 1]
        doubled += len(dup)
        if len(dup):
            examples.append(f"doubled {key}: {dup[:5].tolist()}")
        attempted = np.zeros(max([e for _, e in read_ranges(base + ".attempt")] + [0]), bool)
        for s, e in read_ranges(base + ".attempt"):
            attempted[s:e] = True
        acked = np.zeros(len(attempted), bool)
        for s, e in read_ranges(base + ".ack"):
            acked[s:e] = True
        acked_total += int(acked.sum())
        outside = values[values >= len(attempted)]
        inside = values[values < len(attempted)]
        bad = np.concatenate([outside, inside[~attempted[inside]]])
        unsent += len(bad)
        if len(bad):
            examples.append(f"never sent {key}: {bad[:5].tolist()}")
        present = np.zeros(len(attempted), bool)
        present[inside] = True
        missing = np.flatnonzero(acked & ~present)
        lost += len(missing)
        if len(missing):
            examples.append(f"lost {key}: {missing[:5].tolist()}")
        for s, e in read_ranges(base + ".attempt"):  # one request: all of it or none
            if 0 < int(present[s:e].sum()) < e - s:
                partial += 1
                examples.append(f"part of a request stored {key}: {s}-{e}: "
                                f"{int(present[s:e].sum())} of {e - s}")
        unacked = int((present & ~acked).sum())
        unacked_stored += unacked
        if unacked:
            kind = key[0].rstrip("0123456789").rstrip("-")
            unacked_by_kind[kind] = unacked_by_kind.get(kind, 0) + unacked
    return {"stored_per_topic": per_topic, "stored": sum(per_topic.values()),
            "acknowledged": acked_total, "lost": lost, "doubled": doubled,
            "stored_not_sent": unsent + strangers, "partial_requests": partial,
            "stored_unacknowledged": unacked_stored,
            "stored_unacknowledged_by_kind": unacked_by_kind, "delivered_at_check": delivered,
            "examples": examples[:20]}


def collect_stats(run: str) -> dict:
    by_kind: dict[str, Counter] = defaultdict(Counter)
    errors: dict[str, Counter] = defaultdict(Counter)
    extra: dict[str, Counter] = defaultdict(Counter)
    for name in os.listdir(os.path.join(run, "stats")):
        with open(os.path.join(run, "stats", name)) as f:
            s = json.load(f)
        kind = s["worker"].rstrip("0123456789").rstrip("-")
        by_kind[kind].update(s["ops"])
        errors[kind].update(s.get("errors", {}))
        for key in ("received", "received_again"):
            if key in s:
                extra[kind][key] += s[key]
        for key, value in s.get("rows", {}).items():
            extra[kind][f"rows_{key}"] += value
    return {"ops": {k: dict(v) for k, v in by_kind.items()},
            "errors": {k: dict(v) for k, v in errors.items() if v},
            "extra": {k: dict(v) for k, v in extra.items()}}


def acked_ops(run: str) -> dict:
    """Acknowledged calls of the vanishing clients (they never write stats): ack lines."""
    out: Counter = Counter()
    for name in os.listdir(os.path.join(run, "records")):
        if name.startswith("vanish") and name.endswith(".ack"):
            out[name.split(".")[0].rstrip("0123456789").rstrip("-")] += \
                len(read_ranges(os.path.join(run, "records", name)))
    return dict(out)


# --------------------------------------------------------------------------- main
#: The heap has settled when the last SETTLE_SAMPLES samples (30 s apart) of RssAnon are
#: within SETTLE_SPREAD of their mean.
SETTLE_SAMPLES = 4
SETTLE_SPREAD = 0.03


def _warm_up(server, t0: float, least_s: float, most_s: float, early: list
             ) -> tuple[dict | None, bool | None, float | None]:
    """Wait out the warm-up: ``(warm sample, settled, died after s)``.

    What grows in a fresh server's first minutes, then stays (a run with ``--heap-log``,
    docs/benchmarks.md): the numba kernels loaded and the modules imported on the first
    call of each kind (a rare call, such as a delayed message coming due or a check round,
    can come minutes in), and the allocators' free lists -- glibc's per-thread arenas and
    Python's own -- filling to the high-water mark of the calls in flight at once; the live
    heap stays flat.  So the warm-up sample is the first taken once the heap has settled
    (:data:`SETTLE_SAMPLES` samples within :data:`SETTLE_SPREAD`), at least ``least_s`` in
    and at most ``most_s``: a heap still growing by then is reported (``settled`` False:
    a leak, or a run too short for its warm-up); samples go to ``early``."""
    while time.monotonic() - t0 < least_s and server.poll() is None:
        time.sleep(1)
    while server.poll() is None:
        early.append(sample(server.pid, detail=True))
        heaps = [x["rss_anon_kib"] for x in early[-SETTLE_SAMPLES:]]
        mean = sum(heaps) / len(heaps)
        if len(heaps) == SETTLE_SAMPLES and max(heaps) - min(heaps) <= SETTLE_SPREAD * mean:
            return early[-1], True, None
        if time.monotonic() - t0 >= most_s:
            return early[-1], False, None
        end_nap = time.monotonic() + 30
        while time.monotonic() < end_nap and server.poll() is None:
            time.sleep(1)
    return None, None, round(time.monotonic() - t0, 1)


def _slope(samples: list[dict]) -> float | None:
    """The heap's growth over ``samples`` (least squares), MiB per 10 minutes."""
    if len(samples) < 3:
        return None
    import numpy as np

    t = np.array([x["t"] for x in samples]) / 600.0
    heap = np.array([x["rss_anon_kib"] for x in samples]) / 1024.0
    return round(float(np.polyfit(t - t[0], heap, 1)[0]), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--dir", default=None, help="work directory (default: a new temporary one)")
    ap.add_argument("--flight-producers", type=int, default=2)
    ap.add_argument("--flight-readers", type=int, default=2)
    ap.add_argument("--sinks", type=int, default=1)
    ap.add_argument("--grpc-producers", type=int, default=2)
    ap.add_argument("--grpc-consumers", type=int, default=2)
    ap.add_argument("--vanishing", type=int, default=1,
                    help="vanishing clients of each of the three kinds")
    ap.add_argument("--warmup-s", type=float, default=None, help="default: min(300, run / 4)")
    ap.add_argument("--settle-s", type=float, default=30)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--heap-log", action="store_true",
                    help="diagnostic: the server writes its heap by owner every 30 s to "
                         "DIR/heap.jsonl (see serve_traced)")
    ap.add_argument("--trace-frames", type=int, default=0, metavar="N",
                    help="with --heap-log: run the server under tracemalloc too (tracebacks "
                         "of N frames; slows it several times)")
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-traced":
        serve_traced(sys.argv[2:])
        return 0
    args = ap.parse_args()

    run = args.dir or tempfile.mkdtemp(prefix="rmq-soak-")
    os.makedirs(os.path.join(run, "records"), exist_ok=True)
    os.makedirs(os.path.join(run, "stats"), exist_ok=True)
    store_path = os.path.join(run, "store")
    token_file = os.path.join(run, "token")
    with open(token_file, "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    port, gport = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    server_log = open(os.path.join(run, "server.log"), "w")  # noqa: SIM115
    launcher = [os.path.abspath(__file__), "--serve-traced", run, str(args.trace_frames)] \
        if args.heap_log else ["-m", "rmq_cli.cli"]
    server = subprocess.Popen(
        [sys.executable, *launcher, "serve", "--store", store_path, "--create",
         "--listen", f"127.0.0.1:{port}", "--token-file", token_file,
         "--grpc", f"127.0.0.1:{gport}", "--log-level", "WARNING"],
        env=env, stdout=server_log, stderr=subprocess.STDOUT)
    seconds = args.minutes * 60
    # the heap grows for the first minutes, then stays (see _warm_up): the warm-up sample is
    # the first once it has settled, at least `warmup` and at most a third of the run in
    warmup = args.warmup_s if args.warmup_s is not None else min(120.0, seconds / 6)
    early: list[dict] = []
    cfg = {"run": run, "url": f"rmq://127.0.0.1:{port}", "token_file": token_file,
           "grpc": f"127.0.0.1:{gport}"}
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = []
    kills: Counter = Counter()
    samples: list[dict] = []
    summary: dict = {"minutes": args.minutes, "dir": run,
                     "server": "stock" if not args.heap_log else
                     f"heap log, tracemalloc {args.trace_frames} frames"}
    died_at = None
    try:
        wait_port(port, server)
        wait_port(gport, server)
        counts = {"flight-producer": args.flight_producers, "flight-reader": args.flight_readers,
                  "sink": args.sinks, "grpc-producer": args.grpc_producers,
                  "grpc-consumer": args.grpc_consumers}
        for kind, n in counts.items():
            for i in range(n):
                p = ctx.Process(target=child, args=(kind, cfg, f"{kind}-{i}", 0, stop))
                p.start()
                procs.append(p)

        def vanisher(kind: str, worker: str) -> None:
            rng, inc = random.Random(worker), 0
            while not stop.is_set():
                p = ctx.Process(target=child, args=(kind, cfg, worker, inc, None))
                p.start()
                stop.wait(rng.uniform(1, 12))
                os.kill(p.pid, signal.SIGKILL)
                p.join()
                kills[kind] += 1
                inc += 1

        threads = [threading.Thread(target=vanisher, args=(kind, f"{kind}-{i}"), daemon=True)
                   for kind in ("vanish-flight", "vanish-grpc-producer", "vanish-grpc-consumer")
                   for i in range(args.vanishing)]
        for t in threads:
            t.start()
        t0, t0_wall = time.monotonic(), time.time()
        warm, warm_settled, died_at = _warm_up(server, t0, warmup, seconds / 3, early)
        if warm is not None:
            samples.append(warm)
        while died_at is None and time.monotonic() - t0 < seconds:
            nap = min(30, max(0.0, seconds - (time.monotonic() - t0)))
            end_nap = time.monotonic() + nap
            while time.monotonic() < end_nap and server.poll() is None:
                time.sleep(1)
            if server.poll() is not None:
                died_at = round(time.monotonic() - t0, 1)
                break
            samples.append(sample(server.pid))
        stop.set()
        for t in threads:
            t.join(timeout=60)
        stuck = 0
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                stuck += 1
                p.kill()
                p.join()
        if died_at is None:
            time.sleep(args.settle_s)
            end = sample(server.pid, detail=True)
            samples.append(end)
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
        else:
            end = samples[-1] if samples else None
            summary["server_died_after_s"] = died_at
        summary["server_exit"] = server.returncode
        summary["clients_stuck_at_stop"] = stuck
        summary["vanishing_kills"] = dict(kills)
        summary.update(collect_stats(run))
        summary["vanishing_acked_calls"] = acked_ops(run)
        summary["check"] = check_store(store_path, run)
        keys = ("rss_kib", "rss_anon_kib", "threads", "fds")
        ratios = {k: round(end[k] / warm[k], 3) for k in keys} if warm and end else {}
        after = [x for x in samples if warm and x["t"] >= warm["t"]]
        mid = samples[len(samples) // 2] if samples else None  # a leak grows in both halves
        mid_ratios = {k: round(end[k] / mid[k], 3) for k in keys} if mid and end else {}
        summary["resources"] = {"warm": warm, "end": end,
                                "warm_at_min": round((warm["t"] - t0_wall) / 60, 1)
                                if warm else None,
                                "heap_settled_by_a_third": warm_settled,
                                "heap_mib_per_10_min_after_warm": _slope(after),
                                "ratio_end_to_warm": ratios,
                                "ratio_end_to_mid": mid_ratios,
                                "max_during": {k: max(s[k] for s in samples)
                                               for k in keys} if samples else {},
                                "samples": len(samples),
                                # minute into the run: heap MiB, threads, open files
                                "series": [[round((x["t"] - t0_wall) / 60, 1),
                                            x["rss_anon_kib"] // 1024, x["threads"], x["fds"]]
                                           for x in early + samples[1:]]}
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
        if server.poll() is None:
            server.kill()
            server.wait()
        server_log.close()
    check = summary["check"]
    violations = []
    if check["lost"]:
        violations.append(f"{check['lost']} acknowledged message(s) lost")
    if check["doubled"]:
        violations.append(f"{check['doubled']} message(s) stored twice or more")
    if check["partial_requests"]:
        violations.append(f"{check['partial_requests']} request(s) stored in part")
    if check["stored_not_sent"]:
        violations.append(f"{check['stored_not_sent']} stored message(s) nobody sent")
    for key, ratio in summary["resources"]["ratio_end_to_warm"].items():
        # VmRSS counts the store's mapped file pages (page cache, grows with the store):
        # reported, but the heap (RssAnon) is what a leak of memory shows in
        if ratio > 1.10 and key != "rss_kib":
            violations.append(f"{key} at the end {ratio}x the warm-up's")
    for key, ratio in summary["resources"].get("ratio_end_to_mid", {}).items():
        if ratio > 1.05 and key != "rss_kib":
            violations.append(f"{key} at the end {ratio}x the run's middle")
    if summary["resources"].get("heap_settled_by_a_third") is False:
        violations.append("the heap had not settled by a third of the run (a leak, or a "
                          "warm-up too long for this run: run longer)")
    if died_at is not None:
        violations.append(f"the server died {died_at} s into the run (exit "
                          f"{summary['server_exit']}; see {run}/server.log)")
    elif summary["server_exit"] != 0:
        violations.append(f"the server exited with {summary['server_exit']}")
    summary["violations"] = violations
    print(json.dumps(summary, indent=1))
    if not args.keep and not args.dir and not violations:
        shutil.rmtree(run, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
