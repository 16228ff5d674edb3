"""Who calls the Flight face, and what each call may touch.

Two ways in, both over the ``authorization`` header:

* the server's single token (``Bearer <token>``, ``--token-file``): one secret that opens
  everything, an admin;
* an account of the accounts file (``--acl FILE``, :mod:`store.files.accounts`, the same
  file as the gRPC endpoint's): ``Basic base64(<accessKey>:<secretKey>)``; each call is then
  checked against the account's rights by what it touches, not by a name it gives:

  ======================================  ==============================================
  call                                    needs
  ======================================  ==============================================
  read (``DoGet``), offset_for_timestamp  SUB on the topic read
  snapshot                                lists only topics the account may PUB or SUB
  send, send_batch, send_half, schedule   PUB on the message's topic
  send_table, check_table, sink_stage,    PUB on the topic of every row (``topic=`` or
  schedule_table                          the ``topic`` column)
  remove / pause / resume_schedule        PUB on the topic of the schedule under the key
  cancel (topic and msg_id)               PUB on the topic
  end_transactions                        a transaction this account opened (send_half)
                                          on this server, else admin
  sink_* actions                          the account's own sinks: a sink id is kept
                                          apart per account
  ensure_topic                            PUB on the topic
  anything by delay key (``key``,         admin (a key names a message of any topic)
  cancel_keys, pending_keys,
  replace_table), schedules, check
  rounds, deliver_due, flush,
  known_transactions
  replicate (``DoGet``: CommitLog bytes), the account's ``replicate`` right, or admin
  epochs
  ======================================  ==============================================

A call without rights is refused with :class:`~store.base.errors.AccessDeniedError` before
anything is read or written.
"""

from __future__ import annotations

import base64
import hmac
import threading
from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import flight

from ..base.errors import AccessDeniedError
from ..files.accounts import AccountRights

#: The account of a call made with the server's token (or of any call without access
#: control).
ADMIN = AccountRights("", "", True, frozenset(), {}, frozenset(), {})
#: Transaction ids remembered per server for their opener's end (oldest forgotten first;
#: about 170 bytes each: 17 MB at the bound).
MAX_OPENED_TRANSACTIONS = 100_000


class Caller(flight.ServerMiddleware):
    """The account of one call (:func:`caller_of` finds it in the call's context)."""

    def __init__(self, account: AccountRights) -> None:
        super().__init__()
        self.account = account


class AccountCheck(flight.ServerMiddlewareFactory):
    """Takes a call's account from its ``authorization`` header (see the module docstring);
    ``refused(method, reason)`` is told of each refusal (never the secret)."""

    def __init__(self, accounts: list[AccountRights], token: str | None, refused) -> None:
        super().__init__()
        self._accounts = {a.access_key: a for a in accounts}
        self._token = None if token is None else f"Bearer {token}".encode()
        self._refused = refused

    def start_call(self, info, headers):
        given = str((headers.get("authorization") or headers.get("Authorization")
                     or [""])[0])
        if self._token is not None and hmac.compare_digest(given.encode(), self._token):
            return Caller(ADMIN)
        account = self._account(given)
        if account is None:
            self._refused("refused a %s call: %s credentials", info.method.name,
                          "wrong" if given else "no")
            raise flight.FlightUnauthenticatedError(
                "missing or wrong credentials; allowed: 'Basic base64(accessKey:secretKey)' "
                "of an account of the server's ACL file, or the server's token")
        return Caller(account)

    def _account(self, given: str) -> AccountRights | None:
        scheme, _, encoded = given.partition(" ")
        if scheme != "Basic" or len(encoded) > 4096:
            return None
        try:
            name, sep, secret = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        account = self._accounts.get(name)
        if not sep or account is None:
            hmac.compare_digest(secret.encode(), b"-" * 16)  # (the same work either way)
            return None
        return account if hmac.compare_digest(secret.encode(),
                                              account.secret_key.encode()) else None


def caller_of(context) -> AccountRights:
    """The account of the call of ``context`` (:data:`ADMIN` without access control)."""
    caller = context.get_middleware("access")
    return ADMIN if caller is None else caller.account


def require(account: AccountRights, topics, right: str, what: str) -> None:
    """Refuse unless ``account`` may ``right`` every topic of ``topics`` (an iterable, or a
    function giving one: not called for an admin)."""
    if account.admin:
        return
    for topic in (topics() if callable(topics) else topics):
        if not account.may(topic, right):
            raise AccessDeniedError(
                f"{what}: account {account.access_key!r} may not {right} topic {topic!r}; "
                "allowed: the topics its ACL entry grants")


def require_admin(account: AccountRights, what: str) -> None:
    if not account.admin:
        raise AccessDeniedError(f"{what}: account {account.access_key!r} is no admin; "
                                "allowed: admin accounts (or the server's token)")


def require_replication(account: AccountRights, what: str) -> None:
    """Refuse unless ``account`` may copy the whole CommitLog (a replica set's follower)."""
    if not (account.admin or account.replicate):
        raise AccessDeniedError(f"{what}: account {account.access_key!r} has no replication "
                                "right; allowed: accounts with \"replicate\": true in the ACL "
                                "file, admins (or the server's token)")


def row_topics(table: pa.Table, topic: str | None) -> list[str]:
    """The topics the rows of a table name: ``topic=`` or the distinct ``topic`` values."""
    if topic is not None or "topic" not in table.column_names:
        return [] if topic is None else [topic]
    col = table.column("topic")
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return [t for t in pc.unique(col).to_pylist() if t is not None]


def own_sink_id(account: AccountRights, sink_id: str) -> str:
    """The store's sink id of an account's ``sink_id``: kept apart per account, so one
    account never stages into, commits or aborts another's sink."""
    return sink_id if account.admin else f"{account.access_key}/{sink_id}"


class OpenedTransactions:
    """Which account opened each transaction (``send_half``) on this server, bounded."""

    def __init__(self, limit: int = MAX_OPENED_TRANSACTIONS) -> None:
        self._limit = int(limit)
        self._by_id: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def opened(self, account: AccountRights, transaction_id: str) -> None:
        with self._lock:
            self._by_id[transaction_id] = account.access_key
            while len(self._by_id) > self._limit:
                self._by_id.popitem(last=False)

    def require_own(self, account: AccountRights, ids: list[str], what: str) -> None:
        if account.admin:
            return
        with self._lock:
            foreign = [t for t in ids if self._by_id.get(t) != account.access_key]
        if foreign:
            raise AccessDeniedError(
                f"{what}: account {account.access_key!r} did not open transaction "
                f"{foreign[0][:64]!r} here; allowed: the transactions it opened (admins: any)")
