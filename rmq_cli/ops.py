"""``rmq serve``, ``lag``, ``retention`` and ``cancel``: operating a store that runs all the
time."""

from __future__ import annotations

import json
import os
import sys

import click

from .opening import (keyed_by_store, open_target, open_writable_store, refuse_url,
                      remote_options, require_store, store_members)

#: What a command that reads a store's files says to a served store's URL.
_ON_ITS_HOST = "run it on the server's host with --store DIR"


# --------------------------------------------------------------------------- serve
#: The flags of the faces' bounds (store.operations.face_limits: its FLAGS name them too):
#: each its FaceLimits field and what it bounds; a grpc_ one needs --grpc, the others --listen.
_BOUND_FLAGS = (
    ("grpc_held_calls", "--grpc-max-held-calls",
     "Long polls (receives) --grpc holds at once in all; each holds a thread [default: 1024]."),
    ("grpc_held_calls_per_client", "--grpc-max-held-calls-per-client",
     "... per client id [default: 64]."),
    ("grpc_held_calls_per_peer", "--grpc-max-held-calls-per-peer",
     "... per client IP address: clients behind one NAT share it [default: 512]."),
    ("grpc_held_calls_per_account", "--grpc-max-held-calls-per-account",
     "... per account of --acl [default: 512]."),
    ("grpc_telemetry_streams", "--grpc-max-telemetry-streams",
     "Telemetry streams (client sessions) --grpc keeps open in all [default: 8192]."),
    ("grpc_telemetry_streams_per_peer", "--grpc-max-telemetry-streams-per-peer",
     "... per client IP address: clients behind one NAT share it [default: 1024]."),
    ("flight_streams", "--listen-max-streams",
     "Table and read streams --listen serves at once in all [default: 256]."),
    ("flight_streams_per_host", "--listen-max-streams-per-host",
     "... per client host (IP address) [default: 64]."),
)


def _bound_options(command):
    """``command`` with the flags of :data:`_BOUND_FLAGS`."""
    for field, flag, text in reversed(_BOUND_FLAGS):
        command = click.option(flag, field, type=int, default=None, metavar="N",
                               help=text)(command)
    return command


def _face_limits(bounds: dict, listen, grpc_listen):
    """The :class:`store.FaceLimits` of the bound flags given (``None``: none given)."""
    from store import FaceLimits, InvalidConfigError

    given = {k: v for k, v in bounds.items() if v is not None}
    flags = {field: flag for field, flag, _ in _BOUND_FLAGS}
    for field in given:
        grpc = field.startswith("grpc_")
        if (grpc_listen if grpc else listen) is None:
            raise click.UsageError(f"{flags[field]} needs {'--grpc' if grpc else '--listen'}")
    if not given:
        return None
    try:
        return FaceLimits(**given)
    except InvalidConfigError as exc:
        raise click.UsageError(str(exc)) from None


@click.command()
@click.option("--store", "store_path", required=False, type=click.Path(file_okay=False),
              help="The store directory, or a store group's (a server per store); needed "
                   "but with --witness (then: where the witness keeps its votes).")
@click.option("--witness", is_flag=True,
              help="Serve the witness of --replica-set (a voter holding no data) on --listen.")
@click.option("--create", is_flag=True,
              help="Make a new store at --store when none is there (else that is an error).")
@click.option("--delete-when", default=None,
              help="Hours for retention, ';'-separated (RocketMQ's deleteWhen) [default: 04].")
@click.option("--file-reserved-time-hours", type=click.IntRange(min=1), default=None,
              help="Keep CommitLog segments at least this long [default: 72].")
@click.option("--disk-max-used-space-ratio", type=click.IntRange(1, 100), default=None,
              help="Disk use (%) above which retention runs at any hour [default: 75].")
@click.option("--message-index/--no-message-index", default=None,
              help="Keep RocketMQ's message-key index for queries by key (rmq query --key); "
                   "off by default: it costs sends (docs/api.md).")
@click.option("--check-transactions", is_flag=True,
              help="Run the transaction check rounds here and publish their questions; "
                   "resolvers (a Spark view=transaction_checks query with "
                   "checkRounds=server) then only answer.")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Also serve the store over Arrow Flight here, for rmq://HOST:PORT clients "
                   "(Spark executors on other hosts, store.connect). Off unless given.")
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A file whose first line is the shared secret every network request must "
                   "carry (needed for a non-loopback --listen, unless --insecure).")
