"""``StoreServer``: the long-running process of one store (``rmq serve``), as a broker runs.

RocketMQ's broker runs its services all the time; an embedded store only when someone calls
it.  :class:`StoreServer` opens one store and, until stopped, runs:

* **due delivery**: ``deliver_due()`` once per ``timer_precision_ms``, woken at the
  multiples of the precision (when timer slots become due), so delayed messages reach their
  topics within about one precision of their due time with no reader running;
* **flush**: the store's flush thread (every ``flush_interval_commitlog_ms``);
* **retention**: every ``clean_resource_interval_ms``, CommitLog segments older than
  ``file_reserved_time_hours`` are deleted during a ``delete_when`` hour, or at any time while
  the disk is fuller than ``disk_max_used_space_ratio`` percent; above
  ``disk_space_clean_forcibly_ratio`` their age is ignored.  A segment holding a pending
  delayed message or an open half message is never deleted (the services' retention guards).

It coexists with any number of other readers and writers (the store's locks); delivery is the
same exactly-once step a Spark query or ``rmq tail`` runs, so they may run beside it.  One
server per store: it holds an exclusive ``flock`` on ``config/serve.lock`` while it runs, and
writes ``config/serve.json`` (pid, start, the last delivery step and its count) after every
step that delivered and at least every second, which :func:`server_status` (and
``rmq stats``) read.  :meth:`StoreServer.stop` (or SIGTERM / SIGINT, through
:meth:`StoreServer.install_signal_handlers`) ends the loop after the current step; the store is
flushed and closed.

**Transaction checks** (``check_transactions=True``, ``rmq serve --check-transactions``): every
``transaction_check_interval_ms`` the server runs the bookkeeping of a check round (immunity,
put-back copies, check counts, discards after ``transaction_check_max``) and publishes the
transactions to ask about as round ``n``: ``<store>/transaction_checks/server/<n:020d>.arrow``
(:mod:`store.transaction.published_checks`).
Resolvers then only answer: a Spark query with ``view=transaction_checks`` and
``checkRounds=server`` reads the rounds and ends transactions with the ``end_transaction``
writer.  Without the option the server runs no rounds, and the resolver runs them itself
(a check-loop query, or ``store.check_transactions`` with listeners), as before; do not run
both, or each transaction would be counted twice per interval.  The newest
:data:`KEEP_ROUNDS` round files are kept.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field

from ..transaction.published_checks import publish_check_round
from ..base.config import StoreConfig
from ..base.errors import InvalidConfigError, StoreError, StoreReplacedError
from ..files.fileio import atomic_write
from ..facade.message_store import MessageStore
from .face_limits import FaceLimits
from .warm_up import warm_up
from ..base.remote_address import RemoteAddress

log = logging.getLogger("store.operations.server")

LOCK_FILE = os.path.join("config", "serve.lock")
STATUS_FILE = os.path.join("config", "serve.json")
#: Longest time between two status writes (ms).
BEAT_MS = 1000
#: Shortest time between two INFO lines about deliveries (store clock, ms): the steps'
#: deliveries in between are summed into the next line; a step delivering nothing logs nothing.
DELIVERY_LOG_MS = 1000


@dataclass
class ServerCounters:
    """What a server did since it started (also written to ``config/serve.json``)."""

    started_ms: int = 0
    delivery_runs: int = 0
    delivered: int = 0
    last_run_ms: int = 0
    last_run_delivered: int = 0
    retention_runs: int = 0
    segments_deleted: int = 0
    check_rounds: int = 0
    checks_published: int = 0
    errors: list[str] = field(default_factory=list)
    #: Why serving stopped early: the store was removed or replaced under the server (then
    #: ``rmq serve`` exits non-zero); ``None`` otherwise.
    replaced: str | None = None


def delete_hours(spec: str) -> frozenset[int]:
    """The hours of RocketMQ's ``deleteWhen`` (``"04"``, ``"02;14"``)."""
    return frozenset(int(h) for h in spec.split(";") if h.strip())


