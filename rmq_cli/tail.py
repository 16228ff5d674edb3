"""``rmq tail``: follow a topic as messages become visible."""

from __future__ import annotations

import base64
import datetime as _dt
import json
from typing import Callable


def parse_tag_expression(expr: str | None) -> set[str] | None:
    """RocketMQ's tag expression: ``a || b``; ``*`` or empty means every tag."""
    if expr is None or expr.strip() in ("", "*"):
        return None
    return {t.strip() for t in expr.split("||") if t.strip()}


def _fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _text_body(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(body).decode("ascii")


def follow_topic(store, topic: str, *, start: str = "latest", tags: str | None = None,
                 follow: bool = True, deliver_due: bool = True, fmt: str = "text",
                 max_messages: int | None = None, poll_s: float = 0.2,
                 echo: Callable[[str], None] = print) -> int:
    """Print messages of ``topic`` in arrival order per queue; return how many were printed.

    ``store`` is one store (a directory's or a served one, ``store.connect``) or a
    :class:`store.StoreGroup`: every store's queues are followed, and each printed message
    names its store.  Without ``follow`` it stops once every queue is read to its end, and a
    topic that is nowhere is an error (``UnknownTopicError``; ``ValueError`` for a group).
    """
    from store import StoreGroup, UnknownTopicError

    wanted = parse_tag_expression(tags)
    options = {"start": start, "poll_interval_s": poll_s, "deliver_due": deliver_due,
               "stop": None if follow else (lambda: True)}
    if isinstance(store, StoreGroup):
        if not follow and not any(_has_topic(s, topic, UnknownTopicError)
                                  for _, s in store.stores()):
            raise ValueError(f"topic {topic!r} is in none of the group's stores")
        messages = store.follow(topic, **options)
    else:
        if not follow:
            store.queue_ids(topic)  # UnknownTopicError, naming the topics there are
        messages = ((None, view) for view in store.follow(topic, **options))
    printed = 0
    for name, view in messages:
        if wanted is not None and view.tags not in wanted:
            continue
        echo(_render(view, fmt, name))
        printed += 1
        if max_messages is not None and printed >= max_messages:
            break
    return printed


def _has_topic(store, topic: str, missing: type) -> bool:
    try:
        store.queue_ids(topic)
    except missing:
        return False
    return True


def _render(v, fmt: str, store: str | None = None) -> str:
    where = {} if store is None else {"store": store}
    if fmt == "json":
        return json.dumps({**where,
            "topic": v.topic, "queue_id": v.queue_id, "queue_offset": v.queue_offset,
            "msg_id": v.msg_id, "tags": v.tags, "keys": list(v.keys), "body": _text_body(v.body),
            "properties": dict(v.properties), "born_timestamp_ms": v.born_timestamp_ms,
            "store_timestamp_ms": v.store_timestamp_ms,
            "deliver_timestamp_ms": v.deliver_timestamp_ms, "transaction_id": v.transaction_id,
        }, sort_keys=True)
    late = ""
    if v.deliver_timestamp_ms is not None:
        lateness = v.store_timestamp_ms - v.deliver_timestamp_ms
        late = f" due={_fmt_ms(v.deliver_timestamp_ms)} (+{lateness} ms)"
    tag = f" [{v.tags}]" if v.tags else ""
    prefix = "" if store is None else f"{store}:"
    return (f"{_fmt_ms(v.store_timestamp_ms)} {prefix}{v.topic}/{v.queue_id}@{v.queue_offset}{tag}"
            f"{late} {_text_body(v.body)}")