@click.option("--grpc", "grpc_listen", default=None, metavar="HOST:PORT",
              help="Also serve RocketMQ 5 clients (Java, Go, Node.js, Python...) here: the "
                   "apache.rocketmq.v2 gRPC protocol; needs the grpc extra (pip install "
                   "'.[grpc]').  With --replica-set, the file's \"grpc\" gives every "
                   "replica's endpoint: a follower passes writes on to the leader.")
@click.option("--grpc-processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Serve --grpc as this many processes on one port (SO_REUSEPORT), each "
                   "appending to the store; consumer state stays in the first.")
@click.option("--acl", type=click.Path(dir_okay=False, exists=True), default=None,
              help="An ACL file (JSON accounts: accessKey, secretKey, topic and group "
                   "permissions, admin) the --grpc clients sign with and the --listen "
                   "clients give (account and secret).")
@click.option("--insecure", is_flag=True,
              help="Serve a non-loopback --listen address without a token, or --grpc "
                   "without an ACL.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM certificate chain: serve rmqs:// (TLS); needs --tls-key.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM private key of --tls-cert.")
@click.option("--max-request-mib", type=click.IntRange(min=1), default=None,
              help="Refuse a --listen table upload (DoPut, DoExchange) past this many MiB "
                   "of Arrow buffers, as soon as it passes [default: 256].")
@_bound_options
@click.option("--replica-set", "replica_set", type=click.Path(dir_okay=False, exists=True),
              default=None,
              help="Serve this store as one replica of the replica set this JSON file lists "
                   "(the one whose URL is --listen): the leader takes writes, a follower "
                   "copies its CommitLog (docs/operations.md).")
@click.option("--duration-s", type=click.FloatRange(min=0), default=None,
              help="Stop after this many seconds (default: until SIGTERM or Ctrl-C).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
              default="INFO", show_default=True)
def serve(store_path, witness, create, delete_when, file_reserved_time_hours, disk_max_used_space_ratio,
          message_index, check_transactions, listen, grpc_listen, grpc_processes, acl, token_file, insecure, tls_cert, tls_key,
          max_request_mib, replica_set, duration_s, log_level, **bounds):
    """Deliver due delayed messages and run retention for a store, until stopped.

    Delayed messages reach their topics within about timer_precision_ms of their due time
    with no reader running.  Runs beside any readers and writers (Spark queries, rmq tail,
    producers); one server per store.  Stops cleanly on SIGTERM or Ctrl-C.
    """
    import logging

    from store import StoreConfig, StoreError, StoreServer, is_store_group

    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if witness:
        _serve_witness(store_path, listen, replica_set, token_file, duration_s)
        return
    if store_path is None:
        raise click.UsageError("--store DIR is needed (but with --witness)")
    refuse_url(store_path, "rmq serve", "serve a store directory on its own host: rmq serve "
               "--store DIR --listen HOST:PORT")
    changes = {k: v for k, v in (("delete_when", delete_when),
                                 ("file_reserved_time_hours", file_reserved_time_hours),
                                 ("disk_max_used_space_ratio", disk_max_used_space_ratio),
                                 ("message_index_enable", message_index))
               if v is not None}
    config = StoreConfig().replace(**changes) if changes else None
    network = _network_options(listen, token_file, insecure, tls_cert, tls_key, grpc_listen,
                               acl)
    face_limits = _face_limits(bounds, listen, grpc_listen)
    if face_limits is not None:
        network["face_limits"] = face_limits
    require_store(store_path, create)
    if max_request_mib is not None and network.get("listen") is not None:
        network["max_request_bytes"] = max_request_mib * 1024 * 1024
    if replica_set is not None:
        if is_store_group(store_path):
            raise click.UsageError("--replica-set serves one store; a store group's members "
                                   "are served one by one")
        network["replica_set"] = replica_set
    if grpc_processes > 1:
        if grpc_listen is None or is_store_group(store_path):
            raise click.UsageError("--grpc-processes needs --grpc and one store (a store "
                                   "group's endpoint is one process)")
        network["grpc_processes"] = grpc_processes
    if not is_store_group(store_path):
        try:
            server = StoreServer(store_path, config, check_transactions=check_transactions,
                                 **network)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
        server.install_signal_handlers()
        where = f"; clients connect to {server.url}" if server.url else ""
        if server.grpc_endpoint:
            where += f"; RocketMQ clients to {server.grpc_endpoint}"
        click.echo(f"rmq serve: serving {store_path} (pid {os.getpid()}){where}; SIGTERM or "
                   "Ctrl-C stops", err=True)
        counters = server.run(duration_s=duration_s)
        if counters.replaced is not None:
            click.echo(f"rmq serve: stopped: {counters.replaced}", err=True)
            sys.exit(3)
        click.echo(f"rmq serve: stopped; {counters.delivered} delivered, "
                   f"{counters.segments_deleted} segment(s) deleted", err=True)
        return
    _serve_group(store_path, config, check_transactions, duration_s, network)


