"""The ``rmq`` source's options, parsed once into a frozen, typed :class:`RmqOptions`.

Spark hands a data source its options as case-insensitive ``str`` values.  :func:`parse_options`
checks every one of them at query start (unknown names, malformed values, options that do not
apply to batch, streaming or writing) and raises :class:`InvalidOptionError` naming the option,
the value given and what is allowed.  Nothing falls back silently.

Options: the Kafka source's spellings where the concept is the same (table: docs/options.md).

* exactly one of ``subscribe`` / ``subscribePattern`` (a Python regular expression matched
  against whole topic names; system topics never match) for ``view=messages``;
  ``view=transaction_checks`` takes only ``path``, ``view`` and ``checkRounds``;
  ``view=schedules`` (batch reads: the store's recurring schedules) only ``path`` and ``view``;
* ``startingOffsets`` JSON: queues it does not name start at earliest; ``endingOffsets``
  JSON: queues it does not name end at latest; a batch query may not start at ``latest``
  (-1) nor end at ``earliest`` (-2);
* ``endingOffsets``/``endingTimestamp`` are batch-only, ``maxOffsetsPerTrigger`` is
  streaming-only; ``startingOffsets`` and ``startingTimestamp`` (and the two ending ones)
  exclude each other;
* ``tags``: RocketMQ's expression, tags separated by ``||``; ``*`` (anywhere) means all;
* ``keys``: comma-separated message keys; only messages carrying one of them (in their
  ``keys`` column) are read: a batch read finds them through the store's key index when it
  has one (:mod:`rmq_source.key_lookup`), a streaming read checks every message;
* ``pushFilters`` (batch): ``auto`` (default: filters are pushed when Spark's
  ``spark.sql.python.filterPushdown.enabled`` is true), ``true`` (fail when it is not) or
  ``false`` (never push; :mod:`rmq_source.pushdown`);
* a writer without ``action`` is the exactly-once sink (:mod:`rmq_source.sink_writer`):
  options ``topic``, ``producerGroup``, ``guarantee`` (``exactly_once`` or
  ``at_least_once``), ``sinkId`` and ``sinkCommit`` (``index``, the default: each row is
  written once and the commit indexes it; ``copy``: the commit copies the rows, for a store
  Apache RocketMQ must open); ``action=end_transaction`` takes only ``path``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from store import InvalidConfigError, InvalidTopicError, is_remote, is_system_topic, validate_group

from .errors import InvalidOptionError
from .offset_spec import (  # noqa: F401 - re-exported: the options' public names
    EARLIEST,
    LATEST,
    OPTION_NAMES,
    REMOTE_OPTION_NAMES,
    OffsetSpec,
    _fail,
    _parse_topic,
    parse_offset_spec,
)

VIEWS = ("messages", "transaction_checks", "schedules")
ACTIONS = ("end_transaction",)
GUARANTEES = ("exactly_once", "at_least_once")
DEFAULT_PRODUCER_GROUP = "rmq-spark-sink"

#: options Spark itself may put into an option map (query name, checkpoint); ignored
SPARK_OPTIONS = frozenset({"checkpointlocation", "queryname"})
_WRITE_ONLY = frozenset({"action", "topic", "producergroup", "guarantee", "sinkid",
                         "sinkcommit"})
#: Values of option ``sinkCommit`` (see the module doc).
SINK_COMMITS = ("index", "copy")
_READ_ONLY = frozenset(k for k in OPTION_NAMES if k != "path" and k not in _WRITE_ONLY)
_BATCH_ONLY = frozenset({"endingoffsets", "endingtimestamp", "pushfilters"})
#: option pushFilters: with Spark's pushdown conf (auto), demand it (true), or never (false)
PUSH_FILTERS = ("auto", "true", "false")
_STREAM_ONLY = frozenset({"maxoffsetspertrigger"})


#: ``rmq://`` path -> how this process reaches it (the last query's settings win)
_REMOTE_ACCESS: dict[str, RemoteAccess] = {}


@dataclass(frozen=True)
class RemoteAccess:
    """How to reach the served store at ``path`` (an ``rmq://`` URL): its token, the TLS
    roots, the time bound of a call.  The token never appears in a ``repr`` (Spark plans,
    logs).

    Made on the driver with the options, and unpickled in every Python process Spark runs the
    source in (tasks, the streaming planner, commits): each time it records itself for its
    path (:func:`remote_access`), so that every open of that path there carries the token.
    """

    path: str
    token: str | None = field(default=None, repr=False)
    tls_root_certs: str | None = None
    timeout_s: float = 60.0
    #: the served members' URLs when ``path`` is a store group spanning hosts
    members: tuple[str, ...] = ()
    #: an account of the server's ACL file and its secret (instead of the token)
    account: str | None = None
    secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for path in (self.path, *self.members):
            _REMOTE_ACCESS[path] = self

    def __reduce__(self):
        return RemoteAccess, (self.path, self.token, self.tls_root_certs, self.timeout_s,
                              self.members, self.account, self.secret)

    def connect_options(self) -> dict:
        """Keyword arguments of :func:`store.connect`."""
        return {"token": self.token, "timeout_s": self.timeout_s,
                "tls_root_certs": self.tls_root_certs, "account": self.account,
                "secret": self.secret}


def remote_access(path: str) -> RemoteAccess | None:
    """How this process reaches the served store ``path`` (``None``: no query said)."""
    return _REMOTE_ACCESS.get(path)


@dataclass(frozen=True, slots=True)
class RmqOptions:
    """Every option of one ``rmq`` read or write, parsed and checked.

    ``raw``: the option map as given (lower-cased keys), without the token options.  ``streaming``: ``True``/``False``
    for stream/batch readers, ``None`` when not known yet (``schema()``) or for writers.
    ``columns``: the message columns a narrower user schema asks for (``None``: all).
    """

    path: str
    view: str = "messages"
    subscribe: tuple[str, ...] | None = None
    subscribe_pattern: str | None = None
    tags: tuple[str, ...] | None = None
    #: option ``keys``: read only messages carrying one of these keys (``None``: every one)
    keys: tuple[str, ...] | None = None
    starting_offsets: OffsetSpec = OffsetSpec(EARLIEST)
    ending_offsets: OffsetSpec = OffsetSpec(LATEST)
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    deliver_due: bool = True
    verify_crc: bool = False
    action: str | None = None
    topic: str | None = None
    producer_group: str = DEFAULT_PRODUCER_GROUP
    guarantee: str = "exactly_once"
    sink_id: str | None = None
    sink_commit: str = "index"
    streaming: bool | None = None
    columns: tuple[str, ...] | None = None
    push_filters: str = "auto"
    raw: Mapping[str, str] = field(default_factory=dict)
    #: how to reach the store when ``path`` is an ``rmq://`` URL (``None`` for a directory)
    remote: RemoteAccess | None = None

    def matches_topic(self, topic: str) -> bool:
        """Whether ``topic`` is subscribed (system topics never are)."""
        if is_system_topic(topic):
            return False
        if self.subscribe is not None:
            return topic in self.subscribe
        if self.subscribe_pattern is not None:
            return re.fullmatch(self.subscribe_pattern, topic) is not None
        return False

    def select_topics(self, topics: Iterable[str]) -> list[str]:
        """The subscribed topics among ``topics``, sorted."""
        return sorted(t for t in set(topics) if self.matches_topic(t))


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "false"):
        return v == "true"
    raise _fail(name, value, "not a boolean", "true or false")


def _parse_int(name: str, value: str, minimum: int, allowed: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise _fail(name, value, "not an integer", allowed) from None
    if n < minimum:
        raise _fail(name, value, f"below {minimum}", allowed)
    return n


def parse_tags(value: str) -> tuple[str, ...] | None:
    """A RocketMQ tag expression (``a || b``) as a tuple of tags; ``None`` means every tag."""
    text = value.strip()
    if text in ("", "*"):
        return None
    tags: list[str] = []
    for part in text.split("||"):
        tag = part.strip()
        if tag == "*":
            return None  # RocketMQ: '*' anywhere subscribes to everything
        if tag and tag not in tags:
            tags.append(tag)
    if not tags:
        raise _fail("tags", value, "names no tag", "'*' or tags separated by '||', e.g. 'a || b'")
    return tuple(tags)


KEYS_ALLOWED = ("comma-separated message keys, each non-empty, printable and without spaces "
                "(RocketMQ stores a message's keys space-separated), e.g. 'order-1,order-2'")


def parse_keys(value: str) -> tuple[str, ...]:
    """Option ``keys``: comma-separated message keys, each once, in the order given."""
    keys: list[str] = []
    for part in value.split(","):
        key = part.strip()
        if not key or " " in key or not key.isprintable():
            why = "names an empty key" if not key else f"key {key!r} is not a message key"
            raise _fail("keys", value, why, KEYS_ALLOWED)
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def _parse_write(raw: Mapping[str, str], path: str, streaming: bool | None) -> RmqOptions:
    """Options of a writer: the sink's, or ``action=end_transaction`` with ``path`` only."""
    sink_names = "path, topic, producerGroup, guarantee, sinkId, sinkCommit"
    for key in raw:
        if key in _READ_ONLY:
            raise _fail(key, raw[key], "applies to reading only",
                        f"{sink_names} (or path and action=end_transaction)")
    action = raw.get("action")
    if action is not None:
        if action.strip().lower() not in ACTIONS:
            raise _fail("action", action, "unknown action",
                        f"{', '.join(ACTIONS)}, or no action to write messages")
        for key in sorted(raw.keys() & {"topic", "producergroup", "guarantee", "sinkid",
                                        "sinkcommit"}):
            raise _fail(key, raw[key], "applies to writing messages, not to "
                        "action=end_transaction", "path and action")
        return RmqOptions(path=path, action=action.strip().lower(), streaming=streaming,
                          raw=raw)
    topic = None
    if "topic" in raw:
        topic = _parse_topic("topic", raw["topic"], raw["topic"].strip())
    group = raw.get("producergroup", DEFAULT_PRODUCER_GROUP).strip()
    try:
        validate_group(group)
    except InvalidTopicError as exc:
        raise _fail("producerGroup", raw.get("producergroup"), str(exc),
                    "a producer group name") from None
    guarantee = raw.get("guarantee", "exactly_once").strip().lower()
    if guarantee not in GUARANTEES:
        raise _fail("guarantee", raw["guarantee"], "unknown delivery guarantee",
                    ", ".join(GUARANTEES))
    sink_id = raw.get("sinkid")
    if sink_id is not None and not sink_id.strip():
        raise _fail("sinkId", sink_id, "is empty", "a non-empty string naming the sink")
    sink_commit = raw.get("sinkcommit", "index").strip().lower()
    if sink_commit not in SINK_COMMITS:
        raise _fail("sinkCommit", raw["sinkcommit"], "unknown way to commit",
                    ", ".join(SINK_COMMITS))
    return RmqOptions(path=path, topic=topic, producer_group=group, guarantee=guarantee,
                      sink_id=sink_id.strip() if sink_id else None, sink_commit=sink_commit,
                      streaming=streaming, raw=raw)


def parse_options(options: Mapping[str, str], *, streaming: bool | None,
                  write: bool = False) -> RmqOptions:
    """Check and parse a data source option map (keys in any case, values ``str``).

    Parameters
    ----------
    options : mapping
        ``DataSource.options``.
    streaming : bool or None
        ``True`` for ``readStream``, ``False`` for ``read``; ``None`` skips the checks that
        depend on the mode (used by ``schema()``).
    write : bool
        Parse for a writer (``path`` and ``action``) instead of a reader.

    Raises
    ------
    InvalidOptionError
        For an unknown option, a bad value, a missing required option or an option that does
        not apply to this mode.
    """
    raw = {str(k).lower(): "" if v is None else str(v) for k, v in options.items()}
    for key, value in raw.items():
        if key not in OPTION_NAMES and key not in SPARK_OPTIONS:
            raise InvalidOptionError(
                f"unknown option {key}={value!r}; allowed: {', '.join(OPTION_NAMES.values())}")

    path = raw.get("path", "").strip()
    if not path:
        raise InvalidOptionError(
            "option path is missing; allowed: the store directory, given with .load(path) "
            "or .option('path', ...)")
    remote = _parse_remote(raw, path)
    raw = {k: v for k, v in raw.items() if k not in REMOTE_OPTION_NAMES}

    if write:
        return replace(_parse_write(raw, path, streaming), remote=remote)
    return replace(_parse_read(raw, path, streaming), remote=remote)


def _parse_remote(raw: Mapping[str, str], path: str) -> RemoteAccess | None:
    """The options of a served store (``rmq://`` path, or a store group with served members);
    refused for a plain directory."""
    given = sorted(REMOTE_OPTION_NAMES & raw.keys())
    members = _served_members(path)
    if not is_remote(path) and not members:
        for key in given:
            raise _fail(key, "***" if key in ("token", "secret") else raw[key],
                        "applies to a served store only",
                        "an rmq://HOST:PORT or rmqs://HOST:PORT path, or leave it out")
        return None
    from store import connect, read_token

    try:
        token = read_token(raw.get("token"), raw.get("tokenfile"))
        secret = read_token(raw.get("secret"), raw.get("secretfile"))
        account = raw.get("account")
        for url in members or (path,):  # checks the URL and the credentials; nothing is sent
            connect(url, token=token, account=account, secret=secret).close()
    except InvalidConfigError as exc:
        raise InvalidOptionError(f"option path={path!r}, its token or its account: {exc}"
                                 ) from None
    roots = raw.get("tlsrootcerts")
    timeout_s = 60.0
    if "timeoutms" in raw:
        timeout_s = _parse_int("timeoutms", raw["timeoutms"], 1,
                               "an integer >= 1 (milliseconds a call to the server may take)"
                               ) / 1000
    return RemoteAccess(path, token=token, tls_root_certs=roots, timeout_s=timeout_s,
                        members=members, account=account, secret=secret)


def _served_members(path: str) -> tuple[str, ...]:
    """The ``rmq://`` members of the store group at ``path`` (none for anything else)."""
    from store import InvalidGroupError, StoreGroup, is_store_group

    if is_remote(path) or not is_store_group(path):
        return ()
    try:
        return tuple(p for _, p in StoreGroup.members(path) if is_remote(p))
    except InvalidGroupError:
        return ()  # the opening reports it


def _parse_read(raw: Mapping[str, str], path: str, streaming: bool | None) -> RmqOptions:
    """Options of a reader (see :func:`parse_options`); each group checked in turn, so the
    first wrong option is the one reported."""
    view = _checked_view(raw, streaming)
    subscribe, subscribe_pattern = _subscription(raw, view)
    tags = parse_tags(raw["tags"]) if "tags" in raw else None
    keys = parse_keys(raw["keys"]) if "keys" in raw else None
    starting, ending = _offset_range(raw, streaming)
    starting_ts, ending_ts = _timestamps(raw)
    _check_offsets(raw, view, streaming is False, starting, ending, subscribe,
                   subscribe_pattern)

    max_per_trigger = None
    if "maxoffsetspertrigger" in raw:
        max_per_trigger = _parse_int("maxoffsetspertrigger", raw["maxoffsetspertrigger"], 1,
                                     "an integer >= 1 (messages per micro-batch)")
    push_filters = raw.get("pushfilters", "auto").strip().lower()
    if push_filters not in PUSH_FILTERS:
        raise _fail("pushfilters", raw["pushfilters"], "unknown value", ", ".join(PUSH_FILTERS))
    flags = {name: _parse_bool(name, raw[name]) if name in raw else default for name, default
             in (("failondataloss", True), ("deliverdue", True), ("verifycrc", False))}
    return RmqOptions(
        path=path, view=view, subscribe=subscribe, subscribe_pattern=subscribe_pattern, tags=tags,
        keys=keys, starting_offsets=starting, ending_offsets=ending, starting_timestamp_ms=starting_ts,
        ending_timestamp_ms=ending_ts, max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=flags["failondataloss"], deliver_due=flags["deliverdue"],
        verify_crc=flags["verifycrc"], push_filters=push_filters, streaming=streaming, raw=raw)


def _checked_view(raw: Mapping[str, str], streaming: bool | None) -> str:
    """The view; an option that does not apply to it, to this kind of query or to reading
    is refused."""
    for key in sorted(_WRITE_ONLY & raw.keys()):
        raise _fail(key, raw[key], "applies to writing only",
                    "leave it out of spark.read / spark.readStream")

    view = raw.get("view", "messages").strip().lower()
    if view not in VIEWS:
        raise _fail("view", raw["view"], "unknown view", ", ".join(VIEWS))

    if streaming is not None:
        wrong = _BATCH_ONLY if streaming else _STREAM_ONLY
        for key in sorted(wrong & raw.keys()):
            mode = "batch queries (spark.read)" if streaming else "streaming queries"
            raise _fail(key, raw[key], f"applies to {mode} only",
                        "leave it out of this query")
    if view == "schedules":
        if streaming:
            raise _fail("view", raw["view"], "is a batch view", "spark.read with this view")
        for key in sorted(raw.keys() - {"path", "view"} - SPARK_OPTIONS):
            raise _fail(key, raw[key], "does not apply to view=schedules",
                        "path and view only")
    if view == "transaction_checks" and streaming is False:
        raise _fail("view", raw["view"], "is a streaming view", "spark.readStream with this view")
    if view == "transaction_checks":
        for key in sorted(raw.keys() - {"path", "view", "checkrounds"} - SPARK_OPTIONS):
            raise _fail(key, raw[key], "applies to view=messages only",
                        "path, view and checkRounds for view=transaction_checks")
    elif "checkrounds" in raw:
        raise _fail("checkrounds", raw["checkrounds"], "applies to view=transaction_checks only",
                    "leave it out of view=messages")
    return view


def _subscription(raw: Mapping[str, str], view: str
                  ) -> tuple[tuple[str, ...] | None, str | None]:
    """``(subscribe, subscribePattern)``: exactly one for view=messages, at most one else."""
    subscribe = subscribe_pattern = None
    if "subscribe" in raw and "subscribepattern" in raw:
        raise InvalidOptionError(
            f"options subscribe={raw['subscribe']!r} and subscribePattern="
            f"{raw['subscribepattern']!r} are both given; allowed: exactly one of them")
    if "subscribe" in raw:
        names = [t.strip() for t in raw["subscribe"].split(",") if t.strip()]
        if not names:
            raise _fail("subscribe", raw["subscribe"], "names no topic",
                        "comma-separated topic names")
        subscribe = tuple(dict.fromkeys(_parse_topic("subscribe", raw["subscribe"], t)
                                        for t in names))
    elif "subscribepattern" in raw:
        subscribe_pattern = raw["subscribepattern"]
        try:
            re.compile(subscribe_pattern or "(")  # an empty pattern is refused as well
        except re.error as exc:
            why = f"not a regular expression ({exc})" if subscribe_pattern else "is empty"
            raise _fail("subscribepattern", subscribe_pattern, why,
                        "a Python regular expression matched against whole topic names") from None
    elif view == "messages":
        raise InvalidOptionError(
            "neither subscribe nor subscribePattern is given; allowed: exactly one of them, "
            "e.g. .option('subscribe', 'orders,payments')")
    return subscribe, subscribe_pattern


def _offset_range(raw: Mapping[str, str], streaming: bool | None
                  ) -> tuple[OffsetSpec, OffsetSpec]:
    """``(startingOffsets, endingOffsets)`` with their defaults."""
    batch = streaming is False
    starting_default = OffsetSpec(LATEST if streaming else EARLIEST)
    starting = starting_default
    if "startingoffsets" in raw:
        starting = parse_offset_spec("startingoffsets", raw["startingoffsets"],
                                     allow_earliest=True, allow_latest=not batch)
    ending = OffsetSpec(LATEST)
    if "endingoffsets" in raw:
        ending = parse_offset_spec("endingoffsets", raw["endingoffsets"],
                                   allow_earliest=False, allow_latest=True)
    return starting, ending


def _timestamps(raw: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``(startingTimestamp, endingTimestamp)``, each instead of its side's offsets."""
    ts_allowed = "epoch milliseconds (an integer >= 0)"
    starting_ts = ending_ts = None
    for side in ("starting", "ending"):
        offsets_key, ts_key = f"{side}offsets", f"{side}timestamp"
        if ts_key not in raw:
            continue
        value = _parse_int(ts_key, raw[ts_key], 0, ts_allowed)
        if offsets_key in raw:
            raise InvalidOptionError(
                f"options {side}Offsets={raw[offsets_key]!r} and {side}Timestamp="
                f"{raw[ts_key]!r} are both given; allowed: at most one of them")
        if side == "starting":
            starting_ts = value
        else:
            ending_ts = value
    if starting_ts is not None and ending_ts is not None and ending_ts < starting_ts:
        raise _fail("endingtimestamp", raw["endingtimestamp"],
                    f"before startingTimestamp={starting_ts}", f"a time >= {starting_ts}")
    return starting_ts, ending_ts


def _check_offsets(raw: Mapping[str, str], view: str, batch: bool, starting: OffsetSpec,
                   ending: OffsetSpec, subscribe, subscribe_pattern) -> None:
    """Offsets name subscribed topics only; a batch query's end is not before its start."""
    for spec_name, spec in (("startingoffsets", starting), ("endingoffsets", ending)):
        for topic in sorted(spec.topics()):
            matched = (topic in subscribe if subscribe is not None
                       else subscribe_pattern is not None
                       and re.fullmatch(subscribe_pattern, topic) is not None)
            if view == "messages" and not matched:
                raise _fail(spec_name, raw[spec_name], f"topic {topic!r} is not subscribed",
                            "offsets for subscribed topics only")
    if batch:
        ends = dict(ending.per_store())
        for store, start_spec in starting.per_store():
            end_spec = ends.get(store, OffsetSpec(LATEST))
            for topic, queue_id in start_spec.named():
                end = end_spec.get(topic, queue_id)
                start = start_spec.get(topic, queue_id)
                if end >= 0 and start >= 0 and end < start:
                    raise _fail("endingoffsets", raw["endingoffsets"],
                                f"offset {end} of {topic}/{queue_id} is before its starting "
                                f"offset {start}", f"an offset >= {start}")
