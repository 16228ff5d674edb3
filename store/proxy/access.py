"""Access control of the gRPC endpoint: RocketMQ's AccessKey / SecretKey accounts.

Without an ACL file every client is served (``rmq serve --grpc`` on a loopback address, or
with ``--insecure``).  With ``--acl FILE`` every call must carry the ``authorization``
header RocketMQ 5 clients send when given credentials::

    MQv2-HMAC-SHA1 Credential=<AccessKey>, SignedHeaders=x-mq-date-time, Signature=<hex>

where the signature is HMAC-SHA1 of the ``x-mq-date-time`` header with the account's
SecretKey.  A missing or wrong signature is ``UNAUTHORIZED``, and so is a signature whose
``x-mq-date-time`` (``YYYYMMDDTHHMMSSZ``, UTC) is further than the signature window from
the server's clock, either way (``signatureWindowSeconds``, default 900: 15 minutes, as
common request-signing schemes): a signature seen on the wire is no good for long.  A topic
or group the account has no right to is ``FORBIDDEN``.  The file is JSON, with the names of
RocketMQ's ``plain_acl.yml``::

    {"signatureWindowSeconds": 900,
     "accounts": [
      {"accessKey": "orders-service", "secretKey": "...",
       "defaultTopicPerm": "DENY", "topicPerms": ["orders=PUB", "payments=PUB|SUB"],
       "defaultGroupPerm": "SUB", "groupPerms": ["billing=SUB"], "admin": false}
    ]}

A permission is ``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB``; ``admin`` grants everything.
Defaults: ``defaultTopicPerm`` ``DENY``, ``defaultGroupPerm`` ``SUB``.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from dataclasses import dataclass

from ..base.errors import InvalidConfigError
from ..files.accounts import AccountRights, read_accounts, read_signature_window
from .convert import Code, Refused


@dataclass(frozen=True)
class Account(AccountRights):
    """An account of the ACL file (:mod:`store.files.accounts`), refusing as gRPC does."""

    def check_topic(self, topic: str, right: str) -> None:
        """``FORBIDDEN`` unless the account may ``right`` (PUB or SUB) ``topic``."""
        if self.admin or right in self.topics.get(topic, self.default_topic):
            return
        raise Refused(Code.FORBIDDEN, f"access key {self.access_key!r} may not {right} topic "
                                      f"{topic!r}")

    def check_group(self, group: str) -> None:
        if self.admin or "SUB" in self.groups.get(group, self.default_group):
            return
        raise Refused(Code.FORBIDDEN, f"access key {self.access_key!r} may not consume as "
                                      f"group {group!r}")


#: The account of every call when no ACL is configured.
OPEN = Account("", "", True, frozenset(), {}, frozenset(), {})


#: Checked signatures remembered (:meth:`AccessControl.account`).
VERIFIED_SIGNATURES = 4096
#: How far a signature's ``x-mq-date-time`` may be from the server's clock (seconds).
SIGNATURE_WINDOW_S = 900


def signed_at_ms(date: str) -> int | None:
    """Epoch ms of an ``x-mq-date-time`` value (``YYYYMMDDTHHMMSSZ``, UTC), ``None`` if it
    is not one."""
    try:
        return calendar.timegm(time.strptime(date, "%Y%m%dT%H%M%SZ")) * 1000
    except (ValueError, OverflowError):
        return None


class AccessControl:
    """The accounts of an ACL file; :meth:`account` checks a call's signature."""

    def __init__(self, accounts: list[Account], *,
                 signature_window_s: int = SIGNATURE_WINDOW_S) -> None:
        if signature_window_s < 1:
            raise InvalidConfigError(f"signatureWindowSeconds={signature_window_s}; allowed: "
                                     "1 or more")
        self.accounts = {a.access_key: a for a in accounts}
        self.window_ms = signature_window_s * 1000
        self._verified: dict[tuple[str, str], tuple[Account, int | None]] = {}

    @classmethod
    def load(cls, path: str) -> AccessControl:
        # the file's format: store.files.accounts (the Flight face reads it too)
        return cls(read_accounts(path, Account),
                   signature_window_s=read_signature_window(path, SIGNATURE_WINDOW_S))

    def account(self, metadata: dict[str, str], now_ms: int | None = None) -> Account:
        """The account that signed a call (its headers) within the signature window of
        ``now_ms`` (the clock's time when ``None``); ``UNAUTHORIZED`` otherwise.

        A client signs every call of a second with the same header: a signature checked
        once is remembered (:data:`VERIFIED_SIGNATURES` of them, forgotten all at once past
        that), and only its window is checked again.  What is remembered is a pure function
        of the header, so the answer is the same as checking it again."""
        header = metadata.get("authorization", "")
        date = metadata.get("x-mq-date-time", "")
        verified = self._verified.get((header, date))
        if verified is None:
            verified = self._verify(header, date)
            if len(self._verified) >= VERIFIED_SIGNATURES:
                self._verified.clear()
            self._verified[(header, date)] = verified
        account, at = verified
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if at is None or abs(now - at) > self.window_ms:
            raise Refused(Code.UNAUTHORIZED,
                          f"the signature's x-mq-date-time {date[:40]!r} is not within "
                          f"{self.window_ms // 1000} s of the server's clock (UTC, "
                          "YYYYMMDDTHHMMSSZ); allowed: a fresh signature")
        return account

    def _verify(self, header: str, date: str) -> tuple[Account, int | None]:
        """The account whose secret signed ``date`` in ``header``, and the signing time."""
        scheme, _, rest = header.partition(" ")
        fields = {}
        for part in rest.split(","):
            name, _, value = part.strip().partition("=")
            fields[name] = value
        account = self.accounts.get(fields.get("Credential", ""))
        if scheme != "MQv2-HMAC-SHA1" or account is None or not date:
            raise Refused(Code.UNAUTHORIZED, "the call is not signed by a known access key")
        expected = hmac.new(account.secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, fields.get("Signature", "").lower()):
            raise Refused(Code.UNAUTHORIZED,
                          f"the signature of access key {account.access_key!r} does not match")
        return account, signed_at_ms(date)