def _serve_witness(state_dir, listen, replica_set, token_file, duration_s) -> None:
    """``rmq serve --witness``: vote in the replica set's elections, holding no data."""
    import signal

    from store import StoreError, Witness, read_token

    if listen is None or replica_set is None:
        raise click.UsageError("--witness needs --listen HOST:PORT and --replica-set FILE")
    try:
        token = read_token(token_file=token_file) if token_file else None
        witness = Witness(replica_set, listen, token=token, state_dir=state_dir)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: witness.stop())
    click.echo(f"rmq serve: witness {witness.me} of {replica_set} (pid {os.getpid()}); "
               "SIGTERM or Ctrl-C stops", err=True)
    witness.run(duration_s)
    click.echo("rmq serve: witness stopped", err=True)


def _member_network(network: dict, i: int) -> dict:
    """The network settings of a group's member ``i``: ``PORT + i`` (0 stays 0); the gRPC
    endpoint is the group's, one for all members (see :func:`_serve_group`)."""
    network = {k: v for k, v in network.items()  # (the accounts also guard --listen)
               if k != "grpc" and (k != "acl" or network.get("listen") is not None)}
    if not network or network.get("listen") is None:
        return {}
    host, _, port = network["listen"].rpartition(":")
    if not port.isdigit():
        raise click.UsageError(f"--listen {network['listen']!r}; allowed: HOST:PORT")
    return {**network, "listen": f"{host}:{int(port) + i if int(port) else 0}"}


def _network_options(listen, token_file, insecure, tls_cert, tls_key, grpc_listen=None,
                     acl=None) -> dict:
    """The network settings of ``rmq serve`` as :class:`store.StoreServer` arguments."""
    from store import InvalidConfigError, read_token

    extra = {}
    if grpc_listen is not None:
        extra = {"grpc": grpc_listen, "acl": acl}
    elif acl is not None:
        if listen is None:
            raise click.UsageError("--acl needs --listen or --grpc")
        extra = {"acl": acl}
    if listen is None:
        if token_file:
            raise click.UsageError("--token-file needs --listen")
        if grpc_listen is None:
            if insecure or tls_cert or tls_key:
                raise click.UsageError("--insecure and --tls-* need --listen or --grpc")
            return {}
        extra["insecure"] = insecure
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    try:
        token = read_token(token_file=token_file) if token_file else None
    except InvalidConfigError as exc:
        raise click.UsageError(str(exc)) from None
    tls = None
    if tls_cert is not None:
        with open(tls_cert, "rb") as cert, open(tls_key, "rb") as key:
            tls = (cert.read(), key.read())
    return {"listen": listen, "token": token, "tls": tls, "insecure": insecure, **extra}


