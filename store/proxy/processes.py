"""One gRPC endpoint as several processes on one port: ``rmq serve --grpc-processes N``.

One Python process answers at most about one core's worth of calls (the GIL).  With
``N > 1`` the endpoint is ``N`` processes listening on the same ``HOST:PORT``
(``SO_REUSEPORT``: the kernel spreads clients' connections over them):

* the **primary** is the endpoint of ``rmq serve`` itself: it serves every call, and also
  listens on a private loopback port for the others (without TLS, which loopback does not
  need, but with the same accounts: a call there is checked as any other);
* each **worker** (a child process, :func:`main`) opens the store as one more writer (the
  store's append lock serialises writers across processes, :mod:`store.core.locking`) and
  answers sends (normal, FIFO, delay, half messages), routes, heartbeats and assignments
  itself: what scales with the cores;
* every call that reads or changes state kept in a process's memory is **forwarded** to the
  primary, with the caller's headers (the primary checks the signature and the rights as
  for any call): telemetry streams (client sessions, the settings, the transaction
  check-back, which asks the producers of the primary's sessions), receives, acks, changes
  of invisibility, dead-lettering (the consumer groups' hand-outs and leases), the end of a
  transaction and recalls (a handle is checked where it was issued).  So any process takes
  a receipt handle any other gave, and a message is handed out once across processes.

**A replica set's member** (``--replica-set``): a worker appends to the replica's directory
under the role its primary publishes (``config/replica.role``; the primary's side:
:mod:`store.replication.role_publisher`, the worker's: :mod:`.worker_role`): it appends only
while the replica leads, checked under the store's append lock that a change of role takes
too, and with ``min_insync_replicas`` above 1 acknowledges a send only once that many
replicas hold it, in the epoch it was appended in, within a lease the primary renews (a
primary killed or frozen leaves its workers acknowledging for
:data:`~store.files.replica_role.LEASE_MS` at most).  While the replica does not lead (a
follower, an election under way), a worker passes sends, routes and assignments on to its
primary, which passes them on to the leader or refuses them as the one-process face does
(:mod:`.follower_calls`); routes name every replica, as the primary's do.

A worker's long polls wait in the primary; a send through a worker wakes them within the
primary's poll interval (:data:`~store.proxy.consumer_calls.POLL_INTERVAL_MS`).  Workers read
their settings from their standard input and end when it closes (when ``rmq serve``
ends, however it ends).
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2_grpc

from ..base.errors import InvalidConfigError
from .aio_calls import AsyncMessagingService
from .follower_calls import client_headers, forward_stream, forward_unary, relay_failure
from .grpc_limits import peer_host, vouch

log = logging.getLogger("store.proxy")

#: Calls a worker forwards to the primary (see the module docstring).
FORWARDED_UNARY = ("NotifyClientTermination", "AckMessage", "ChangeInvisibleDuration",
                   "ForwardMessageToDeadLetterQueue", "EndTransaction", "RecallMessage")
#: Calls a worker of a replica answers itself only while the replica leads, else forwards.
LEADER_UNARY = ("SendMessage", "QueryRoute", "QueryAssignment")
#: How long a worker may take to start (open the store, listen).
READY_TIMEOUT_S = 120


def _forward_unary(name: str):
    async def call(self, request, context):
        return await forward_unary(self.primary, name, request, context)
    call.__name__ = name
    return call


class ForwardingMessagingService(AsyncMessagingService):
    """A worker's calls: sends and other stateless calls here, the rest forwarded to the
    primary at ``primary`` (``HOST:PORT``, loopback)."""

    def __init__(self, stores, *, primary: str, max_message_bytes: int, **options) -> None:
        super().__init__(stores, **options)
        self._channel = grpc.aio.insecure_channel(
            primary, options=[("grpc.max_receive_message_length", max_message_bytes),
                              ("grpc.max_send_message_length", max_message_bytes)])
        self.primary = service_pb2_grpc.MessagingServiceStub(self._channel)

    async def ReceiveMessage(self, request, context):
        peer = self._vouch("ReceiveMessage", context)  # (held: counted under its address)
        async for response in forward_stream(self.primary, "ReceiveMessage", request, context,
                                             (peer,)):
            yield response

    async def Telemetry(self, request_iterator, context):
        try:
            peer = self._vouch("Telemetry", context)  # (counted under its address)
            async for command in self.primary.Telemetry(
                    request_iterator, metadata=client_headers(context) + (peer,)):
                yield command
        except grpc.aio.AioRpcError as exc:
            await relay_failure(context, exc)

    def _vouch(self, method: str, context) -> tuple[str, str]:
        """The header vouching for the address of the client of ``context``'s call."""
        client_id = dict(context.invocation_metadata()).get("x-mq-client-id", "")
        return vouch(method, peer_host(context.peer()), client_id, self.signer)

    def serve_worker_role(self, role) -> None:
        """Serve for a replica set's member: writes only while ``role`` (a
        :class:`~store.proxy.worker_role.WorkerRole`) says the replica leads, the rest
        forwarded (see the module docstring); routes as the primary's."""
        self.routes = pb.Endpoints.FromString(role.routes) if role.routes else None
        self.replica = role

    def ask(self, views) -> int:  # the primary's sessions are asked, never a worker's
        return 0

    def check_round(self) -> int:
        return 0


