"""The Spark sink against a model (hypothesis): any mix of its columns and Spark types,
written by ``df.write.format("rmq")`` and read back by ``spark.read.format("rmq")``.

Rows without a delay (no delay column, a null, delay level 0 or a ``deliver_at`` in the
past) must come back exactly once with every field as written; rows with a real delay must
not be visible yet (never early) and must be pending in the store.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import MessageStore
from store.formats.message import sharding_queue

pytestmark = pytest.mark.spark

_ALPHABET = st.sampled_from(list("abcXYZ019_-üé✓"))
_WORD = st.text(_ALPHABET, min_size=1, max_size=6)
_INT_TYPES = ("tinyint", "smallint", "int", "bigint")


@st.composite
def frames(draw):
    """``(ddl, rows, expected)``: a schema, its rows, and what each row should read back as
    (``None``: delayed, must not be visible)."""
    n = draw(st.integers(1, 12))
    columns = {"topic": "string",
               "body": draw(st.sampled_from(["binary", "string"]))}
    optional = draw(st.sets(st.sampled_from(
        ["tags", "keys", "properties", "delay", "queue"]), max_size=5))
    if "tags" in optional:
        columns["tags"] = "string"
    if "keys" in optional:
        columns["keys"] = draw(st.sampled_from(["string", "array<string>"]))
    if "properties" in optional:
        columns["properties"] = "map<string,string>"
    delay_col = None
    if "delay" in optional:
        delay_col = draw(st.sampled_from(["delay_ms", "delay_level", "deliver_at"]))
        if delay_col == "deliver_at":
            columns[delay_col] = draw(st.sampled_from(["timestamp", "bigint"]))
        elif delay_col == "delay_ms":
            columns[delay_col] = draw(st.sampled_from(["int", "bigint"]))
        else:
            columns[delay_col] = draw(st.sampled_from(_INT_TYPES))
    queue_col = None
    if "queue" in optional:
        queue_col = draw(st.sampled_from(["queue_id", "sharding_key"]))
        columns[queue_col] = "int" if queue_col == "queue_id" else "string"
    rows, expected = [], []
    past = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    for i in range(n):
        topic = draw(st.sampled_from(["orders", "payments"]))
        text = f"{i}-{draw(_WORD)}"
        row = {"topic": topic, "body": text if columns["body"] == "string" else text.encode()}
        exp = {"topic": topic, "body": text.encode(), "tags": None, "keys": [],
               "properties": {}, "queue": None}
        if "tags" in columns:
            row["tags"] = exp["tags"] = draw(st.none() | _WORD)
        if "keys" in columns:
            keys = draw(st.lists(_WORD, max_size=3))
            row["keys"] = " ".join(keys) if columns["keys"] == "string" else keys
            exp["keys"] = keys
        if "properties" in columns:
            props = draw(st.dictionaries(st.text(_ALPHABET, min_size=2, max_size=5).map(
                lambda s: "p" + s), _WORD, max_size=3))
            row["properties"] = exp["properties"] = props
        if delay_col is not None:
            delayed = draw(st.booleans())
            if delay_col == "delay_ms":
                row[delay_col] = draw(st.integers(60_000, 3_600_000)) if delayed else \
                    draw(st.sampled_from([None, 0]))
            elif delay_col == "delay_level":
                row[delay_col] = draw(st.integers(3, 18)) if delayed else \
                    draw(st.sampled_from([None, 0]))
            else:
                when = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)) if delayed \
                    else draw(st.sampled_from([None, past]))
                if when is not None and columns[delay_col] == "bigint":
                    when = int(when.timestamp() * 1000)
                row[delay_col] = when
            if delayed:
                exp = None
        if queue_col is not None and exp is not None:
            if queue_col == "queue_id":
                q = draw(st.none() | st.integers(0, 3))
                row["queue_id"] = q
                exp["queue"] = q
            else:
                key = draw(st.none() | _WORD)
                row["sharding_key"] = key
                exp["queue"] = None if key is None else sharding_queue(key, 4)
        elif queue_col is not None:
            row[queue_col] = None
        rows.append(row)
        expected.append(exp)
    ddl = ", ".join(f"{name} {type_}" for name, type_ in columns.items())
    return ddl, rows, expected


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames())
def test_sink_round_trips_any_columns(spark, fresh_dir, frame):
    ddl, rows, expected = frame
    path = str(fresh_dir("roundtrip") / "store")
    df = spark.createDataFrame([tuple(r.get(c.split()[0]) for c in ddl.split(", "))
                                for r in rows], ddl)
    df.write.format("rmq").mode("append").save(path)
    got = (spark.read.format("rmq").option("subscribePattern", "orders|payments").load(path)
           .select("topic", "body", "tags", "keys", "properties", "queue_id").collect())
    want = [e for e in expected if e is not None]
    assert len(got) == len(want), (ddl, rows)
    by_body = {bytes(r["body"]): r for r in got}
    assert len(by_body) == len(got)  # none twice
    for e in want:
        r = by_body[e["body"]]
        assert (r["topic"], r["tags"], list(r["keys"] or []), dict(r["properties"] or {})) == \
            (e["topic"], e["tags"], e["keys"], e["properties"]), (ddl, e, r)
        if e["queue"] is not None:
            assert r["queue_id"] == e["queue"]
    delayed = sum(e is None for e in expected)
    with MessageStore.open(path) as store:
        assert store.pending_delayed_stats()["pending"] == delayed  # waiting, not early
        assert store.pending_transaction_stats()["pending"] == 0