def _serve_group(path, config, check_transactions, duration_s, network) -> None:
    """``rmq serve`` of a store group: one server per store, each in a thread of this
    process (every store delivers, checks and cleans its own messages); with ``--listen
    HOST:PORT`` member *i* listens on ``PORT + i`` (port 0: any free port)."""
    import signal
    import threading

    from store import StoreError, StoreGroup, StoreServer

    servers = []
    endpoint = None
    members = StoreGroup.members(path)
    try:
        for i, (_, member) in enumerate(members):
            servers.append(StoreServer(member, config, check_transactions=check_transactions,
                                       **_member_network(network, i)))
        if network.get("grpc") is not None:  # one endpoint for the whole group
            endpoint = StoreServer.share_grpc_endpoint(
                servers, [name for name, _ in members], network["grpc"], acl=network.get("acl"),
                tls=network.get("tls"), insecure=bool(network.get("insecure")),
                face_limits=network.get("face_limits"))
    except BaseException as exc:
        if endpoint is not None:
            endpoint.close()
        for server in servers:
            server.close()
        if isinstance(exc, StoreError):
            raise click.ClickException(str(exc)) from None
        raise
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: [s.stop() for s in servers])
    click.echo(f"rmq serve: serving the {len(servers)} stores of the group {path} (pid "
               f"{os.getpid()}); SIGTERM or Ctrl-C stops", err=True)
    for server in servers:
        if server.url:
            click.echo(f"rmq serve: {server.path} at {server.url}", err=True)
    if endpoint is not None:
        click.echo(f"rmq serve: RocketMQ clients connect to {endpoint.endpoint} (every store "
                   "of the group)", err=True)
    for server in servers:  # the first step of each here: lazy loads (compiled kernels)
        server.step()        # happen in one thread, before the servers run side by side
    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i, s=s: results.__setitem__(
        i, s.run(duration_s=duration_s)), name=f"rmq-serve-{i}", daemon=True)
        for i, s in enumerate(servers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.2)  # short joins: signals reach the main thread
    delivered = sum(r.delivered for r in results.values())
    deleted = sum(r.segments_deleted for r in results.values())
    replaced = [r.replaced for r in results.values() if r.replaced is not None]
    for text in replaced:
        click.echo(f"rmq serve: a member stopped: {text}", err=True)
    click.echo(f"rmq serve: stopped; {delivered} delivered, {deleted} segment(s) deleted "
               f"in {len(servers)} stores", err=True)
    if replaced:
        sys.exit(3)


# --------------------------------------------------------------------------- lag
@click.command()
@click.option("--checkpoint", "checkpoint_dir", required=True,
              type=click.Path(file_okay=False, exists=True),
              help="The streaming query's checkpointLocation.")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="The store (or store group) the query reads.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for monitoring).")
def lag(checkpoint_dir, store_path, as_json):
    """How many messages a streaming query has not processed yet, per queue.

    Compares the end offsets of the query's last committed micro-batch (from its checkpoint)
    with the end of each queue in the store; opens the store read-only.
    """
    from rmq_source.lag import checkpoint_offsets, path_lag

    refuse_url(store_path, "rmq lag", f"{_ON_ITS_HOST}, or call "
               "rmq_source.lag.query_lag(query, path) in the job")
    batch, sources = checkpoint_offsets(checkpoint_dir, raw=True)
    result = path_lag(store_path, sources)
    result["batch_id"] = batch
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    if batch is None:
        click.echo("no micro-batch committed yet: the query has processed nothing")
        return
    click.echo(f"last committed batch {batch}: {result['lag']} message(s) behind "
               f"(largest queue lag {result['max_lag']})")
    for row in result["queues"]:
        where = f"{row['store']}:" if "store" in row else ""
        click.echo(f"  {where}{row['topic']}/{row['queue_id']}: processed to "
                   f"{row['processed']}, latest {row['latest']}, lag {row['lag']}")


# --------------------------------------------------------------------------- retention
@click.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="The store directory.")
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted, and why not.")
@click.option("--force", is_flag=True,
              help="Ignore the segments' age (never the newest segment, never one a pending "
                   "delayed or open half message needs).")
@click.option("--file-reserved-time-hours", type=click.IntRange(min=1), default=None,
              help="Keep segments at least this long [default: 72, RocketMQ's].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def retention(store_path, dry_run, force, file_reserved_time_hours, as_json):
    """Delete CommitLog segments older than file_reserved_time_hours, now.

    Each segment is listed with what happens to it: deleted, or kept because it is the
    newest, is needed by a pending delayed or open half message, is too young, or comes
    after a kept one.  A server (rmq serve) does this on its own schedule.
    """
    refuse_url(store_path, "rmq retention", f"{_ON_ITS_HOST} (a running `rmq serve` applies "
               "retention itself)")
    results = {}
    for name, path in store_members(store_path):
        store = open_writable_store(path)
        if file_reserved_time_hours is not None:
            from store import MessageStore, StoreConfig

            store.close()
            store = MessageStore.open(path, StoreConfig(
                file_reserved_time_hours=file_reserved_time_hours))
        try:
            plan = store.retention_plan(force=force)
            deleted = 0 if dry_run else store.clean_expired_files(force=force)
            hours = store.config.file_reserved_time_hours
        finally:
            store.close()
        results[name] = {"dry_run": dry_run, "deleted": deleted, "segments": plan,
                         "hours": hours}
    if as_json:
        for r in results.values():
            r.pop("hours")
        click.echo(json.dumps(keyed_by_store(store_path, results), indent=2, sort_keys=True))
        return
    for name, r in results.items():
        if name is not None:
            click.echo(f"== store {name}")
        plan = r["segments"]
        for p in plan:
            verb = ("would delete" if dry_run else "deleted") if p["action"] == "delete" \
                else "keeps"
            why = "" if p["action"] == "delete" else f" ({p['action']})"
            click.echo(f"{verb} {os.path.basename(p['file'])}{why}")
        would = sum(p["action"] == "delete" for p in plan)
        click.echo(f"{'would delete' if dry_run else 'deleted'} "
                   f"{would if dry_run else r['deleted']} of {len(plan)} segment(s); "
                   f"file_reserved_time_hours={r['hours']}", err=True)


# --------------------------------------------------------------------------- cancel
@click.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              metavar="DIR|URL",
              help="The store directory, a store group's, or a served store's URL "
                   "(rmq://HOST:PORT).")
