"""Fires missed while nothing delivered: the catch-up policy of a recurring schedule
(``latest_once``, the default; ``all``; ``skip``), its window, the book that keeps it, and the
interval floor (``StoreConfig.schedule_min_interval_ms``) on every path that adds a schedule."""

from __future__ import annotations

import dataclasses
import json
import os

import pyarrow as pa
import pytest
from click.testing import CliRunner

from store import InvalidScheduleError, Message, MessageStore, ScheduleIntervalError, StoreConfig
from store.schedule.schedule_book import PROPERTY_SCHEDULE_FIRES
from tests.conftest import SMALL
from tests.store.schedule.test_schedules import fired_counted

T0 = 1_790_000_000_000
WEEK_S = 7 * 86_400


def _open(path, now, config=SMALL):
    return MessageStore.open(path, config, clock=lambda: now[0], flush_service=False)


@pytest.mark.parametrize("policy, copies", [("latest_once", [(T0 + WEEK_S * 1000, WEEK_S)]),
                                            ("skip", [])])
def test_a_week_without_delivery_under_every_second(tmp_path, policy, copies):
    """A week with nothing delivering an every-second schedule: ``latest_once`` sends one
    copy standing for the 604,800 fires, ``skip`` none; then both fire on the phase."""
    now = [T0]
    with _open(str(tmp_path / "s"), now) as store:
        store.producer("g").schedule(Message("orders", b"tick"), key="tick", every_ms=1000,
                                     catch_up=policy)
        now[0] += WEEK_S * 1000
        store.deliver_due()
        assert [(t, n) for _, t, _, n in fired_counted(store)] == copies
        [info] = store.schedules()
        assert info.next_fire_ms == T0 + (WEEK_S + 1) * 1000 and info.catch_up == policy
        assert info.fires == len(copies)
        now[0] += 1000  # on the phase: one ordinary fire, standing for itself
        assert store.deliver_due() == 1
        assert fired_counted(store)[-1][1:] == (now[0], now[0], 1)
        now[0] += 999
        assert store.deliver_due() == 0  # never early


def test_the_default_policy_is_latest_once(tmp_path):
    now = [T0]
    with _open(str(tmp_path / "s"), now) as store:
        info = store.producer("g").schedule(Message("orders", b"x"), key="k", every_ms=1000)
        assert (info.catch_up, info.catch_up_window_ms) == ("latest_once", None)
        now[0] += 10_000
        assert store.deliver_due() == 1


def test_all_sends_every_missed_fire_within_its_window(tmp_path):
    """``all`` sends each missed fire (an hour of them); with ``catch_up_window_ms`` the ones
    older than the window are dropped and the rest sent, each once."""
    now = [T0]
    with _open(str(tmp_path / "s"), now) as store:
        p = store.producer("g")
        p.schedule(Message("orders", b"x"), key="a", every_ms=1000, catch_up="all")
        p.schedule(Message("orders", b"x"), key="w", every_ms=1000, catch_up="all",
                   catch_up_window_ms=60_000)
        now[0] += 3_600_000
        store.deliver_due()
        got = fired_counted(store)
        assert sorted(t for k, t, _, _ in got if k == "a") == \
            list(range(T0 + 1000, now[0] + 1, 1000))
        # fires at or after now - 60 s: 61 of them
        assert sorted(t for k, t, _, _ in got if k == "w") == \
            list(range(now[0] - 60_000, now[0] + 1, 1000))
        assert all(n == 1 for *_, n in got)
        info = {i.key: i for i in store.schedules()}
        assert info["w"].fires == 61 and info["w"].next_fire_ms == now[0] + 1000


def test_a_window_drops_a_lone_late_fire_and_keeps_the_phase(tmp_path):
    now = [T0]
    with _open(str(tmp_path / "s"), now) as store:
        store.producer("g").schedule(Message("orders", b"x"), key="k", every_ms=60_000,
                                     catch_up="latest_once", catch_up_window_ms=5_000)
        now[0] += 60_000 + 10_000  # the one due fire is 10 s old: older than the window
        assert store.deliver_due() == 0
        [info] = store.schedules()
        assert info.next_fire_ms == T0 + 120_000 and info.fires == 0
        now[0] = T0 + 120_000 + 4_000  # 4 s late: within it
        assert store.deliver_due() == 1


def test_latest_once_with_a_cron_expression_counts_the_missed_minutes(tmp_path):
    now = [T0 - T0 % 60_000]  # on a minute
    with _open(str(tmp_path / "s"), now) as store:
        store.producer("g").schedule(Message("orders", b"x"), key="m", cron="* * * * *")
        start = now[0]
        now[0] += 86_400_000 + 30_000  # a day and half a minute
        assert store.deliver_due() == 1
        [(_, t, _, n)] = fired_counted(store)
        assert (t, n) == (start + 86_400_000, 1440)
        now[0] += 30_000
        assert store.deliver_due() == 1
        assert fired_counted(store)[-1][1:] == (now[0], now[0], 1)


