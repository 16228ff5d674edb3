"""RocketMQ 5 clients of any language send to and consume from a store: ``rmq serve --grpc``.

RocketMQ 5 gives every language one protocol, the ``apache.rocketmq.v2`` gRPC
``MessagingService`` its proxy serves.  :class:`GrpcEndpoint` serves it over one open
:class:`~store.MessageStore` (:mod:`store.proxy.grpc_service`), so a Java, Go, Node.js or Python
service keeps its official client and points it at rmq.

The protocol's generated code comes from the official Python client
(``rocketmq-python-client`` on PyPI, Apache's), installed by the ``grpc`` extra
(``pip install rmq[grpc]``); nothing is generated at install.

Modules: :mod:`~store.proxy.convert` (messages both ways, the proxy's checks),
:mod:`~store.proxy.consumers` (consumer groups: hand-outs, invisibility, acks, progress),
:mod:`~store.proxy.access` (AccessKey / SecretKey accounts), :mod:`~store.proxy.handles`
(signed recall and receipt handles), :mod:`~store.proxy.grpc_limits` (held calls, log lines),
:mod:`~store.proxy.grpc_service` (the calls: routes, sessions),
:mod:`~store.proxy.producer_calls` (sends, transactions, recalls, the check-back),
:mod:`~store.proxy.consumer_calls` (the consumer groups' calls), :mod:`~store.proxy.aio_calls` (the calls on one
``grpc.aio`` event loop, sends stored by group commit), :mod:`~store.proxy.processes` (the
endpoint as several processes on one port: ``rmq serve --grpc-processes N``),
:mod:`~store.proxy.follower_calls` (a replica set's follower passing the leader's calls on).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from ..base.errors import InvalidConfigError
from ..base.remote_address import RemoteAddress
from .grpc_limits import (
    MAX_HELD_CALLS,
    MAX_HELD_CALLS_PER_ACCOUNT,
    MAX_HELD_CALLS_PER_CLIENT,
    MAX_HELD_CALLS_PER_PEER,
    MAX_TELEMETRY_STREAMS,
    MAX_TELEMETRY_STREAMS_PER_PEER,
    SHORT_CALL_WORKERS,
    HeldCalls,
    TelemetryStreams,
    transport_options,
)

log = logging.getLogger("store.proxy")

#: gRPC's message limit: a request of ``max_message_size_bytes`` plus its headers.
HEADROOM_BYTES = 1 << 20


def grpc_available() -> bool:
    """Whether the ``grpc`` extra (grpcio and the RocketMQ protocol modules) is installed."""
    try:
        import grpc  # noqa: F401
        from rocketmq.grpc_protocol import service_pb2_grpc  # noqa: F401
    except ImportError:
        return False
    return True


class GrpcEndpoint:
    """Serves ``stores`` to RocketMQ 5 clients on ``listen`` (``HOST:PORT``; port 0 picks one).

    ``stores``: one open :class:`~store.MessageStore`, or ``[(name, MessageStore)]`` of the
    members of a store group, served as one endpoint.  ``acl``: the path of an ACL file
    (:mod:`store.proxy.access`); ``None`` serves every client.  ``tls``: ``(certificate
    chain, private key)`` PEM bytes.  ``max_held_calls`` (``max_held_calls_per_client``,
    ``_per_peer``, ``_per_account``): long polls held at once in all (per client id, peer
    address, account); ``short_call_workers``: threads only
    short calls reach; ``max_telemetry_streams`` (``max_telemetry_streams_per_peer``):
    telemetry streams open at once in all (per peer address), beyond which the least
    recently active is closed (:mod:`store.proxy.grpc_limits`).
    ``processes``: serve as this many processes on the port (:mod:`store.proxy.processes`);
    ``reuse_port``: let other processes listen on it too; ``primary``: this is a worker
    process forwarding to the primary at ``HOST:PORT`` (``replica``: its
    :class:`~store.proxy.worker_role.WorkerRole` in a replica set); ``writer_thread``: store
    groups of sends in a thread of their own rather than on the event loop
    (:class:`~store.proxy.aio_calls.GroupCommit`).
    """

    def __init__(self, stores, listen: str, *, acl: str | None = None,
                 tls: tuple[bytes, bytes] | None = None, max_held_calls: int = MAX_HELD_CALLS,
                 max_held_calls_per_client: int = MAX_HELD_CALLS_PER_CLIENT,
                 max_held_calls_per_peer: int = MAX_HELD_CALLS_PER_PEER,
                 max_held_calls_per_account: int = MAX_HELD_CALLS_PER_ACCOUNT,
                 short_call_workers: int = SHORT_CALL_WORKERS,
                 max_telemetry_streams: int = MAX_TELEMETRY_STREAMS,
                 max_telemetry_streams_per_peer: int = MAX_TELEMETRY_STREAMS_PER_PEER,
                 processes: int = 1,
                 reuse_port: bool = False, writer_thread: bool = False,
                 primary: str | None = None, replica=None) -> None:
        if not grpc_available():
            raise InvalidConfigError(
                "serving RocketMQ 5 clients (--grpc) needs the grpc extra; install it with "
                "pip install '.[grpc]' in rmq's directory, or 'rmq[grpc]' (grpcio and "
                "rocketmq-python-client)")
        from .access import AccessControl

        if not isinstance(stores, (list, tuple)):
            stores = [("", stores)]
        store = stores[0][1]
        address = RemoteAddress.listen(listen)
        access = AccessControl.load(acl) if acl is not None else None
        held = HeldCalls(max_held_calls, max_held_calls_per_client, max_held_calls_per_peer,
                         max_held_calls_per_account)
        streams = TelemetryStreams(max_telemetry_streams, max_telemetry_streams_per_peer)
        if processes < 1 or (processes > 1 and (len(stores) > 1 or primary is not None)):
            raise InvalidConfigError(f"{processes} endpoint processes; allowed: 1 or more for "
                                     "one store (a store group's endpoint is one process)")
        self.host = address.host
        self._listen = listen
        self._primary = primary
        self._processes = processes
        self.workers = None
        self.loopback = address.loopback
        self._closed = False
        self._close_lock = threading.Lock()
        # one event loop answers every call (store.proxy.aio_calls); held calls (long
        # polls) never take more than their own share of the pool: short_call_workers
        # threads stay for the short calls a plain method answers (store.proxy.grpc_limits)
        self._pool = ThreadPoolExecutor(max_workers=max_held_calls + short_call_workers,
                                        thread_name_prefix="rmq-grpc")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rmq-grpc-loop",
                                        daemon=True)
        self._thread.start()
        self._limit = store.config.max_message_size_bytes * 2 + HEADROOM_BYTES
        self._tls = tls
        self._replica = replica  # (served as such before the port takes a call)
        try:
            self.port = self._run(self._start(
                stores, address, self._limit,
                tls, access, (held, streams), reuse_port or processes > 1, writer_thread))
            if processes > 1:  # the others join the port (store.proxy.processes)
                from .processes import Workers

                self.workers = Workers(store.root, f"{self._listen_host()}:{self.port}",
                                       f"127.0.0.1:{self.private_port}", processes - 1,
                                       acl=acl, tls=tls, replica=self._worker_role())
        except BaseException:
            if self.workers is not None:
                self.workers.close()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._pool.shutdown(wait=False)
            raise
        log.info("serving RocketMQ 5 clients on %s:%d%s", self.host, self.port,
                 " (TLS)" if tls else "")
        if tls is None and not self.loopback:
            log.warning("RocketMQ 5 clients are served on %s:%d without TLS: their calls, "
                        "signatures (tokens) and messages travel in clear; anyone on the path "
                        "can read them and replay a signature within its window; give a "
                        "certificate (--tls-cert, --tls-key) on any network not wholly trusted",
                        self.host, self.port)

    def _run(self, coroutine, timeout: float | None = 60):
        """Run ``coroutine`` on the endpoint's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start(self, stores, address: RemoteAddress, limit: int, tls, access,
                     bounds: tuple[HeldCalls, TelemetryStreams], reuse_port: bool,
                     writer_thread: bool) -> int:
        import grpc

        from .aio_calls import AsyncMessagingService, add_to_server

        # no bound on calls in all (maximum_concurrent_rpcs): half-open streams that cost
        # their client nothing would fill it; calls wait for their requests within bounds
        # and the transport bounds the rest (store.proxy.grpc_limits)
        self._server = grpc.aio.server(
            migration_thread_pool=self._pool,
            options=[("grpc.max_receive_message_length", limit),
                     ("grpc.max_send_message_length", limit),
                     ("grpc.so_reuseport", 1 if reuse_port else 0), *transport_options()])
        target = f"[{address.host}]:{address.port}" if ":" in address.host else \
            f"{address.host}:{address.port}"
        try:
            if tls is not None:
                credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])
                port = self._server.add_secure_port(target, credentials)
            else:
                port = self._server.add_insecure_port(target)
        except RuntimeError:
            port = 0
        if port == 0:
            raise InvalidConfigError(f"cannot listen on {self._listen} for gRPC clients (the "
                                     "address is in use or not this host's)")
        if self._processes > 1:  # where the workers forward (store.proxy.processes)
            self.private_port = self._server.add_insecure_port("127.0.0.1:0")
        options = {"access": access, "address": (self._advertised(), port),
                   "held": bounds[0], "streams": bounds[1],
                   "loop": asyncio.get_running_loop(), "pool": self._pool,
                   "writer_thread": writer_thread}
        if self._primary is None:
            self.service = AsyncMessagingService(stores, **options)
        else:
            from .processes import ForwardingMessagingService

            self.service = ForwardingMessagingService(stores, primary=self._primary,
                                                      max_message_bytes=limit, **options)
        add_to_server(self.service, self._server)
        if self._replica is not None and self._primary is None:
            self.serve_replica(self._replica)
        elif self._replica is not None:  # a worker's WorkerRole (store.proxy.processes)
            self.service.serve_worker_role(self._replica)
        await self._server.start()
        return port

    def _listen_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    def _advertised(self) -> str:
        if self.host in ("0.0.0.0", "::", ""):
            import socket

            return socket.gethostbyname(socket.gethostname())
        return self.host

    @property
    def endpoint(self) -> str:
        """``HOST:PORT`` clients connect to."""
        return f"{self.host}:{self.port}"

    def serve_replica(self, replica) -> None:
        """Serve as the member ``replica`` (a :class:`~store.replication.replica.Replica`) of
        its replica set, whose file gives every replica's gRPC endpoint: writes only while
        it leads, the leader's calls passed on to it meanwhile, and routes naming every
        replica (:mod:`~store.proxy.follower_calls`)."""
        members = replica.replica_set
        endpoints = [RemoteAddress.listen(members.grpc_address(url)) for url in members.replicas]
        self.service.serve_replica(replica, [(a.host, a.port) for a in endpoints],
                                   max_message_bytes=self._limit, tls=self._tls)

    def _worker_role(self) -> dict | None:
        """What the workers of a replica set's member need to append as it would (the
        replica's role published first: :mod:`store.proxy.processes`); ``None`` alone."""
        replica = self._replica
        if replica is None:
            return None
        replica.share_role()
        members = replica.replica_set
        return {"min_insync_replicas": members.min_insync_replicas,
                "replica_ack_timeout_ms": members.replica_ack_timeout_ms,
                "routes": self.service.routes.SerializeToString().hex()}

    def check_round(self) -> int:
        """One transaction check round asked of this endpoint's producers."""
        return self.service.check_round()

    def ask(self, views) -> int:
        """Ask this endpoint's producers about check ``views`` (a round run elsewhere)."""
        return self.service.ask(views)

    def close(self, grace_s: float = 2.0) -> None:
        """Stop serving: streams end, calls in progress get ``grace_s`` to finish, the
        consumer offsets are saved.  Closing again does nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self.workers is not None:
            self.workers.close()
        self.service.close()
        try:
            self._run(self._server.stop(grace_s), timeout=grace_s + 30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._pool.shutdown(wait=False)


__all__ = ["GrpcEndpoint", "grpc_available"]
