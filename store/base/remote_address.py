"""Addresses of served stores: ``rmq://HOST:PORT`` (plain) and ``rmqs://HOST:PORT`` (TLS).

A URL names a server only: no path, query, user or password (a token never travels in a
URL, where logs and Spark plans would show it).  A URL may name the replicas of one replica
set, comma-separated (``rmq://h1:7911,h2:7911``, as Kafka's bootstrap servers):
:func:`parse_replicas` splits it, and the client finds their leader
(:mod:`store.remote.flight_client`).  ``HOST`` may be a name, an IPv4 address or
a bracketed IPv6 address.  The Flight location is ``grpc+tcp://`` or ``grpc+tls://`` of the
same host and port.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import InvalidConfigError

#: Default bound on one call of a client (connect, read, write), seconds.
DEFAULT_TIMEOUT_S = 60.0
_ALLOWED = "allowed: rmq://HOST:PORT or rmqs://HOST:PORT (TLS), nothing after the port"


def is_remote(path) -> bool:
    """Whether ``path`` is an ``rmq://`` or ``rmqs://`` URL rather than a directory."""
    if not isinstance(path, str):
        return False
    head = path[:7].lower()
    return head.startswith("rmq://") or head.startswith("rmqs://")


@dataclass(frozen=True, slots=True)
class RemoteAddress:
    """A served store's address (see the module docstring)."""

    host: str
    port: int
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> RemoteAddress:
        """Parse an ``rmq://`` / ``rmqs://`` URL; :class:`InvalidConfigError` says what is
        wrong with a malformed one."""
        if not is_remote(url):
            raise InvalidConfigError(f"{url!r} is no store URL; {_ALLOWED}")
        parts = urlsplit(url)
        if "," in parts.netloc:
            raise InvalidConfigError(
                f"{url!r} names several servers; here one served store is needed (the "
                f"replicas of a replica set go to connect(); several stores written as one "
                f"are a store group, a member per URL); {_ALLOWED}")
        try:
            port = parts.port
        except ValueError:
            raise InvalidConfigError(f"{url!r}: the port is not a number from 1 to 65535; "
                                     f"{_ALLOWED}") from None
        if parts.username is not None or parts.password is not None:
            raise InvalidConfigError(
                f"a store URL may not carry a user or a token; give the token as an option "
                f"(token or tokenFile); {_ALLOWED}")
        if not parts.hostname or port is None or port == 0:
            raise InvalidConfigError(f"{url!r}: a host and a port are needed; {_ALLOWED}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise InvalidConfigError(f"{url!r}: nothing may follow the port; {_ALLOWED}")
        return cls(parts.hostname, port, parts.scheme.lower() == "rmqs")

    @classmethod
    def listen(cls, spec: str, *, tls: bool = False) -> RemoteAddress:
        """An address to listen on, ``HOST:PORT`` (``rmq serve --listen``; port 0: any free
        port)."""
        host, sep, port = str(spec).rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise InvalidConfigError(
                f"--listen {spec!r}: allowed: HOST:PORT, e.g. 127.0.0.1:7911 or 0.0.0.0:7911")
        return cls(host, int(port), tls)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'rmqs' if self.tls else 'rmq'}://{host}:{self.port}"

    @property
    def location(self) -> str:
        """The Flight location (``grpc+tcp://`` or ``grpc+tls://``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"grpc+{'tls' if self.tls else 'tcp'}://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """Whether the address is reachable from this host only."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return self.url


def parse_replicas(url: str) -> tuple[RemoteAddress, ...]:
    """The servers a URL names: one, or the replicas of a replica set
    (``rmq://h1:7911,h2:7911``; each host may carry its port, all share the scheme).
    :class:`InvalidConfigError` for a malformed one or a server named twice."""
    if not is_remote(url):
        raise InvalidConfigError(f"{url!r} is no store URL; {_ALLOWED}")
    scheme, _, rest = url.partition("://")
    hosts = rest.rstrip("/").split(",")
    if len(hosts) == 1:
        return (RemoteAddress.parse(url),)
    found = tuple(RemoteAddress.parse(f"{scheme}://{h.strip()}") for h in hosts)
    if len(set(found)) != len(found):
        raise InvalidConfigError(f"{url!r} names a server twice; allowed: each replica once")
    return found


def replicas_url(addresses) -> str:
    """The normal form of a URL naming ``addresses`` (one, or a replica set's)."""
    first = addresses[0].url
    return ",".join([first] + [a.url.partition("://")[2] for a in addresses[1:]])


def read_token(token: str | None = None, token_file: str | os.PathLike | None = None
               ) -> str | None:
    """The shared secret given directly or as a file (its first line, stripped);
    :class:`InvalidConfigError` for both, an unreadable file or an empty token."""
    if token is not None and token_file is not None:
        raise InvalidConfigError("give a token or a token file, not both")
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as fh:
                token = fh.readline().strip()
        except OSError as exc:
            raise InvalidConfigError(
                f"token file {os.fspath(token_file)!r} cannot be read ({exc.strerror}); "
                "allowed: a readable file whose first line is the token") from None
        if not token:
            raise InvalidConfigError(
                f"token file {os.fspath(token_file)!r} is empty; allowed: a file whose first "
                "line is the token")
    if token is not None and not token.strip():
        raise InvalidConfigError("the token is empty; allowed: a non-empty shared secret")
    return token.strip() if token is not None else None


def account_header(account: str | None, secret: str | None, token: str | None
                   ) -> bytes | None:
    """The ``authorization`` header a client sends: ``Bearer <token>``, or ``Basic
    base64(<account>:<secret>)`` for an account of the server's ACL file; ``None`` for
    neither.  :class:`InvalidConfigError` for an account without its secret (or the reverse)
    or with a token too."""
    if (account is None) != (secret is None):
        raise InvalidConfigError("an account needs its secret (secret or secretFile) and a "
                                 "secret its account; allowed: both or neither")
    if account is None:
        return None if token is None else f"Bearer {token}".encode()
    if token is not None:
        raise InvalidConfigError("give a token or an account, not both")
    if not account or ":" in account:
        raise InvalidConfigError(f"account {account!r}; allowed: a non-empty access key "
                                 "without ':'")
    return b"Basic " + base64.b64encode(f"{account}:{secret}".encode())
