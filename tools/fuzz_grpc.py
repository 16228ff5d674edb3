"""Fuzz every call of the RocketMQ 5 gRPC face (``rmq serve --grpc``) with malformed frames.

For each of the ``MessagingService`` calls, a valid request (its **seed**) is mutated (bytes
flipped, inserted, deleted, the frame cut, garbage appended, a varint made endless, fields
repeated) or replaced by garbage, and sent as raw bytes; sends also get well-formed requests
with odd field values (names, bodies, types, encodings, times).  Every answer is judged:

* ``died``: the server process is gone, or stops answering (never allowed);
* ``untyped``: a gRPC error raised by the call's code (``Exception calling application``:
  an uncaught Python error), or an answer that does not parse as the call's response or
  carries no RocketMQ status (never allowed: every refusal has a typed status; gRPC's own
  refusal of a frame that does not parse, ``INTERNAL: Exception deserializing request``, is
  typed);
* ``echo``: an answer's status text longer than :data:`MAX_STATUS_TEXT` or naming the
  store's directory (never allowed);
* ``stored``: a stored message whose body is not bytes some request carried (never
  allowed: the server stores only what it was sent).

Run ``python tools/fuzz_grpc.py --seconds 300 --seed 1`` against a ``rmq serve`` process of
its own; it exits 1 on any problem.  The test suite runs a bounded number of cases with
hypothesis (``tests/store/proxy/test_fuzz_grpc.py``).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import grpc  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2 as pb  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as rpc  # noqa: E402

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]
#: name -> (request class, response class, client streaming, server streaming)
METHODS = {m.name: (getattr(rpc, m.input_type.name), getattr(rpc, m.output_type.name),
                    m.client_streaming, m.server_streaming) for m in SERVICE.methods}
MAX_STATUS_TEXT = 2000
TOPIC, GROUP = "fuzz", "fuzz-group"
#: gRPC errors that are typed refusals, not the call's code failing.
TYPED_RPC_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.INTERNAL}
UNTYPED_DETAILS = ("Exception calling application", "Exception iterating responses")


def _message(body: bytes = b"seed-body") -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=TOPIC), body=body)
    sp = m.system_properties
    sp.message_id = "0123456789ABCDEF0123456789ABCDEF01"
    sp.message_type = pb.MessageType.NORMAL
    sp.body_encoding = pb.Encoding.IDENTITY
    sp.tag = "tag"
    sp.keys.append("key")
    m.user_properties["color"] = "blue"
    return m


def seeds() -> dict[str, list[bytes]]:
    """A valid request of each call (the frames of a stream), serialized."""
    topic, group = pb.Resource(name=TOPIC), pb.Resource(name=GROUP)
    handle = "0:rmq1.0.0.1.1:00000000000000000000000000000000"
    requests = {
        "QueryRoute": rpc.QueryRouteRequest(topic=topic),
        "Heartbeat": rpc.HeartbeatRequest(group=group, client_type=pb.ClientType.PRODUCER),
        "SendMessage": rpc.SendMessageRequest(messages=[_message(), _message(b"two")]),
        "QueryAssignment": rpc.QueryAssignmentRequest(topic=topic, group=group),
        "ReceiveMessage": rpc.ReceiveMessageRequest(
            group=group, message_queue=pb.MessageQueue(topic=topic), batch_size=2,
            long_polling_timeout={"seconds": 0}, invisible_duration={"seconds": 5}),
        "AckMessage": rpc.AckMessageRequest(group=group, topic=topic, entries=[
            rpc.AckMessageEntry(message_id="x", receipt_handle=handle)]),
        "ForwardMessageToDeadLetterQueue": rpc.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic, receipt_handle=handle, delivery_attempt=1),
        "PullMessage": rpc.PullMessageRequest(group=group, message_queue=pb.MessageQueue(
            topic=topic), offset=0, batch_size=1),
        "UpdateOffset": rpc.UpdateOffsetRequest(group=group, message_queue=pb.MessageQueue(
            topic=topic), offset=1),
        "GetOffset": rpc.GetOffsetRequest(group=group, message_queue=pb.MessageQueue(
            topic=topic)),
        "QueryOffset": rpc.QueryOffsetRequest(message_queue=pb.MessageQueue(topic=topic)),
        "EndTransaction": rpc.EndTransactionRequest(
            topic=topic, message_id="x", transaction_id="0123456789ABCDEF0123456789ABCDEF",
            resolution=pb.TransactionResolution.COMMIT),
        "NotifyClientTermination": rpc.NotifyClientTerminationRequest(group=group),
        "ChangeInvisibleDuration": rpc.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=handle, invisible_duration={"seconds": 5}),
        "RecallMessage": rpc.RecallMessageRequest(topic=topic, recall_handle="cm1xMg.00"),
        "SyncLiteSubscription": rpc.SyncLiteSubscriptionRequest(topic=topic, group=group),
    }
    out = {name: [r.SerializeToString()] for name, r in requests.items()}
    out["Telemetry"] = [
        rpc.TelemetryCommand(settings=pb.Settings(
            client_type=pb.ClientType.PRODUCER,
            publishing=pb.Publishing(topics=[topic]))).SerializeToString(),
        rpc.TelemetryCommand(settings=pb.Settings(
            client_type=pb.ClientType.SIMPLE_CONSUMER, subscription=pb.Subscription(
                group=group, subscriptions=[pb.SubscriptionEntry(topic=topic)]))
        ).SerializeToString()]
    missing = set(METHODS) - set(out)
    assert not missing, f"no seed for {sorted(missing)}"
    return out


def mutate(frame: bytes, rng: random.Random) -> bytes:
    """``frame`` damaged one to three times, each in one of several ways."""
    data = bytearray(frame)
    for _ in range(rng.randint(1, 3)):
        how = rng.randrange(8)
        at = rng.randint(0, len(data))
        if how == 0 and data:  # flip bytes
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif how == 1:  # insert random bytes
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif how == 2:  # delete a range
            del data[at:at + rng.randint(1, 16)]
        elif how == 3:  # cut the frame
            del data[at:]
        elif how == 4:  # garbage appended
            data += rng.randbytes(rng.randint(1, 64))
        elif how == 5:  # an endless varint
            data[at:at] = b"\xff" * rng.randint(10, 12)
        elif how == 6:  # fields repeated
            data += bytes(data)
        else:  # a length that claims more than there is
            data[at:at] = bytes([0x0A, 0xFF, 0xFF, 0x03])
    return bytes(data)


@dataclass
class Outcome:
    """What a call answered: responses (raw frames) or a gRPC error."""

    responses: list[bytes]
    error: grpc.StatusCode | None = None
    details: str = ""


def call(channel, method: str, frames: list[bytes], *, timeout: float = 5.0,
         client_id: str = "fuzz") -> Outcome:
    """Send ``frames`` to ``method`` as raw bytes; the answer, raw."""
    _, _, client_streaming, server_streaming = METHODS[method]
    path = f"/apache.rocketmq.v2.MessagingService/{method}"
    kind = (channel.stream_stream if client_streaming else
            channel.unary_stream if server_streaming else channel.unary_unary)
    stub = kind(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    metadata = [("x-mq-client-id", client_id)]
    try:
        if client_streaming:
            return Outcome(list(stub(iter(frames), timeout=timeout, metadata=metadata)))
        if server_streaming:
            return Outcome(list(stub(frames[0], timeout=timeout, metadata=metadata)))
        return Outcome([stub(frames[0], timeout=timeout, metadata=metadata)])
    except grpc.RpcError as exc:
        return Outcome([], exc.code(), exc.details() or "")


def problems(method: str, outcome: Outcome, store_root: str) -> list[tuple[str, str]]:
    """``(kind, details)`` of what is wrong with an answer (see the module docstring)."""
    out = []
    if outcome.error is not None:
        if outcome.error not in TYPED_RPC_ERRORS or any(
                d in outcome.details for d in UNTYPED_DETAILS) or (
                outcome.error == grpc.StatusCode.INTERNAL
                and "deserializ" not in outcome.details.lower()):
            out.append(("untyped", f"{method}: {outcome.error} {outcome.details[:300]}"))
    _, response_type, _, server_streaming = METHODS[method]
    for i, raw in enumerate(outcome.responses):
        response = response_type()
        try:
            response.ParseFromString(raw)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the finding
            out.append(("untyped", f"{method}: answer {i} does not parse: {exc}"))
            continue
        first = i == 0
        if (first or not server_streaming) and method != "Telemetry" \
                and not response.HasField("status"):
            out.append(("untyped", f"{method}: answer {i} carries no status"))
        if response.DESCRIPTOR.fields_by_name.get("status") and response.HasField("status"):
            text = response.status.message
            if len(text) > MAX_STATUS_TEXT or store_root in text:
                out.append(("echo", f"{method}: status text of {len(text)} characters: "
                                    f"{text[:200]!r}"))
    return out


def stored_problems(store_root: str, sent: list[bytes]) -> list[tuple[str, str]]:
    """A stored body that no request carried, a topic of a name the rules refuse, or a
    store that no longer reads."""
    from store import StoreReader
    from store.formats.message import is_valid_topic_name

    blob = b"\0".join(sent)
    out = []
    try:
        reader = StoreReader.open(store_root)
    except Exception as exc:  # noqa: BLE001 - the finding
        return [("stored", f"the store does not open: {type(exc).__name__}: {exc}"[:300])]
    try:
        for topic in reader.topics():
            if not is_valid_topic_name(topic):
                out.append(("stored", f"a topic named {topic[:80]!r} was created"))
                continue
            for q in reader.queue_ids(topic):
                for view in reader.pull(topic, q, reader.min_offset(topic, q), 100_000):
                    if bytes(view.body) not in blob:
                        out.append(("stored", f"{topic}/{q}@{view.queue_offset}: a body of "
                                              f"{len(view.body)} bytes no request carried"))
    except Exception as exc:  # noqa: BLE001 - the finding
        out.append(("stored", f"the store does not read: {type(exc).__name__}: {exc}"[:300]))
    finally:
        reader.close()
    return out


def odd_send(rng: random.Random) -> bytes:
    """A well-formed SendMessage with odd values (the path that stores)."""
    alphabet = "ab-_%|/\\.\x00\x01\x02 é\u202e"
    m = pb.Message(topic=pb.Resource(name=rng.choice(
        [TOPIC, "", "..", "rmq_sys_x", "a" * rng.randint(100, 300),
         "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))])))
    m.body = rng.randbytes(rng.choice([0, 1, 10, 4096]))
    sp = m.system_properties
    sp.message_id = rng.choice(["", "ID1", "x" * 200, "a b", "0123456789ABCDEF"])
    sp.message_type = rng.randint(0, 6)
    sp.body_encoding = rng.randint(0, 3)
    if rng.random() < 0.3:
        sp.tag = rng.choice(["", " ", "a|b", "t" * 300, "\x01"])
    if rng.random() < 0.3:
        sp.keys.append(rng.choice(["", "k k", "k" * 300, "\x02"]))
    if rng.random() < 0.3:
        sp.message_group = rng.choice(["", "g", "g" * 100])
    if rng.random() < 0.3:
        sp.delivery_timestamp.seconds = rng.choice([0, -1, 2**40, 2**62, int(time.time())])
    if rng.random() < 0.3:
        m.user_properties[rng.choice(["", "UNIQ_KEY", "__RMQ_X", "p"])] = rng.choice(
            ["", "v", "\x01", "v" * 1000])
    return rpc.SendMessageRequest(messages=[m] * rng.randint(1, 3)).SerializeToString()


def case(rng: random.Random, seed_frames: dict[str, list[bytes]]) -> tuple[str, list[bytes]]:
    """One random case: a call and the frames it is sent."""
    method = rng.choice(sorted(METHODS))
    how = rng.random()
    if method == "SendMessage" and how < 0.3:
        return method, [odd_send(rng)]
    if how < 0.15:
        return method, [rng.randbytes(rng.randint(0, 256))]
    return method, [mutate(f, rng) if rng.random() < 0.8 else f for f in seed_frames[method]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(seconds: float, seed: int, log=print) -> dict:
    """Fuzz a ``rmq serve --grpc`` process of its own for ``seconds``; the report."""
    work = tempfile.mkdtemp(prefix="rmq-fuzz-grpc-")
    store_root = os.path.join(work, "store")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_cli.cli", "serve", "--create", "--store", store_root, "--grpc",
         f"127.0.0.1:{port}", "--log-level", "ERROR"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": ROOT})
    rng = random.Random(seed)
    counts: Counter = Counter()
    found: list[tuple[str, str]] = []
    sent: list[bytes] = []
    frames = seeds()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=60)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            method, payload = case(rng, frames)
            sent += payload
            outcome = call(channel, method, payload, timeout=5.0,
                           client_id=f"fuzz-{rng.randrange(8)}")
            counts["cases"] += 1
            counts[str(outcome.error) if outcome.error else "answered"] += 1
            found += problems(method, outcome, store_root)
            if proc.poll() is not None:
                found.append(("died", f"exit {proc.returncode} after {method}"))
                break
        alive = call(channel, "QueryRoute", frames["QueryRoute"], timeout=10)
        if alive.error is not None:
            found.append(("died", f"no answer after the run: {alive.error}"))
        channel.close()
        found += stored_problems(store_root, sent)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    report = {"counts": dict(counts), "problems": found}
    if log is not None:
        log(f"{counts['cases']} cases; outcomes: {dict(counts)}")
        for kind, details in found[:50]:
            log(f"[{kind}] {details}")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    report = run(args.seconds, args.seed)
    sys.exit(1 if report["problems"] else 0)


if __name__ == "__main__":
    main()