def disk_used_ratio(path: str) -> float:
    """Used fraction of the filesystem holding ``path`` (0..1)."""
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


class StoreServer:
    """Runs delivery and retention for the store at ``path`` until stopped.

    Parameters
    ----------
    path : str
        The store directory (created when missing, as ``MessageStore.open``).
    config : StoreConfig or mapping, optional
        As for ``MessageStore.open``.
    clock : callable, optional
        Epoch-ms clock of the store (tests); the loop itself sleeps in real time.
    listen : str, optional
        ``HOST:PORT`` to serve the store on over Arrow Flight (``rmq serve --listen``;
        :mod:`store.remote.flight_service`), for ``rmq://`` clients; port 0 picks a free one
        (:attr:`url` says which).  Off unless given.
    token : str, optional
        The shared secret every network request must carry.  A non-loopback ``listen``
        needs one, or ``insecure=True``.
    tls : (bytes, bytes), optional
        PEM certificate chain and key: serve ``rmqs://`` (TLS) instead of ``rmq://``, and
        the gRPC endpoint over TLS.
    grpc : str, optional
        ``HOST:PORT`` to serve RocketMQ 5 clients on (``rmq serve --grpc``;
        :mod:`store.proxy`); needs the ``grpc`` extra.  The server then also runs the
        transaction check rounds and asks the endpoint's producers about their open
        transactions.  A non-loopback address needs ``acl`` or ``insecure=True``.  In a
        replica set the file's ``grpc`` must give every replica's endpoint: writes only
        while leading, a follower passes the leader's calls on
        (:mod:`store.proxy.follower_calls`).
    acl : str, optional
        The accounts file (:mod:`store.files.accounts`) of the gRPC endpoint and of the
        Flight service: per account a secret and per-topic rights (:mod:`store.remote.rights`).
    max_request_bytes : int, optional
        Bound on one Flight ``DoPut`` / ``DoExchange`` request's Arrow buffers (default
        256 MiB, :data:`store.remote.wire.MAX_MESSAGE_BYTES`; ``rmq serve
        --max-request-mib``).
    face_limits : FaceLimits, optional
        The bounds of what clients can make the faces hold (:mod:`store.operations.face_limits`;
        ``rmq serve --grpc-max-*``, ``--listen-max-*``); the defaults when not given.
    replica_set : str, optional
        A replica-set file (:mod:`store.replication.replica_set`; ``rmq serve
        --replica-set``): serve this store as the member whose URL ``listen`` is.  A
        follower copies the leader's CommitLog, refuses writes, and runs no delivery,
        check rounds or retention (:mod:`store.replication.replica`).

    Raises
    ------
    StoreError
        Another server already runs for this store (its lock is held).
    """

    def __init__(self, path: str, config: StoreConfig | dict | None = None, *,
                 clock=None, check_transactions: bool = False, listen: str | None = None,
                 token: str | None = None, tls: tuple[bytes, bytes] | None = None,
                 insecure: bool = False, grpc: str | None = None,
                 acl: str | None = None, max_request_bytes: int | None = None,
                 replica_set: str | None = None, grpc_processes: int = 1,
                 face_limits: FaceLimits | None = None) -> None:
        self.path = os.fspath(path)
        face_limits = face_limits if face_limits is not None else FaceLimits()
        self.check_transactions = bool(check_transactions)
        self._stop = threading.Event()
        if grpc is not None:
            _check_grpc_access(grpc, acl, insecure)
        if acl is not None and grpc is None and listen is None:
            raise InvalidConfigError("an ACL file is for a network face; allowed: acl "
                                     "together with listen or grpc")
        address = None
        if listen is not None:
            address = RemoteAddress.listen(listen, tls=tls is not None)
            if not address.loopback and token is None and acl is None and not insecure:
                raise InvalidConfigError(
                    f"listening on {listen} (not a loopback address) needs a token "
                    "(--token-file FILE) or accounts (--acl FILE); allowed: a token, accounts, "
                    "or --insecure to serve anyone who can reach the port")
        members = None
        if replica_set is not None:
            from ..replication.replica_set import ReplicaSet

            if address is None:
                raise InvalidConfigError("a replica set's member is known by its address; "
                                         "allowed: replica_set together with listen")
            members = ReplicaSet.read(replica_set)
            me = members.member(address)
            if grpc is not None:
                _check_grpc_replica(members, grpc)
        # the compiled loops load while the store opens and recovers (store.base.jit); the server
        # delivers from its first step, and reports itself running once they are in
        self._warming = warm_up(background=True)
        self.store = MessageStore.open(self.path, config, clock=clock)
        self.service = None
        self.endpoint = None  # a gRPC endpoint this server owns (closes)
        self._asks = None     # the gRPC endpoint this server's check rounds ask (its own, or
        try:                  # a store group's, shared by its members' servers)
            self._lock_fd = _take_lock(self.path)
            self.replica = None
            if members is not None:
                from ..replication.replica import Replica

                credentials = ({"account": members.account, "secret_file": members.secret_file}
                               if members.account is not None else {"token": token})
                # (before the Flight face listens: a request it takes must meet the
                # replica's refusal; a replica set's member never acts as a lone store)
                self.replica = Replica(self.store, members, me, **credentials)
            if address is not None:
                # (pyarrow.flight: only when serving)
                from ..remote.flight_service import StoreService

                limits = {"stream_limits": face_limits.flight_stream_limits()}
                if max_request_bytes is not None:
                    limits["max_request_bytes"] = max_request_bytes
                if acl is not None:  # the accounts file both faces read
                    from ..files.accounts import read_accounts

                    limits["accounts"] = read_accounts(acl)
                self.service = StoreService(self.store, address, token=token, tls=tls,
                                            replica=self.replica, **limits)
            if grpc is not None:
                from ..proxy import GrpcEndpoint  # (grpcio: only when serving RocketMQ clients)

                # (a synchronous replica's sends wait for their copies: in groups, off the loop)
                self.endpoint = GrpcEndpoint(
                    self.store, grpc, acl=acl, tls=tls, processes=grpc_processes,
                    writer_thread=members is not None and members.min_insync_replicas > 1,
                    replica=self.replica,  # (writes while leading; else to the leader)
                    **face_limits.grpc_options())
            self._asks = self.endpoint
        except BaseException:
            if getattr(self, "replica", None) is not None:
                self.replica.stop()  # (a role it shared with workers that did not start)
            if self.service is not None:
                self.service.shutdown()
            if getattr(self, "_lock_fd", None) is not None:
                os.close(self._lock_fd)
            self.store.close()
            raise
        cfg = self.store.config
        self.precision = cfg.timer_precision_ms
        self.hours = delete_hours(cfg.delete_when)
        self.counters = ServerCounters(started_ms=self.store.now_ms())
        self._next_clean = time.monotonic() + cfg.clean_resource_interval_ms / 1000
        self._next_check = time.monotonic()  # the first round at once
        self._last_beat = 0.0
        self._warming_reported: bool | None = None
        self._unlogged = [0, 0]  # messages delivered, steps that delivered: not logged yet
        self._delivery_logged_ms: int | None = None
        if self.replica is not None:
            self.replica.start()

    @property
    def url(self) -> str | None:
        """The ``rmq://`` (or ``rmqs://``) URL clients connect to; ``None`` when not
        listening."""
        return None if self.service is None else self.service.url

    @property
    def grpc_endpoint(self) -> str | None:
        """``HOST:PORT`` of the RocketMQ 5 gRPC endpoint; ``None`` when not serving it."""
        return None if self._asks is None else self._asks.endpoint

    @staticmethod
    def share_grpc_endpoint(servers: list, names: list[str], grpc: str, *,
                            acl: str | None = None, tls: tuple[bytes, bytes] | None = None,
                            insecure: bool = False, face_limits: FaceLimits | None = None):
        """One gRPC endpoint serving the stores of ``servers`` (a store group's members,
        named ``names``) as one, attached to each server (:meth:`attach_endpoint`); the first
        server to close closes it.  Returns the endpoint (its ``endpoint`` is ``HOST:PORT``).
        A non-loopback address needs ``acl`` or ``insecure``."""
        from ..proxy import GrpcEndpoint  # (grpcio: only when serving RocketMQ clients)

        _check_grpc_access(grpc, acl, insecure)
        endpoint = GrpcEndpoint([(n, s.store) for n, s in zip(names, servers)], grpc, acl=acl,
                                tls=tls, **(face_limits or FaceLimits()).grpc_options())
        for server in servers:
            server.attach_endpoint(endpoint)
        return endpoint

    def attach_endpoint(self, endpoint) -> None:
        """Ask ``endpoint``'s producers about this store's open transactions and wake its
        receivers after deliveries: a store group's endpoint, which serves every member's
        store and is closed by whoever made it, after the servers."""
        self._asks = endpoint

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """End :meth:`run` after the step in progress (thread- and signal-safe)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """Stop on SIGTERM and SIGINT (call from the main thread)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _signum, _frame: self.stop())

    def run(self, *, duration_s: float | None = None) -> ServerCounters:
        """Serve until :meth:`stop` (or for ``duration_s`` seconds); then flush and close."""
        cfg = self.store.config
        log.info("serving %s: delivery every %d ms, retention every %d ms (delete_when %s, "
                 "disk ratio %d%%/%d%%)", self.path, self.precision,
                 cfg.clean_resource_interval_ms, cfg.delete_when,
                 cfg.disk_max_used_space_ratio, cfg.disk_space_clean_forcibly_ratio)
        end = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self._stop.is_set():
                try:
                    self.step()
                except (StoreReplacedError, OSError) as exc:
                    # a store removed in the middle of a step fails one of its writes first
                    problem = self.store.identity.problem()
                    if not isinstance(exc, StoreReplacedError) and problem is None:
                        # out of open files, a full disk for a moment: the step is redone
                        # from its mark next time; one failed write must not stop the server
                        self._error(f"delivery step failed, retried at the next step: {exc}")
                        self._stop.wait(self._sleep_s(end))
                        continue
                    if problem is not None and not isinstance(exc, StoreReplacedError):
                        exc = self.store.replaced_error(problem)
                    self.counters.replaced = str(exc)  # nothing more to serve: stop
                    log.error("stopping: %s", exc)
                    break
                if end is not None and time.monotonic() >= end:
                    break
                self._stop.wait(self._sleep_s(end))
        finally:
            self._log_deliveries(final=True)
            self.close()
        log.info("stopped %s: %d delivered in %d runs, %d segments deleted", self.path,
                 self.counters.delivered, self.counters.delivery_runs,
                 self.counters.segments_deleted)
        return self.counters

    def close(self) -> None:
        """Flush and close the store, release the server lock, and mark the status stopped."""
        if self._lock_fd is None:
            return
        try:
            if self._asks is not None:  # (a group's shared endpoint: the first member to stop
                self._asks.close()      # ends it) ends the streams, saves the consumer offsets
            if self.replica is not None:
                self.replica.stop()
            if self.service is not None:
                self.service.shutdown()  # waits for the calls in progress
                self.service.close_readers()
            self._write_status(running=False)
        finally:
            self.store.close()
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ one step
    def step(self) -> int:
        """One round: deliver what is due, and run retention when its interval has passed.

        Returns the number of messages delivered.  A store error is logged and counted (the
        next step tries again); it never ends the server.
        """
        if self.replica is None:
            return self._step()
        with self.replica.services():  # (its appends acknowledge no sender: no replica wait)
            delivered = self._step()
            self.replica.save_watermark()  # (recorded when it moved: readers after a restart)
            return delivered

    def _step(self) -> int:
        c = self.counters
        if self.replica is not None and self.replica.is_follower:
            from ..replication.promote_request import serve_promotion_request

            serve_promotion_request(self.replica)  # rmq promote on this running follower
        if self.replica is not None and self.replica.is_follower:
            # only the leader's services run: a follower gets their work from its log
            if time.monotonic() - self._last_beat >= BEAT_MS / 1000:
                self._write_status(running=True)
            return 0
        delivered = 0
        try:
            delivered = self.store.deliver_due()
        except StoreReplacedError:
            raise
        except StoreError as exc:
            self._error(f"delivery: {exc}")
        c.delivery_runs += 1
        c.delivered += delivered
        c.last_run_ms = self.store.now_ms()
        c.last_run_delivered = delivered
        if delivered:
            self._unlogged[0] += delivered
            self._unlogged[1] += 1
        self._log_deliveries()
        if delivered and self._asks is not None:
            self._asks.service.wake_receivers()
        if (self.check_transactions or self._asks is not None) \
                and time.monotonic() >= self._next_check:
            # the store's effective interval (a producer's recorded one, when set)
            interval = self.store.transactions.settings["transaction_check_interval_ms"]
            self._next_check = time.monotonic() + interval / 1000
            self.check_round()
        if time.monotonic() >= self._next_clean:
            interval_s = self.store.config.clean_resource_interval_ms / 1000
            self._next_clean = time.monotonic() + interval_s
            self.retention()
        if delivered or time.monotonic() - self._last_beat >= BEAT_MS / 1000 \
                or self._warming_reported != self._warming.is_alive():
            self._write_status(running=True)
        return delivered

    def retention(self) -> int:
        """RocketMQ's CleanCommitLogService round: delete what is due for deletion now."""
        cfg = self.store.config
        ratio = disk_used_ratio(self.path) * 100
        hour = time.localtime(self.store.now_ms() / 1000).tm_hour
        force = ratio >= cfg.disk_space_clean_forcibly_ratio
        if not (hour in self.hours or ratio >= cfg.disk_max_used_space_ratio):
            return 0
        try:
            deleted = self.store.clean_expired_files(force=force)
        except StoreError as exc:
            self._error(f"retention: {exc}")
            return 0
        self.counters.retention_runs += 1
        self.counters.segments_deleted += deleted
        if deleted:
            log.info("retention deleted %d CommitLog segments (disk %.0f%% used%s)", deleted,
                     ratio, ", forced" if force else "")
        return deleted

    def check_round(self) -> int:
        """One check round's bookkeeping, its questions published (see the module docstring);
        returns how many transactions it asks about."""
        try:
            plan = self.store.prepare_transaction_checks()
            asked = len(plan.checks)
            if asked and self._asks is not None:
                sent = self._asks.ask(plan.checks)
                if sent:
                    log.info("asked RocketMQ producers about %d open transaction(s)", sent)
            if asked and self.check_transactions:
                number = publish_check_round(self.path, plan.checks.to_arrow())
                log.info("check round %d: %d transaction(s) to ask about, %d discarded", number,
                         asked, plan.discarded)
        except StoreError as exc:
            self._error(f"transaction checks: {exc}")
            return 0
        self.counters.check_rounds += 1
        self.counters.checks_published += asked
        return asked

    # ------------------------------------------------------------------ helpers
    def _sleep_s(self, end: float | None) -> float:
        """Until just after the next multiple of the precision (where slots become due)."""
        now = time.time_ns() // 1_000_000
        wait = (self.precision - now % self.precision + 1) / 1000
        if end is not None:
            wait = min(wait, max(0.0, end - time.monotonic()))
        return wait

    def _log_deliveries(self, *, final: bool = False) -> None:
        """One INFO line for the deliveries not logged yet, at most every
        :data:`DELIVERY_LOG_MS` (``final``: now, when any)."""
        delivered, steps = self._unlogged
        now = self.store.now_ms()
        last = self._delivery_logged_ms
        if not delivered or (not final and last is not None and now - last < DELIVERY_LOG_MS):
            return
        log.info("delivered %d due message(s) in %d step(s)", delivered, steps)
        self._unlogged = [0, 0]
        self._delivery_logged_ms = now

    def _error(self, text: str) -> None:
        log.error("%s", text)
        self.counters.errors = (self.counters.errors + [text])[-20:]

    def _write_status(self, *, running: bool) -> None:
        if self.store.replaced is not None or self.store.identity.problem() is not None:
            return  # the path holds another store now: its status is not ours to write
        self._last_beat = time.monotonic()
        self._warming_reported = warming = self._warming.is_alive()
        c = self.counters
        data = {"pid": os.getpid(), "running": running and not warming, "warming": warming,
                "beat_ms": self.store.now_ms(),
                "started_ms": c.started_ms, "delivery_runs": c.delivery_runs,
                "delivered": c.delivered, "last_run_ms": c.last_run_ms,
                "last_run_delivered": c.last_run_delivered,
                "retention_runs": c.retention_runs, "segments_deleted": c.segments_deleted,
                "check_rounds": c.check_rounds, "checks_published": c.checks_published,
                "precision_ms": self.precision, "errors": c.errors, "listen": self.url,
                "grpc": self.grpc_endpoint,
                "replication": None if self.replica is None else self.replica.status()}
        try:
            atomic_write(os.path.join(self.path, STATUS_FILE),
                         json.dumps(data, sort_keys=True).encode("utf-8"), sync=False)
        except OSError as exc:  # a status file is never worth stopping delivery for
            log.warning("could not write %s: %s", STATUS_FILE, exc)