def test_a_caught_up_copy_is_one_fire_of_max_fires(tmp_path):
    now = [T0]
    with _open(str(tmp_path / "s"), now) as store:
        store.producer("g").schedule(Message("orders", b"x"), key="k", every_ms=1000,
                                     max_fires=3)
        now[0] += 10_000
        store.deliver_due()
        now[0] += 2_000  # two on the phase
        store.deliver_due()
        now[0] += 1_000
        store.deliver_due()
        assert [n for *_, n in fired_counted(store)] == [10, 2, 1]  # three copies
        now[0] += 5_000
        assert store.deliver_due() == 0
        [info] = store.schedules()
        assert (info.fires, info.state) == (3, "ended")


def test_the_same_definition_keeps_its_phase_and_a_new_policy_keeps_it_too(tmp_path):
    now = [T0]
    with _open(str(tmp_path / "s"), now) as store:
        p = store.producer("g")
        first = p.schedule(Message("orders", b"x"), key="k", every_ms=10_000)
        now[0] += 3_000
        assert p.schedule(Message("orders", b"x"), key="k", every_ms=10_000) == first
        again = p.schedule(Message("orders", b"x"), key="k", every_ms=10_000, catch_up="all",
                           catch_up_window_ms=1)
        assert again.next_fire_ms == first.next_fire_ms == T0 + 10_000
        assert (again.catch_up, again.catch_up_window_ms) == ("all", 1)
        table = pa.table({"key": ["k"], "body": [b"x"], "every_ms": pa.array([10_000]),
                          "catch_up": ["skip"]})
        result = p.schedule_table(table, topic="orders")
        assert (result.changed, result.unchanged) == (1, 0)
        [info] = store.schedules()
        assert (info.catch_up, info.next_fire_ms) == ("skip", T0 + 10_000)
        assert p.schedule_table(table, topic="orders").unchanged == 1


def test_the_policy_is_kept_in_the_book_and_an_older_book_keeps_all(tmp_path):
    """The book stores the policy and window; a book an earlier version wrote (no policy
    recorded) reads as ``all``, what its schedules did, so an upgrade changes no schedule."""
    path, now = str(tmp_path / "s"), [T0]
    with _open(path, now) as store:
        p = store.producer("g")
        p.schedule(Message("orders", b"x"), key="new", every_ms=1000, catch_up="skip",
                   catch_up_window_ms=7)
        p.schedule(Message("orders", b"x"), key="old", every_ms=1000)
    book = os.path.join(path, "config", "rmq_schedules.json")
    with open(book) as fh:
        data = json.load(fh)
    assert (data["schedules"]["new"]["catchUp"], data["schedules"]["new"]["catchUpWindowMs"]) \
        == ("skip", 7)
    for name in ("catchUp", "catchUpWindowMs"):
        del data["schedules"]["old"][name]
    with open(book, "w") as fh:
        json.dump(data, fh)
    now[0] += 5_000
    with _open(path, now) as store:
        info = {i.key: i for i in store.schedules()}
        assert (info["new"].catch_up, info["new"].catch_up_window_ms) == ("skip", 7)
        assert (info["old"].catch_up, info["old"].catch_up_window_ms) == ("all", None)
        store.deliver_due()
        assert sorted(t for k, t, _, _ in fired_counted(store) if k == "old") == \
            [T0 + 1000 * i for i in range(1, 6)]


def test_a_crash_after_a_caught_up_copy_is_settled_once(tmp_path, monkeypatch):
    """Killed after the copy standing for the missed fires is flushed, before the book is
    written: the next process counts it (no second copy) and fires on the phase."""
    path, now = str(tmp_path / "s"), [T0]
    store = _open(path, now)
    store.producer("g").schedule(Message("orders", b"x"), key="k", every_ms=1000)
    now[0] += 50_000
    real_flush = store.flush

    def flush_then_die():
        real_flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "flush", flush_then_die)
    with pytest.raises(KeyboardInterrupt):
        store.recurring.fire_due()
    monkeypatch.undo()
    store.close()
    with _open(path, now) as store:
        assert store.deliver_due() == 0
        now[0] += 1000
        assert store.deliver_due() == 1
        assert [(t, n) for _, t, _, n in fired_counted(store)] == \
            [(T0 + 50_000, 50), (T0 + 51_000, 1)]


# -- the interval floor --------------------------------------------------------------------

DEFAULT_FLOOR = dataclasses.replace(SMALL, schedule_min_interval_ms=1000)


def test_the_floor_defaults_to_a_second_and_is_validated():
    assert StoreConfig().schedule_min_interval_ms == 1000
    with pytest.raises(Exception, match="schedule_min_interval_ms=0"):
        StoreConfig(schedule_min_interval_ms=0)


