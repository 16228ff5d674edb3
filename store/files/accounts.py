"""The accounts file (``rmq serve --acl FILE``): who may reach a served store, and what
each account may do.  Read by both network faces (Arrow Flight ``--listen`` and the
RocketMQ 5 gRPC endpoint ``--grpc``).

The file is JSON, with the names of RocketMQ's ``plain_acl.yml``::

    {"accounts": [
      {"accessKey": "orders-service", "secretKey": "...",
       "defaultTopicPerm": "DENY", "topicPerms": ["orders=PUB", "payments=PUB|SUB"],
       "defaultGroupPerm": "SUB", "groupPerms": ["billing=SUB"], "admin": false,
       "replicate": false}
    ]}

A permission is ``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB``; ``admin`` grants everything;
``replicate`` lets the account copy the whole CommitLog (every topic's bytes): a follower of a
replica set (``rmq serve --replica-set``) connects to its leader with such an account.
Defaults: ``defaultTopicPerm`` ``DENY``, ``defaultGroupPerm`` ``SUB``.  A secret key has 6
characters at least; access keys are unique.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..base.errors import InvalidConfigError

_PERMS = {"DENY": frozenset(), "PUB": frozenset({"PUB"}), "SUB": frozenset({"SUB"}),
          "PUB|SUB": frozenset({"PUB", "SUB"}), "SUB|PUB": frozenset({"PUB", "SUB"})}


def _perm(value: object, where: str) -> frozenset[str]:
    if not isinstance(value, str) or value.replace(" ", "").upper() not in _PERMS:
        raise InvalidConfigError(f"{where}: permission {value!r}; allowed: DENY, PUB, SUB, "
                                 "PUB|SUB")
    return _PERMS[value.replace(" ", "").upper()]


def _perm_table(items: object, where: str) -> dict[str, frozenset[str]]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise InvalidConfigError(f"{where}: expected a list of 'name=PERM' strings")
    out = {}
    for item in items:
        name, sep, perm = str(item).partition("=")
        if not sep or not name.strip():
            raise InvalidConfigError(f"{where}: {item!r}; allowed: 'name=PERM'")
        out[name.strip()] = _perm(perm.strip(), where)
    return out


@dataclass(frozen=True)
class AccountRights:
    """One account of the file: its keys and rights."""

    access_key: str
    secret_key: str
    admin: bool
    default_topic: frozenset[str]
    topics: dict[str, frozenset[str]]
    default_group: frozenset[str]
    groups: dict[str, frozenset[str]]
    #: may copy the whole CommitLog (a replica set's follower; admins may too)
    replicate: bool = False

    def may(self, topic: str, right: str) -> bool:
        """Whether the account may ``right`` (``PUB`` or ``SUB``) ``topic``."""
        return self.admin or right in self.topics.get(topic, self.default_topic)

    def may_consume(self, group: str) -> bool:
        """Whether the account may consume as ``group``."""
        return self.admin or "SUB" in self.groups.get(group, self.default_group)


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidConfigError(f"{where}: {value!r}; allowed: true or false")
    return value


def _read(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise InvalidConfigError(f"cannot read the ACL file {path}: {exc}") from None
    except ValueError as exc:
        raise InvalidConfigError(f"the ACL file {path} is not JSON: {exc}") from None


def read_signature_window(path: str, default: int) -> int:
    """The file's ``signatureWindowSeconds`` (how far a signed call's date may be from the
    server's clock; the gRPC face's), ``default`` when it has none."""
    data = _read(path)
    window = data.get("signatureWindowSeconds", default) if isinstance(data, dict) else default
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise InvalidConfigError(f"the ACL file {path}: signatureWindowSeconds={window!r}; "
                                 "allowed: an int of 1 or more")
    return window


def read_accounts(path: str, make=AccountRights) -> list:
    """The accounts of the file at ``path``, each built by ``make`` (with the fields of
    :class:`AccountRights`); :class:`InvalidConfigError` says what is wrong."""
    data = _read(path)
    items = data.get("accounts") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise InvalidConfigError(f"the ACL file {path} has no \"accounts\" list")
    accounts, seen = [], set()
    for i, a in enumerate(items):
        where = f"{path}: accounts[{i}]"
        if not isinstance(a, dict):
            raise InvalidConfigError(f"{where}: expected an object")
        ak, sk = a.get("accessKey"), a.get("secretKey")
        if not isinstance(ak, str) or not ak or not isinstance(sk, str) or len(sk) < 6:
            raise InvalidConfigError(f"{where}: accessKey (non-empty) and secretKey (6 "
                                     "characters at least) are required")
        if ak in seen:
            raise InvalidConfigError(f"{where}: accessKey {ak!r} appears twice; allowed: once")
        seen.add(ak)
        accounts.append(make(
            ak, sk, bool(a.get("admin", False)),
            _perm(a.get("defaultTopicPerm", "DENY"), where),
            _perm_table(a.get("topicPerms"), where),
            _perm(a.get("defaultGroupPerm", "SUB"), where),
            _perm_table(a.get("groupPerms"), where),
            replicate=_flag(a.get("replicate", False), f"{where}: replicate")))
    return accounts