def _check_grpc_access(grpc: str, acl: str | None, insecure: bool) -> None:
    if not RemoteAddress.listen(grpc).loopback and acl is None and not insecure:
        raise InvalidConfigError(
            f"serving RocketMQ clients on {grpc} (not a loopback address) needs an ACL "
            "(--acl FILE); allowed: an ACL, or --insecure to serve anyone who can reach "
            "the port")


def _check_grpc_replica(members, grpc: str) -> None:
    """A replica set's member may serve ``--grpc`` when the file gives every replica's gRPC
    endpoint (:mod:`store.proxy.follower_calls`); with ``--grpc-processes`` above 1 the
    workers append under the role the server publishes (:mod:`store.proxy.processes`)."""
    missing = [u for u in members.replicas if members.grpc_address(u) is None]
    if missing:
        raise InvalidConfigError(
            f"--grpc {grpc} on a replica of {members.path}, whose \"grpc\" does not give the "
            f"gRPC endpoint of {missing}; allowed: \"grpc\": {{replica URL: \"HOST:PORT\"}} "
            "for every replica (a follower passes the leader's calls on to it, and routes "
            "name them all)")


def _take_lock(path: str) -> int:
    lock_path = os.path.join(path, LOCK_FILE)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(f"another rmq server already runs for {path} ({lock_path} is "
                         "locked); one server per store") from None
    return fd


def server_status(path: str) -> dict | None:
    """Whether a server is attached to the store at ``path``, and what it reported last.

    ``None`` when no server ever ran there; otherwise the last ``config/serve.json`` with
    ``attached`` (its lock is held right now) added.  Reads only; never blocks.
    """
    status_path = os.path.join(path, STATUS_FILE)
    try:
        with open(status_path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        data = None
    lock_path = os.path.join(path, LOCK_FILE)
    attached = False
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        fd = None
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            attached = True
        finally:
            os.close(fd)
    if data is None and not attached:
        return None
    data = dict(data or {})
    data["attached"] = attached
    return data


__all__ = ["ServerCounters", "StoreServer", "delete_hours", "disk_used_ratio", "server_status"]
