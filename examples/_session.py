"""What the examples share: a quiet local Spark session (workers use this interpreter; no
WARN lines, no progress bars, as ``rmq demo``), and where a run's own messages start in a
store that earlier runs wrote to (so an example runs any number of times on one store)."""

import json
import os
import tempfile


def local_spark(app: str = "rmq-example"):
    from rmq_cli.session import local_spark as quiet_session

    workdir = os.path.join(tempfile.gettempdir(), "rmq-example-spark")
    os.makedirs(workdir, exist_ok=True)
    return quiet_session(app, workdir)


def offsets_now(store, topics) -> str:
    """``startingOffsets`` JSON of the queues of ``topics`` as they end now: a query started
    there reads only what comes after (this run's messages).  Topics that do not exist yet
    start at their earliest, as they would with ``earliest``."""
    known = set(store.topics())
    ends = {t: {str(q): store.max_offset(t, q) for q in store.queue_ids(t)}
            for t in topics if t in known}
    return json.dumps(ends) if ends else "earliest"


def newest_store_time_ms(store, topic: str) -> int | None:
    """The store time (epoch ms) of the newest message of ``topic`` (``None``: no message)."""
    if topic not in store.topics():
        return None
    newest = None
    for q in store.queue_ids(topic):
        end = store.max_offset(topic, q)
        if end > store.min_offset(topic, q):
            stamp = store.read_arrow(topic, q, end - 1, end, columns=["store_timestamp"])
            ms = int(stamp.column(0)[0].value // 1000)  # microseconds since the epoch
            newest = ms if newest is None else max(newest, ms)
    return newest