def test_an_interval_below_the_floor_is_refused_by_schedule_and_schedule_table(tmp_path):
    now = [T0]
    with _open(str(tmp_path / "s"), now, DEFAULT_FLOOR) as store:
        p = store.producer("g")
        with pytest.raises(ScheduleIntervalError, match=r"every_ms=999 is below this store's "
                           r"floor of 1000 ms.*allowed: every_ms >= 1000"):
            p.schedule(Message("orders", b"x"), key="k", every_ms=999)
        table = pa.table({"key": ["a", "b"], "body": [b"x", b"x"],
                          "every_ms": pa.array([1000, 500])})
        with pytest.raises(InvalidScheduleError, match="every_ms=500 .* floor of 1000 ms"):
            p.schedule_table(table, topic="orders")
        assert store.schedules() == []  # nothing of the table was applied
        p.schedule(Message("orders", b"x"), key="k", every_ms=1000)
        p.schedule(Message("orders", b"x"), key="c", cron="* * * * *")  # a minute at least


def test_an_interval_below_the_floor_is_refused_by_the_cli(tmp_path):
    from rmq_cli.cli import main

    path = str(tmp_path / "s")
    r = CliRunner().invoke(main, ["schedule", "add", "--store", path, "--create", "--key", "k",
                                  "--topic", "t", "--body", "x", "--every-ms", "10"])
    assert r.exit_code != 0 and "every_ms=10 is below this store's floor of 1000 ms" in r.output
    r = CliRunner().invoke(main, ["schedule", "add", "--store", path, "--key", "k", "--topic",
                                  "t", "--body", "x", "--every-ms", "1000", "--catch-up", "skip",
                                  "--catch-up-window-ms", "5000"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["schedules", "--store", path])
    assert "catch-up skip within 5000 ms" in r.output
    r = CliRunner().invoke(main, ["schedules", "--store", path, "--json"])
    [listed] = json.loads(r.stdout)
    assert (listed["catch_up"], listed["catch_up_window_ms"]) == ("skip", 5000)
    r = CliRunner().invoke(main, ["schedule", "add", "--store", path, "--key", "k", "--topic",
                                  "t", "--body", "x", "--every-ms", "1000", "--catch-up", "some"])
    assert r.exit_code != 0 and "latest_once" in r.output


def test_the_sinks_schedule_columns_carry_the_policy_and_meet_the_floor(tmp_path):
    """The sink's schedule rows (``schedule_key``, ``every_ms``, ``catch_up``, ...) go to the
    store as ``schedule_table`` rows: the policy is kept, an interval below the floor
    refused (the sink's own error, naming the floor)."""
    from rmq_source.options import parse_options
    from rmq_source.sink_writer import SinkWriteError, _apply, _Operations, _split

    path, now = str(tmp_path / "s"), [T0]
    with _open(path, now, DEFAULT_FLOOR) as store:
        options = parse_options({"path": path, "topic": "orders"}, streaming=None, write=True)
        rows = pa.table({"body": [b"x", b"y"], "schedule_key": ["a", "b"],
                         "every_ms": pa.array([1000, 2000]), "catch_up": ["skip", None],
                         "catch_up_window_ms": pa.array([5000, None], pa.int64())})
        ops = _Operations()
        assert _split(rows, ops) == []
        _apply(options, store.producer("g"), [], ops.table())
        info = {i.key: i for i in store.schedules()}
        assert (info["a"].catch_up, info["a"].catch_up_window_ms) == ("skip", 5000)
        assert (info["b"].catch_up, info["b"].catch_up_window_ms) == ("latest_once", None)
        ops = _Operations()
        _split(rows.set_column(2, "every_ms", pa.array([1000, 10])), ops)
        with pytest.raises(SinkWriteError, match="every_ms=10 is below .* floor of 1000 ms"):
            _apply(options, store.producer("g"), [], ops.table())


def test_the_sink_knows_the_policy_columns():
    from rmq_source.sink_writer import COLUMN_TYPES, SCHEDULE_COLUMNS

    assert {"catch_up", "catch_up_window_ms"} <= set(COLUMN_TYPES) & set(SCHEDULE_COLUMNS)


def test_a_copy_standing_for_one_fire_has_no_count(tmp_path):
    now = [T0]
    with _open(str(tmp_path / "s"), now) as store:
        store.producer("g").schedule(Message("orders", b"x"), key="k", every_ms=1000)
        now[0] += 1000
        store.deliver_due()
        [row] = store.read_arrow("orders", _queue_of(store), 0, 1).to_pylist()
        assert PROPERTY_SCHEDULE_FIRES not in dict(row["properties"])


def _queue_of(store) -> int:
    return next(q for q in store.queue_ids("orders") if store.max_offset("orders", q))
