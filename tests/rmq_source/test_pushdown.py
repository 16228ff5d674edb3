"""Filter pushdown of batch reads (``rmq_source.pushdown``): the same rows as with pushdown
off, for random combinations of every pushed filter; plain reads under Spark's defaults; the
one-line error of ``pushFilters=true`` without Spark's conf."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_source.pushdown import PUSHDOWN_CONF
from store import MessageStore
from tests.rmq_source.mixed import send_mixed
from tests.conftest import active_spark

pytestmark = pytest.mark.spark

COLUMNS = ["topic", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "tags", "body",
           "transaction_id", "born_timestamp", "store_timestamp", "deliver_timestamp"]


@pytest.fixture(scope="module")
def pushdown_store(tmp_path_factory):
    """Two topics; plain, tagged, delayed and transactional messages; written in two sessions
    (a reopen between them); what the filters may name, taken from the store itself."""
    from tests.conftest import SMALL, FakeClock

    path = str(tmp_path_factory.mktemp("pushdown") / "store")
    clock = FakeClock()
    for session in range(2):
        with MessageStore.open(path, SMALL, clock=clock) as store:
            send_mixed(store, clock, "pushdown", session, 60, ("alpha", "beta"),
                       (None, "red", "blue", "green", "red"))
    return path


def read(spark, path, where, pushdown):
    if pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
    try:
        df = (spark.read.format("rmq").option("subscribe", "alpha,beta")
              .option("deliverDue", "false").load(path).where(where))
        rows = sorted(tuple(r) for r in df.select(*COLUMNS).collect())
        plan = df._jdf.queryExecution().optimizedPlan().toString()
    finally:
        spark.conf.unset(PUSHDOWN_CONF)
    return rows, plan


@st.composite
def conditions(draw, facts):
    """One SQL condition the source pushes (or, now and then, one it returns to Spark)."""
    def pick(values, most=3):
        return draw(st.lists(st.sampled_from(values), min_size=1, max_size=most, unique=True))

    def quoted(values):
        return ", ".join(f"'{v}'" for v in values)

    kind = draw(st.sampled_from(["topic", "queue_id", "tags", "msg_id", "transaction_id",
                                 "queue_offset", "commitlog_offset", "store_timestamp",
                                 "born_timestamp", "deliver_timestamp", "not pushed"]))
    op = draw(st.sampled_from(["<", "<=", ">", ">=", "="]))
    if kind in ("topic", "tags", "msg_id", "transaction_id"):
        return f"{kind} IN ({quoted(pick(facts[kind]))})"
    if kind == "queue_id":
        return f"queue_id IN ({', '.join(map(str, pick([0, 1, 2, 3])))})"
    if kind in ("queue_offset", "commitlog_offset"):
        return f"{kind} {op} {draw(st.sampled_from(facts[kind]))}"
    if kind.endswith("timestamp"):
        return f"{kind} {op} timestamp_millis({draw(st.sampled_from(facts[kind]))})"
    return draw(st.sampled_from(["tags LIKE 'r%'", "NOT (tags = 'red')", "tags IS NULL",
                                 "queue_id + 1 = 2"]))


@pytest.fixture(scope="module")
def facts(_spark_session, pushdown_store):
    spark = active_spark(_spark_session)
    rows = (spark.read.format("rmq").option("subscribe", "alpha,beta")
            .option("deliverDue", "false").load(pushdown_store).collect())

    def ms(values):
        return sorted({round(v.timestamp() * 1000) for v in values if v is not None})

    return {
        "topic": ["alpha", "beta", "gamma"],
        "tags": ["red", "blue", "green", "violet"],
        "msg_id": sorted({r.msg_id for r in rows})[::7] + ["no-such-id"],
        "transaction_id": sorted({r.transaction_id for r in rows if r.transaction_id}),
        "queue_offset": sorted({r.queue_offset for r in rows})[::3],
        "commitlog_offset": sorted({r.commitlog_offset for r in rows})[::9],
        "store_timestamp": ms(r.store_timestamp for r in rows)[::5],
        "born_timestamp": ms(r.born_timestamp for r in rows)[::5],
        "deliver_timestamp": ms(r.deliver_timestamp for r in rows),
    }


def test_the_facts_cover_delayed_and_transactional_messages(facts):
    assert facts["transaction_id"] and facts["deliver_timestamp"]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pushed_filters_give_the_rows_of_the_same_query_without_pushdown(
        spark, pushdown_store, facts, data):
    where = " AND ".join(data.draw(st.lists(conditions(facts), min_size=1, max_size=4)))
    pushed, _ = read(spark, pushdown_store, where, pushdown=True)
    plain, _ = read(spark, pushdown_store, where, pushdown=False)
    assert pushed == plain, where


def test_a_query_of_only_pushed_filters_leaves_spark_nothing_to_check(spark, pushdown_store,
                                                                      facts):
    where = (f"tags = 'red' AND queue_id IN (0, 1) AND queue_offset >= 3 AND "
             f"store_timestamp >= timestamp_millis({facts['store_timestamp'][2]})")
    pushed, plan = read(spark, pushdown_store, where, pushdown=True)
    plain, plain_plan = read(spark, pushdown_store, where, pushdown=False)
    assert pushed == plain and pushed
    assert "Filter" not in plan and "Filter" in plain_plan


def test_a_plain_read_works_under_spark_defaults(spark, pushdown_store):
    assert spark.conf.get(PUSHDOWN_CONF, "false") == "false"
    df = spark.read.format("rmq").option("subscribe", "alpha").option(
        "deliverDue", "false").load(pushdown_store)
    assert df.where("tags = 'red'").count() > 0


def test_push_filters_true_without_the_conf_says_what_to_set(spark, pushdown_store):
    with pytest.raises(Exception) as failed:
        (spark.read.format("rmq").option("subscribe", "alpha").option("pushFilters", "true")
         .load(pushdown_store).collect())
    assert f"spark.conf.set('{PUSHDOWN_CONF}', 'true')" in str(failed.value)
    with contextlib.ExitStack() as undo:  # with the conf on, the same read works
        spark.conf.set(PUSHDOWN_CONF, "true")
        undo.callback(spark.conf.unset, PUSHDOWN_CONF)
        df = spark.read.format("rmq").option("subscribe", "alpha").option(
            "pushFilters", "true").option("deliverDue", "false").load(pushdown_store)
        assert df.where("tags = 'red'").count() > 0
