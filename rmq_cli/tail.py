"""``rmq tail``: follow a topic as messages become visible."""

from __future__ import annotations

import base64
import datetime as _dt
import json
import time
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

    ``store`` is one store, or a list of ``(store name, store)`` (a store group's members):
    every store's queues are followed, and each printed message names its store.
    """
    wanted = parse_tag_expression(tags)
    stores = store if isinstance(store, list) else [(None, store)]
    positions: dict[tuple, int] = {}
    printed = 0
    first = [True]  # queues found at the start begin at ``start``; later ones at earliest

    def refresh_queues() -> None:
        from_latest = start != "earliest" and first[0]
        first[0] = False
        for name, member in stores:
            try:
                ids = member.queue_ids(topic)
            except Exception:
                if not follow and len(stores) == 1:
                    raise
                continue  # the topic may appear later (or only in other stores)
            for q in ids:
                if (name, q) not in positions:
                    positions[(name, q)] = (member.max_offset(topic, q) if from_latest
                                            else member.min_offset(topic, q))

    refresh_queues()
    if not positions and not follow and len(stores) > 1:
        raise ValueError(f"topic {topic!r} is in none of the group's stores")
    members = dict(stores)
    while True:
        if deliver_due:
            for _, member in stores:
                member.deliver_due()
        refresh_queues()
        progressed = False
        for name, q in sorted(positions, key=lambda k: (k[0] or "", k[1])):
            while True:
                views = members[name].pull(topic, q, positions[(name, q)], max_messages=256)
                if not views:
                    break
                positions[(name, q)] += len(views)
                progressed = True
                for v in views:
                    if wanted is not None and v.tags not in wanted:
                        continue
                    echo(_render(v, fmt, name))
                    printed += 1
                    if max_messages is not None and printed >= max_messages:
                        return printed
        if not follow and not progressed:
            return printed
        if not progressed:
            time.sleep(poll_s)


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
