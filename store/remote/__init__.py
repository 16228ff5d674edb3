"""A store served over the network: Arrow Flight (``rmq serve --listen``, ``rmq://`` URLs).

``wire`` names the Flight calls both sides use, ``flight_service`` answers them beside ``rmq
serve``'s loop, ``flight_client`` makes them (the URLs and tokens: ``store.base.remote_address``;
the producers and the sink a client gives out: ``remote_writers``).
``pyarrow.flight`` (gRPC) is imported only by ``flight_service`` and ``flight_client``, when a
store is served or connected to.
"""

from __future__ import annotations

import os
import typing

from ..base.remote_address import DEFAULT_TIMEOUT_S

if typing.TYPE_CHECKING:
    from .flight_client import RemoteStore


def connect(url: str, *, token: str | None = None, token_file: str | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S,
            tls_root_certs: str | os.PathLike | None = None, account: str | None = None,
            secret: str | None = None, secret_file: str | None = None,
            failover_timeout_s: float | None = None) -> RemoteStore:
    """A handle on the store served at ``url`` (``rmq://HOST:PORT`` or ``rmqs://``), or on
    the replica set whose replicas it names (``rmq://h1:7911,h2:7911``): writes go to its
    leader, found and found again after a failover (:mod:`store.remote.failover`).

    Parameters
    ----------
    token, token_file : str, optional
        The server's shared secret, or a file whose first line is it.
    account, secret, secret_file : str, optional
        An account of the server's ACL file (``rmq serve --listen ... --acl FILE``): its
        access key and its secret key (or a file whose first line is it); instead of a
        token.
    timeout_s : float
        Bound on each call; past it the call raises :class:`~store.base.errors.RemoteError`.
    tls_root_certs : path, optional
        PEM file of the certificates that sign the server's (``rmqs://``; default: the
        system's roots).
    failover_timeout_s : float, optional
        A replica set: how long a call may take to find the leader again (default 15).

    Nothing is sent until the first call; use it as a context manager or call ``close()``.
    """
    from .flight_client import RemoteStore

    return RemoteStore(url, token=token, token_file=token_file, timeout_s=timeout_s,
                       tls_root_certs=tls_root_certs, account=account, secret=secret,
                       secret_file=secret_file, **({} if failover_timeout_s is None else {
                           "failover_timeout_s": failover_timeout_s}))