def _here_or_primary(name: str):
    local = getattr(AsyncMessagingService, name)

    async def call(self, request, context):
        if self.replica is not None and not self.replica.leading():  # (see the docstring)
            return await forward_unary(self.primary, name, request, context)
        return await local(self, request, context)
    call.__name__ = name
    return call


for _name in FORWARDED_UNARY:
    setattr(ForwardingMessagingService, _name, _forward_unary(_name))
for _name in LEADER_UNARY:
    setattr(ForwardingMessagingService, _name, _here_or_primary(_name))


class Workers:
    """The worker processes of an endpoint (see the module docstring)."""

    def __init__(self, store_path: str, listen: str, primary: str, count: int, *,
                 acl: str | None = None, tls: tuple[bytes, bytes] | None = None,
                 replica: dict | None = None) -> None:
        # (replica: the worker mode of a replica set's member, WorkerRole's arguments;
        # only a primary gives it, after publishing the replica's role)
        settings = json.dumps({
            "store": os.path.abspath(store_path), "listen": listen, "primary": primary,
            "acl": os.path.abspath(acl) if acl is not None else None,
            "tls": None if tls is None else [tls[0].decode(), tls[1].decode()],
            "replica": replica})
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.processes: list[subprocess.Popen] = []
        for _ in range(count):
            p = subprocess.Popen([sys.executable, "-m", "store.proxy.processes"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            p.stdin.write(settings.encode() + b"\n")
            p.stdin.flush()
            self.processes.append(p)
        try:
            for p in self.processes:
                self._wait_ready(p, READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _wait_ready(p: subprocess.Popen, timeout_s: float) -> None:
        ready, _, _ = select.select([p.stdout], [], [], timeout_s)
        line = p.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            raise InvalidConfigError(f"an endpoint worker process did not start within "
                                     f"{timeout_s:g} s (exit code {p.poll()}); its errors are "
                                     "in rmq serve's log")

    def close(self, timeout_s: float = 30) -> None:
        for p in self.processes:
            try:
                p.stdin.close()  # the worker's signal to stop
            except OSError:
                pass
        for p in self.processes:
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main() -> None:
    """A worker: settings (JSON) on the first line of stdin; serves until stdin closes."""
    from ..facade.message_store import MessageStore
    from . import GrpcEndpoint
    from .worker_role import WorkerRole

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = json.loads(sys.stdin.readline())
    tls = settings["tls"]
    store = MessageStore.open(settings["store"])
    try:
        replica = settings.get("replica")
        role = None
        if replica is not None:  # (before the port takes a call: see the module docstring)
            role = WorkerRole(store, routes=bytes.fromhex(replica.pop("routes") or ""),
                              **replica)
        endpoint = GrpcEndpoint(store, settings["listen"], acl=settings["acl"],
                                tls=None if tls is None else (tls[0].encode(), tls[1].encode()),
                                reuse_port=True, primary=settings["primary"], replica=role,
                                writer_thread=role is not None and role.synchronous)
        try:
            print("ready", flush=True)
            sys.stdin.read()  # until rmq serve ends
        finally:
            endpoint.close()
    finally:
        store.close()


if __name__ == "__main__":
    main()