@remote_options
@click.option("--topic", default=None, help="The topic the message was sent to (with --msg-id).")
@click.option("--msg-id", "msg_ids", multiple=True,
              help="Id of a pending timer message (repeat for several; with --topic).")
@click.option("--key", "keys", multiple=True,
              help="A delay key: cancel the pending message it names (repeat for several).")
def cancel(store_path, token_file, token, topic, msg_ids, keys):
    """Cancel pending timer messages so they never surface, by --topic and --msg-id or by
    --key (exit 1 if one was not pending)."""
    from store import RemoteError, StoreError, StoreGroup, is_store_group

    if bool(msg_ids) == bool(keys) or bool(msg_ids) != (topic is not None):
        raise click.UsageError("give --topic with one or more --msg-id, or one or more --key "
                               "(not both)")
    # over a group the message is cancelled in whichever store holds it (a key: its owner)
    store = StoreGroup.open(store_path) if is_store_group(store_path) \
        else open_target(store_path, token, token_file)
    missing = []
    try:
        producer = store.producer("rmq-cli")
        if keys:
            for key, hit in zip(keys, producer.cancel_keys(list(keys)).tolist()):
                if hit:
                    click.echo(f"cancelled key {key}")
                else:
                    missing.append(key)
                    click.echo(f"not pending: key {key} (names no message, or one already "
                               "delivered or cancelled)", err=True)
        for msg_id in msg_ids:
            if producer.cancel(topic, msg_id):
                click.echo(f"cancelled {msg_id}")
            else:
                missing.append(msg_id)
                click.echo(f"not pending: {msg_id} (unknown, another topic, a delay-level "
                           "message, already due or already cancelled)", err=True)
    except RemoteError:
        raise  # the server unreachable, or the token refused: a store error (exit 1)
    except StoreError as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        store.close()
    if missing:
        raise SystemExit(1)


# --------------------------------------------------------------------------- pending
@click.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="The store directory.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="At most this many of each kind.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pending(store_path, limit, as_json):
    """The next delayed messages due (timer and delay levels) and the oldest open
    transactions (of each store of a group)."""
    refuse_url(store_path, "rmq pending", f"{_ON_ITS_HOST} (`rmq stats --store URL` shows a "
               "served store's topics)")
    results = {}
    for name, path in store_members(store_path):
        store = open_writable_store(path, "its delayed and half messages are RocketMQ's "
                                    "(rmq stats shows its topics)")
        try:
            results[name] = store.pending_messages(limit)
            now = store.now_ms()
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps(keyed_by_store(store_path, results), indent=2, sort_keys=True))
        return
    for name, data in results.items():
        if name is not None:
            click.echo(f"== store {name}")
        _print_pending(data, now)


def _print_pending(data: dict, now: int) -> None:
    import datetime as dt

    def when(ms):
        if ms is None:
            return "?"
        stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
        return f"{stamp.isoformat(timespec='milliseconds')} (in {(ms - now) / 1000:.1f} s)"

    for kind, title in (("timer", "timer messages"), ("delay_levels", "delay-level messages")):
        click.echo(f"{title}: {len(data[kind])} shown")
        for it in data[kind]:
            click.echo(f"  {when(it['due_ms'])}  {it['topic']}/{it['queue_id']}  {it['msg_id']}")
    click.echo(f"open transactions: {len(data['transactions'])} shown")
    for tx in data["transactions"]:
        click.echo(f"  {tx['transaction_id']}  group {tx['producer_group']}  topic "
                   f"{tx['topic']}  born {(now - tx['born_ms']) / 1000:.1f} s ago  checked "
                   f"{tx['check_times']} time(s)")
