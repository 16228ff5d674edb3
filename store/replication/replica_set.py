"""The replica-set file (``rmq serve --replica-set FILE``): which served stores hold copies of
one CommitLog, and which of them leads.

JSON::

    {"replicas": ["rmq://10.0.0.1:7911", "rmq://10.0.0.2:7911"],
     "leader": "rmq://10.0.0.1:7911",
     "witness": "rmq://10.0.0.3:7911",
     "min_insync_replicas": 1,
     "account": "replicator", "secret_file": "/etc/rmq/replicator.secret"}

* ``replicas`` (required): each replica's URL (``rmq://`` or ``rmqs://``, one host and a
  port each), each once.
* ``leader`` (optional): the replica that takes writes; **the first of** ``replicas`` when
  not given.  Chosen statically: this file decides until it is changed (or ``rmq promote``).
* ``witness`` (optional): the URL of a voter that holds no data (``rmq serve --witness``).
  With a witness the set **elects its leader on its own** (:mod:`.election`): ``leader`` is
  then only the first choice when no replica holds data yet; without one the leader is
  static.
* ``raft`` (optional, with a witness): ``{URL: "HOST:PORT"}``, the address of each voter's
  Raft port (the replicas' and the witness's); a voter left out uses its URL's host and
  port + 1.
* ``election_timeout_ms`` (optional, default 1500, with a witness): the lease of a leader: it
  acknowledges writes only while a renewal of its lease committed by the voters is younger
  than this; a leader silent for longer is replaced (:mod:`.election`).
* ``min_insync_replicas`` (optional, default 1): how many replicas, the leader counted,
  hold a write before the leader acknowledges it (:mod:`.acks`); 1 is asynchronous
  replication; at most the number of replicas.
* ``replica_ack_timeout_ms`` (optional, default :data:`DEFAULT_ACK_TIMEOUT_MS`): how long a
  write waits for those replicas before its sender gets
  :class:`~store.base.errors.ReplicaAckTimeoutError`.
* ``grpc`` (optional): ``{URL: "HOST:PORT"}``, each replica's RocketMQ gRPC endpoint as
  clients reach it (``rmq serve --grpc``); needed, for every replica, by a replica serving
  ``--grpc``: a follower's gRPC face passes clients' calls on to the leader's, and route
  answers name every replica's (:mod:`store.proxy.follower_calls`).
* ``consumer_progress_sync_ms`` (optional, default :data:`CONSUMER_PROGRESS_SYNC_MS`): how
  often a follower copies its leader's consumer progress (the gRPC face's consumer groups,
  :mod:`.consumer_progress`); after a failover a group goes on from a copy at most this old.
* ``account`` and ``secret_file`` (optional, together): the credentials a follower presents
  to its leader when the leader checks accounts (``--acl``; the account needs
  ``"replicate": true``).  Without them a follower presents the server's token
  (``--token-file``), when it has one.

A server recognises itself by its ``--listen`` address: the replica whose host and port are
the same; a wildcard host (``0.0.0.0``, ``::``) matches the one replica with its port.
Every mistake is an :class:`~store.base.errors.InvalidConfigError` naming the file and the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..base.errors import InvalidConfigError
from ..base.remote_address import RemoteAddress

#: The fields a replica-set file may have.
FIELDS = ("replicas", "leader", "witness", "min_insync_replicas", "replica_ack_timeout_ms",
          "account", "secret_file", "raft", "election_timeout_ms", "grpc",
          "consumer_progress_sync_ms")
#: How long a write waits for its in-sync replicas, by default (ms).
DEFAULT_ACK_TIMEOUT_MS = 3000
#: Default lease of an elected leader (ms) and its bounds.
ELECTION_TIMEOUT_MS = 1500
MIN_ELECTION_TIMEOUT_MS, MAX_ELECTION_TIMEOUT_MS = 300, 60_000
#: How often a follower copies its leader's consumer progress, by default (ms), and the
#: bounds.
CONSUMER_PROGRESS_SYNC_MS = 5000
MIN_CONSUMER_PROGRESS_SYNC_MS, MAX_CONSUMER_PROGRESS_SYNC_MS = 10, 600_000
_WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    """A parsed replica-set file (see the module docstring); URLs in their normal form."""

    path: str
    replicas: tuple[str, ...]
    leader: str
    witness: str | None
    min_insync_replicas: int
    account: str | None
    secret_file: str | None
    replica_ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS
    raft: tuple[tuple[str, str], ...] = ()
    election_timeout_ms: int = ELECTION_TIMEOUT_MS
    grpc: tuple[tuple[str, str], ...] = ()
    consumer_progress_sync_ms: int = CONSUMER_PROGRESS_SYNC_MS

    @property
    def elected(self) -> bool:
        """Whether the set elects its leader (it has a witness) rather than naming it."""
        return self.witness is not None

    @property
    def voters(self) -> tuple[str, ...]:
        """The URLs of the voters: the replicas, then the witness."""
        return self.replicas + ((self.witness,) if self.witness is not None else ())

    def raft_address(self, url: str) -> str:
        """``HOST:PORT`` of the Raft port of voter ``url`` (see the module docstring)."""
        given = dict(self.raft).get(url)
        if given is not None:
            return given
        address = RemoteAddress.parse(url)
        host = f"[{address.host}]" if ":" in address.host else address.host
        return f"{host}:{address.port + 1}"

    def grpc_address(self, url: str) -> str | None:
        """``HOST:PORT`` of replica ``url``'s RocketMQ gRPC endpoint; ``None`` when the file
        does not give it."""
        return dict(self.grpc).get(url)

    @classmethod
    def read(cls, path: str | os.PathLike) -> ReplicaSet:
        """The replica set of the file at ``path``; :class:`InvalidConfigError` says what is
        wrong."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise InvalidConfigError(f"cannot read the replica-set file {path}: {exc}") from None
        except ValueError as exc:
            raise InvalidConfigError(f"the replica-set file {path} is not JSON: {exc}") from None
        return cls.of(data, path)

    @classmethod
    def of(cls, data: object, path: str = "<replica set>") -> ReplicaSet:
        """The replica set of a decoded file's ``data``."""
        if not isinstance(data, dict):
            raise InvalidConfigError(f"the replica-set file {path}: expected a JSON object")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise InvalidConfigError(f"the replica-set file {path}: unknown field(s) {unknown}; "
                                     f"allowed: {list(FIELDS)}")
        replicas = data.get("replicas")
        if not isinstance(replicas, list) or not replicas:
            raise InvalidConfigError(f"the replica-set file {path}: \"replicas\" must be a "
                                     "non-empty list of rmq:// URLs")
        urls = tuple(_url(u, f"{path}: replicas") for u in replicas)
        if len(set(urls)) != len(urls):
            raise InvalidConfigError(f"the replica-set file {path}: a replica is listed twice "
                                     f"({list(urls)}); allowed: each once")
        leader = data.get("leader")
        leader = urls[0] if leader is None else _url(leader, f"{path}: leader")
        if leader not in urls:
            raise InvalidConfigError(f"the replica-set file {path}: leader {leader} is not one "
                                     f"of the replicas {list(urls)}")
        witness = data.get("witness")
        witness = None if witness is None else _url(witness, f"{path}: witness")
        if witness in urls:
            raise InvalidConfigError(f"the replica-set file {path}: the witness {witness} is "
                                     "also a replica; allowed: a server of its own")
        insync = data.get("min_insync_replicas", 1)
        if not isinstance(insync, int) or isinstance(insync, bool) \
                or not 1 <= insync <= len(urls):
            raise InvalidConfigError(
                f"the replica-set file {path}: min_insync_replicas={insync!r}; allowed: 1 "
                f"(asynchronous) to {len(urls)} (every replica, the leader counted)")
        ack_timeout = data.get("replica_ack_timeout_ms", DEFAULT_ACK_TIMEOUT_MS)
        if not isinstance(ack_timeout, int) or isinstance(ack_timeout, bool) \
                or not 1 <= ack_timeout <= 600_000:
            raise InvalidConfigError(
                f"the replica-set file {path}: replica_ack_timeout_ms={ack_timeout!r}; "
                "allowed: 1 to 600000")
        account, secret_file = data.get("account"), data.get("secret_file")
        if (account is None) != (secret_file is None) or not all(
                v is None or (isinstance(v, str) and v) for v in (account, secret_file)):
            raise InvalidConfigError(f"the replica-set file {path}: \"account\" and "
                                     "\"secret_file\" go together, each a non-empty string")
        voters = urls + ((witness,) if witness is not None else ())
        raft = _addresses(data.get("raft", {}), voters, "raft", "voter", path)
        grpc = _addresses(data.get("grpc", {}), urls, "grpc", "replica", path)
        timeout = data.get("election_timeout_ms", ELECTION_TIMEOUT_MS)
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not (
                MIN_ELECTION_TIMEOUT_MS <= timeout <= MAX_ELECTION_TIMEOUT_MS):
            raise InvalidConfigError(
                f"the replica-set file {path}: election_timeout_ms={timeout!r}; allowed: an "
                f"int from {MIN_ELECTION_TIMEOUT_MS} to {MAX_ELECTION_TIMEOUT_MS}")
        sync = data.get("consumer_progress_sync_ms", CONSUMER_PROGRESS_SYNC_MS)
        if not isinstance(sync, int) or isinstance(sync, bool) or not (
                MIN_CONSUMER_PROGRESS_SYNC_MS <= sync <= MAX_CONSUMER_PROGRESS_SYNC_MS):
            raise InvalidConfigError(
                f"the replica-set file {path}: consumer_progress_sync_ms={sync!r}; allowed: "
                f"an int from {MIN_CONSUMER_PROGRESS_SYNC_MS} to "
                f"{MAX_CONSUMER_PROGRESS_SYNC_MS}")
        return cls(path, urls, leader, witness, insync, account, secret_file, ack_timeout,
                   tuple(sorted(raft.items())), timeout, tuple(sorted(grpc.items())), sync)

    def member(self, listen: RemoteAddress, *, witness: bool = False) -> str:
        """The URL of the replica (``witness``: of the witness) that a server listening on
        ``listen`` is."""
        among = (() if self.witness is None else (self.witness,)) if witness else self.replicas
        exact = [u for u in among if _same(RemoteAddress.parse(u), listen, False)]
        found = exact or [u for u in among if _same(RemoteAddress.parse(u), listen, True)]
        if len(found) != 1:
            what = "the witness" if witness else "no single replica"
            raise InvalidConfigError(
                f"the replica-set file {self.path}: {what} is {listen.host}:{listen.port} "
                f"(--listen); allowed: {'the witness' if witness else 'one of'} "
                f"{list(among)}, with the same host and port (a wildcard host matches the one "
                "with its port)")
        return found[0]


def _addresses(given: object, among: tuple[str, ...], name: str, what: str,
               path: str) -> dict[str, str]:
    """``{URL: "HOST:PORT"}`` of field ``name``, each URL one of ``among`` (a ``what``)."""
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise InvalidConfigError(f"the replica-set file {path}: \"{name}\" must map {what} "
                                 "URLs to \"HOST:PORT\" strings")
    out = {_url(k, f"{path}: {name}"): v for k, v in given.items()}
    for url, spec in out.items():
        if url not in among:
            raise InvalidConfigError(f"the replica-set file {path}: {name} names {url}, "
                                     f"which is no {what}; allowed: one of {list(among)}")
        RemoteAddress.listen(spec)  # (raises on a malformed HOST:PORT)
    return out


def _url(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidConfigError(f"{where}: {value!r}; allowed: an rmq:// URL")
    return RemoteAddress.parse(value).url


def _same(replica: RemoteAddress, listen: RemoteAddress, wildcard: bool) -> bool:
    if replica.port != listen.port:
        return False
    return listen.host in _WILDCARDS if wildcard else replica.host == listen.host
