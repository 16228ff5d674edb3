"""RocketMQ 5 clients sending through ``rmq serve --grpc``, against the same client and a
do-nothing gRPC server, in one run.

Run::

    PYTHONPATH=. python bench/bench_grpc.py [--messages N] [--producers P] [--repeat R]

Both servers run in a process of their own (as in production: the server's Python does not
share the client's GIL), on loopback:

* ``rmq``   ``rmq serve --store TMP --grpc 127.0.0.1:PORT``;
* ``null``  a ``MessagingService`` that answers routes and settings and acknowledges every
  ``SendMessage`` without looking at it (the ceiling: the client is the bottleneck there).

Cases, each R times alternating the servers, best of R reported with the ratio rmq / null:

* ``one producer``  one official Python ``Producer`` sending N 100-byte messages one by one
  (``producer.send``), each send timed: msgs/s, p50 and p99 latency (target: at least 0.8x
  the null server's msgs/s);
* ``P producers``   P processes, each one producer sending N / P messages one by one, all at
  once: the total msgs/s.

Not collected by pytest.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOPIC = "bench"
BODY = bytes(range(100))


# --------------------------------------------------------------------------- null server
def null_server(port: int) -> None:
    """A MessagingService that does nothing: routes, settings, OK for every send."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc
    from rocketmq.grpc_protocol import service_pb2_grpc

    ok = pb.Status(code=pb.Code.OK, message="OK")

    class Null(service_pb2_grpc.MessagingServiceServicer):
        def QueryRoute(self, request, context):
            ep = pb.Endpoints(scheme=pb.AddressScheme.IPv4,
                              addresses=[pb.Address(host="127.0.0.1", port=port)])
            queues = [pb.MessageQueue(topic=request.topic, id=i,
                                      permission=pb.Permission.READ_WRITE,
                                      broker=pb.Broker(name="null", id=0, endpoints=ep),
                                      accept_message_types=[pb.MessageType.NORMAL])
                      for i in range(4)]
            return rpc.QueryRouteResponse(status=ok, message_queues=queues)

        def Heartbeat(self, request, context):
            return rpc.HeartbeatResponse(status=ok)

        def NotifyClientTermination(self, request, context):
            return rpc.NotifyClientTerminationResponse(status=ok)

        def SendMessage(self, request, context):
            return rpc.SendMessageResponse(status=ok, entries=[
                rpc.SendResultEntry(status=ok, message_id=m.system_properties.message_id)
                for m in request.messages])

        def Telemetry(self, request_iterator, context):
            for command in request_iterator:
                if command.HasField("settings"):
                    s = pb.Settings()
                    s.CopyFrom(command.settings)
                    s.publishing.max_body_size = 4 << 20
                    s.backoff_policy.max_attempts = 3
                    s.backoff_policy.exponential_backoff.initial.nanos = 10_000_000
                    s.backoff_policy.exponential_backoff.max.seconds = 1
                    s.backoff_policy.exponential_backoff.multiplier = 2
                    yield rpc.TelemetryCommand(status=ok, settings=s)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Null(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


# --------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("server never listened")


def start(kind: str, tmp: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    if kind == "rmq":
        store = tempfile.mkdtemp(dir=tmp)
        cmd = [sys.executable, "-m", "rmq_cli.cli", "serve", "--store", store, "--create", "--grpc",
               f"127.0.0.1:{port}", "--log-level", "WARNING"]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--null-server", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, port


# --------------------------------------------------------------------------- clients
def produce(port: int, n: int, out=None) -> tuple[float, list[float]]:
    """One producer sends ``n`` messages one by one; (seconds, per-send latencies)."""
    import logging

    logging.getLogger("rocketmq-python-client").setLevel(logging.ERROR)
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    p = Producer(ClientConfiguration(f"127.0.0.1:{port}", Credentials(), request_timeout=10),
                 (TOPIC,))
    p.startup()
    m = Message()
    m.topic, m.body = TOPIC, BODY
    for _ in range(200):  # warm: channel, route, settings
        p.send(m)
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        p.send(m)
        lat.append(time.perf_counter() - s)
    elapsed = time.perf_counter() - t0
    p.shutdown()
    if out is not None:
        out.put((elapsed, n))
    return elapsed, lat


def many(port: int, producers: int, n: int) -> float:
    """``producers`` processes sending ``n`` messages in all at once: total msgs/s."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=produce, args=(port, n // producers, q))
             for _ in range(producers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    # every producer timed its own sends (after its start-up): the slowest bounds the run
    return sum(k for _, k in results) / max(e for e, _ in results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--null-server", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.null_server is not None:
        null_server(args.null_server)
        return
    tmp = tempfile.mkdtemp(prefix="bench-grpc-")
    servers = {k: start(k, tmp) for k in ("null", "rmq")}
    best: dict[tuple[str, str], float] = {}
    lat: dict[str, list[float]] = {}
    try:
        for r in range(args.repeat):
            for kind in ("null", "rmq"):
                _, port = servers[kind]
                elapsed, times = produce(port, args.messages)
                rate = args.messages / elapsed
                if rate > best.get((kind, "one"), 0):
                    best[(kind, "one")] = rate
                    lat[kind] = times
                rate = many(port, args.producers, args.messages)
                best[(kind, "many")] = max(best.get((kind, "many"), 0), rate)
                print(f"run {r + 1}: {kind:4s} one producer {args.messages / elapsed:9,.0f} "
                      f"msgs/s; {args.producers} producers {rate:9,.0f} msgs/s", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    def pct(times, q):
        return statistics.quantiles(times, n=100)[q - 1] * 1e3

    print()
    print(f"{'case':28s} {'null':>12s} {'rmq':>12s} {'rmq/null':>9s}")
    for case, label in (("one", "one producer, msgs/s"),
                        ("many", f"{args.producers} producers, msgs/s")):
        n, r = best[("null", case)], best[("rmq", case)]
        print(f"{label:28s} {n:12,.0f} {r:12,.0f} {r / n:8.2f}x")
    for q in (50, 99):
        n, r = pct(lat["null"], q), pct(lat["rmq"], q)
        print(f"{f'send latency p{q}, ms':28s} {n:12.3f} {r:12.3f} {r / n:8.2f}x")


if __name__ == "__main__":
    main()
