"""Raw gRPC calls (signed as an account of an ACL file, as RocketMQ 5 clients sign them, or
not), and what a store holds after them."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import queue
import threading
import time
import uuid

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

#: Accounts of the tests: the owner of ``orders``, an account that may publish only to
#: ``mine`` (and subscribe to ``shared``), and another consumer of ``shared``.
ACCOUNTS = [
    {"accessKey": "orders-svc", "secretKey": "s3cret-orders",
     "topicPerms": ["orders=PUB|SUB", "shared=PUB|SUB"]},
    {"accessKey": "thief", "secretKey": "s3cret-thief", "topicPerms": ["mine=PUB", "shared=SUB"]},
    {"accessKey": "admin", "secretKey": "s3cret-admin", "admin": True},
]
SECRETS = {a["accessKey"]: a["secretKey"] for a in ACCOUNTS}


def write_acl(path) -> str:
    path.write_text(json.dumps({"accounts": ACCOUNTS}))
    return str(path)


def date_time(at: float | None = None) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if at is None else at))


def metadata(access_key: str, client_id: str | None = None, *, at: float | None = None):
    """The headers of a call signed by ``access_key`` (at ``at``, epoch seconds; now)."""
    stamp = date_time(at)
    sign = hmac.new(SECRETS[access_key].encode(), stamp.encode(), hashlib.sha1).hexdigest()
    return [("x-mq-date-time", stamp),
            ("x-mq-client-id", client_id or f"{access_key}-{uuid.uuid4().hex[:8]}"),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, "
                              f"SignedHeaders=x-mq-date-time, Signature={sign}")]


def stub(endpoint: str):
    channel = grpc.insecure_channel(endpoint)
    return service_pb2_grpc.MessagingServiceStub(channel), channel


def message(topic: str, body: bytes = b"x", kind=pb.MessageType.NORMAL, **props) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = props.pop("message_id", uuid.uuid4().hex.upper())
    m.system_properties.message_type = kind
    m.system_properties.body_encoding = pb.Encoding.IDENTITY
    for k, v in props.items():
        m.user_properties[k] = v
    return m


class Stream:
    """A telemetry stream held open: what the client sends goes through :meth:`send`; what
    the server sends is collected in :attr:`received` by a thread."""

    def __init__(self, stub, md) -> None:
        self._out: queue.Queue = queue.Queue()
        self.received: list = []
        self.call = stub.Telemetry(iter(self._out.get, None), metadata=md)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for command in self.call:
                self.received.append(command)
        except grpc.RpcError:
            pass

    def send(self, command) -> None:
        self._out.put(command)

    def wait(self, predicate, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(predicate(c) for c in list(self.received)):
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()
        self._reader.join(timeout=5)


def producer_session(stub, client_id: str, timeout: float = 5.0) -> Stream:
    """A producer's telemetry stream of ``client_id``, open once its settings are answered."""
    session = Stream(stub, [("x-mq-client-id", client_id)])
    session.send(rpc.TelemetryCommand(settings=pb.Settings(client_type=pb.ClientType.PRODUCER)))
    if not session.wait(lambda c: c.HasField("settings"), timeout):
        session.close()
        raise AssertionError(f"the settings of {client_id!r} were not answered: "
                             f"{session.received}")
    return session


async def hold_idle_telemetry(stub, client_id: str, until, calls: list, codes: list) -> None:
    """A telemetry stream of ``client_id`` that sends no command before ``until()`` (an
    awaitable) returns: an idle client; the call goes into ``calls`` (to cancel it) and the
    status it ends with into ``codes``."""
    async def idle():
        await until()
        yield rpc.TelemetryCommand()

    call = stub.Telemetry(idle(), metadata=[("x-mq-client-id", client_id)])
    calls.append(call)
    try:
        async for _ in call:
            pass
    except grpc.aio.AioRpcError as exc:
        codes.append(exc.code())


async def hold_long_poll(stub, group: str, topic: str, md: list, calls: list, codes: list
                         ) -> None:
    """A long-polling receive (30 s) of ``group`` on ``topic`` with headers ``md``: the
    call goes into ``calls`` (to cancel it) and each status it answers with into
    ``codes`` (a code's name, or the gRPC status it ended with)."""
    call = stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic)), batch_size=1,
        invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 30}), metadata=md)
    calls.append(call)
    try:
        async for r in call:
            if r.HasField("status"):
                codes.append(pb.Code.Name(r.status.code))
    except grpc.aio.AioRpcError as exc:
        codes.append(exc.code())


def stored(path: str, topic: str) -> int:
    """How many messages the store at ``path`` holds in ``topic``."""
    from store import StoreReader

    reader = StoreReader.open(path)
    try:
        if topic not in reader.topics():
            return 0
        return sum(reader.max_offset(topic, q) for q in reader.queue_ids(topic))
    finally:
        reader.close()


@contextlib.contextmanager
def serving(path: str, config, **options):
    """A :class:`~store.StoreServer` serving gRPC on loopback (``options``: ``acl=`` ...),
    running in a thread, with a raw stub: ``(server, stub)``."""
    from store import StoreServer

    srv = StoreServer(path, config, grpc="127.0.0.1:0", **options)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    s, channel = stub(srv.grpc_endpoint)
    try:
        yield srv, s
    finally:
        channel.close()
        srv.stop()
        thread.join(timeout=30)
