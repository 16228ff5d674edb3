"""A client of a replica set (``rmq://h1:7911,h2:7911``): finding its leader, and calling
again after a failover.

A :class:`~store.remote.flight_client.RemoteStore` given several replicas calls through
:func:`with_failover`.  Before its first call, and after a call failed with
:class:`~store.base.errors.NotLeaderError` or because the server could not be reached, it asks
the replicas in turn who leads (the ``leader`` action: any replica, or the witness,
answers) and points at the one that says it leads (else at the one they name), then calls
again, until :data:`FAILOVER_TIMEOUT_S` (``connect(..., failover_timeout_s=...)``) has
passed; then the last error is raised.

**What is called again**, and what is not:

* a call refused with ``NotLeaderError`` stored nothing: always called again on the leader;
  but for :class:`~store.base.errors.LeaderDeposedError` (a write appended on a leader that
  was deposed while it waited for its copies: it may survive), which is treated as a
  broken connection below;
* a call that could not reach its server (``failed to connect``, connection refused) was
  never sent: always called again;
* a call whose connection broke after it was sent (the server killed mid-call, a timeout)
  may have been stored.  Reads and the writes that are safe to repeat (:func:`may_repeat`:
  keyed timer messages, ``replace_table``, ``schedule``, cancels, transaction ends, sink
  commits, which a second time change nothing) are called again; a plain ``send``,
  ``send_batch``, ``send_table``, a half message or a sink's staging is not: it raises
  :class:`~store.base.errors.SendOutcomeUnknownError` naming the call, and the caller decides
  (read the queue back, or send with keys).
"""

from __future__ import annotations

import logging
import time

from ..base.errors import (
    AccessDeniedError,
    AuthenticationError,
    LeaderDeposedError,
    NotLeaderError,
    RemoteError,
    SendOutcomeUnknownError,
    StoreError,
)
from ..base.remote_address import RemoteAddress

log = logging.getLogger("store.remote")

#: How long a call to a replica set may take to find a leader again (s).
FAILOVER_TIMEOUT_S = 15.0
#: Bound on asking one replica who leads (s), and the pause between two rounds.
ASK_TIMEOUT_S = 1.0
ASK_PAUSE_S = 0.1
#: Calls that are not safe to repeat once sent (see the module docstring).
ONCE_ONLY = frozenset({"send", "send_batch", "send_table", "send_half", "sink_stage"})
#: Words of a transport error raised before the request left (nothing was sent).  Not the
#: "cannot be reached" of every unavailable error: a stream removed mid-call (the server
#: killed after it took the request) is one too, and it may have been stored.
_NOT_SENT = ("failed to connect", "connection refused")


def may_repeat(op: str, body: dict | None = None) -> bool:
    """Whether call ``op`` (with ``body``) may be made again after its outcome was lost:
    everything but :data:`ONCE_ONLY`, and a ``send`` with a delay key (it replaces its
    earlier self)."""
    if op == "send" and body is not None and body.get("key") is not None:
        return True
    return op not in ONCE_ONLY


def with_failover(remote, op: str, call, repeat: bool):
    """``call()`` on ``remote``'s leader, found again and called again as the module
    docstring says; ``repeat``: whether a call whose outcome was lost may be repeated."""
    deadline = time.monotonic() + remote.failover_timeout_s
    while True:
        if remote._leader_unknown:
            find_leader(remote, deadline)
        try:
            return call()
        except (AuthenticationError, AccessDeniedError):
            raise
        except LeaderDeposedError as exc:  # (stored there, maybe copied: not a plain refusal)
            last = exc
            if not repeat:
                remote._leader_unknown = True
                raise _outcome_unknown(remote, op, exc) from None
        except NotLeaderError as exc:
            last = exc
        except RemoteError as exc:
            last = exc
            if not repeat and not _not_sent(exc):
                remote._leader_unknown = True
                raise _outcome_unknown(remote, op, exc) from None
        if time.monotonic() >= deadline:
            raise last
        log.info("%s: %s; finding the leader of %s again", op, last, remote.root)
        remote._leader_unknown = True


def _outcome_unknown(remote, op: str, exc: StoreError) -> SendOutcomeUnknownError:
    return SendOutcomeUnknownError(
        f"{op} to {remote.address.url}, the leader of {remote.root}: its outcome is unknown "
        f"({exc}); it may or may not be stored, and is not sent again; allowed: read the "
        "queue back to find it, or send with a key (keyed sends are repeated)")


def _not_sent(exc: StoreError) -> bool:
    text = str(exc).lower()
    return any(words in text for words in _NOT_SENT)


def find_leader(remote, deadline: float) -> None:
    """Point ``remote`` at its replica set's leader: ask each replica who leads; take the
    one that says it leads, else the one most of them name; ask again every
    :data:`ASK_PAUSE_S` until ``deadline`` (then :class:`RemoteError`)."""
    last = None
    while True:
        named = []
        for address in remote.addresses:
            remote._point(address)
            try:
                answer = remote._action_once("leader", timeout_s=ASK_TIMEOUT_S)
            except StoreError as exc:
                last = exc
                continue
            if answer.get("leading"):
                remote._leader_unknown = False
                return
            if answer.get("leader"):
                named.append(answer["leader"])
        if named:  # (just elected, or a replica the URL does not list)
            remote._point(RemoteAddress.parse(max(set(named), key=named.count)))
            remote._leader_unknown = False
            return
        if time.monotonic() >= deadline:
            raise RemoteError(f"no leader of the replica set {remote.root} could be found in "
                              f"{remote.failover_timeout_s:g} s (last: {last}); allowed: a "
                              "replica set with a majority of its voters up")
        time.sleep(ASK_PAUSE_S)
