"""Cron expressions: parsing, and next fire times against a minute-by-minute model, across
daylight-saving changes in several zones."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import CronExpression, InvalidScheduleError
from store.schedule.cron import next_every_fire_ms

UTC = dt.timezone.utc
ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
# instants near the 2026 changes of the clock in those zones (and ordinary days)
CHANGES = [dt.datetime(2026, 3, 29, 1, tzinfo=UTC), dt.datetime(2026, 10, 25, 1, tzinfo=UTC),
           dt.datetime(2026, 3, 8, 7, tzinfo=UTC), dt.datetime(2026, 11, 1, 6, tzinfo=UTC),
           dt.datetime(2026, 4, 4, 15, tzinfo=UTC), dt.datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
           dt.datetime(2026, 6, 15, 12, tzinfo=UTC)]


def ms(instant: dt.datetime) -> int:
    return int(instant.timestamp() * 1000)


def model_next(expr: CronExpression, after: dt.datetime, zone: ZoneInfo,
               window_minutes: int) -> dt.datetime | None:
    """Minute by minute: the clock shows a wall time each minute; every matching wall minute
    the clock reaches for the first time (including those it jumps over) fires then."""
    def wall(x):
        return x.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)

    def matches(w):
        return (w.minute in expr.minutes and w.hour in expr.hours and w.month in expr.months
                and expr._day_matches(w.date()))

    # the latest wall minute reached so far (clocks may have gone back within 26 hours)
    reached = max(wall(after - dt.timedelta(minutes=m)) for m in range(0, 26 * 60, 1))
    x = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    for _ in range(window_minutes):
        w = wall(x)
        if w > reached:
            t = reached + dt.timedelta(minutes=1)
            while t <= w:  # every wall minute reached now for the first time
                if matches(t):
                    return x if x > after else None
                t += dt.timedelta(minutes=1)
            reached = w
        x += dt.timedelta(minutes=1)
    return None


_minutes = st.one_of(st.just("*"), st.sampled_from(["0", "30", "*/15", "5,35", "59", "0-10/5"]))
_hours = st.one_of(st.just("*"), st.sampled_from(["0", "1", "2", "3", "1-3", "*/2", "9", "2,14"]))


@settings(max_examples=150, deadline=None)
@given(minute=_minutes, hour=_hours, zone=st.sampled_from(ZONES),
       base=st.sampled_from(CHANGES), shift=st.integers(-26 * 60, 26 * 60),
       seconds=st.integers(0, 59))
def test_next_fire_follows_the_minute_by_minute_model(minute, hour, zone, base, shift,
                                                      seconds):
    expr = CronExpression.parse(f"{minute} {hour} * * *")
    after = base + dt.timedelta(minutes=shift, seconds=seconds)
    tz = ZoneInfo(zone)
    expected = model_next(expr, after, tz, window_minutes=3 * 24 * 60)
    got = expr.next_fire_ms(ms(after), zone)
    assert expected is not None  # every such expression fires within three days
    assert got == ms(expected), (dt.datetime.fromtimestamp(got / 1000, UTC), expected)


def fires(expr: str, zone: str, start: dt.datetime, count: int) -> list[str]:
    """The next ``count`` fires as local times with their offsets."""
    e, t, out = CronExpression.parse(expr), ms(start), []
    for _ in range(count):
        t = e.next_fire_ms(t, zone)
        out.append(dt.datetime.fromtimestamp(t / 1000, ZoneInfo(zone)).isoformat())
    return out


def test_a_time_skipped_by_the_spring_change_fires_once_at_the_change():
    # Paris, 2026-03-29: 02:00 CET becomes 03:00 CEST
    assert fires("30 2 * * *", "Europe/Paris", dt.datetime(2026, 3, 28, tzinfo=UTC), 3) == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]
    # several skipped times fire together, once
    assert fires("0,15,30,45 2 * * *", "Europe/Paris", dt.datetime(2026, 3, 29, tzinfo=UTC),
                 2) == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"]


def test_a_time_repeated_by_the_autumn_change_fires_once():
    # New York, 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:30 happens twice
    assert fires("30 1 * * *", "America/New_York", dt.datetime(2026, 10, 31, 12, tzinfo=UTC),
                 2) == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]
    # every 20 minutes by the clock: the repeated hour is not fired again
    assert fires("*/20 * * * *", "Europe/Paris", dt.datetime(2026, 10, 25, 0, 10, tzinfo=UTC),
                 4) == ["2026-10-25T02:20:00+02:00", "2026-10-25T02:40:00+02:00",
                        "2026-10-25T03:00:00+01:00", "2026-10-25T03:20:00+01:00"]


def test_a_daylight_saving_week_in_two_zones():
    """09:00 every day of the week of each change: seven fires, each at 09:00 local."""
    for zone, start in (("Europe/Paris", dt.datetime(2026, 3, 26, tzinfo=UTC)),
                        ("America/New_York", dt.datetime(2026, 10, 29, tzinfo=UTC))):
        got = fires("0 9 * * *", zone, start, 7)
        assert [g[11:19] for g in got] == ["09:00:00"] * 7
        assert len({g[:10] for g in got}) == 7


def test_macros_names_and_day_rules():
    def fields(text):
        e = CronExpression.parse(text)
        return e.minutes, e.hours, e.days, e.months, e.weekdays, e.any_day, e.any_weekday

    assert fields("@daily") == fields("@midnight") == fields("0 0 * * *")
    assert fields("@weekly") == fields("0 0 * * SUN") and fields("@yearly") == fields("0 0 1 1 *")
    e = CronExpression.parse("0 12 * JAN-mar MON-fri")
    assert e.months == {1, 2, 3} and e.weekdays == {1, 2, 3, 4, 5}
    assert CronExpression.parse("0 0 * * 7").weekdays == {0}
    # both day fields restricted: either matches (the 13th, or a Friday)
    start = dt.datetime(2026, 11, 1, tzinfo=UTC)
    got = fires("0 0 13 * 5", "UTC", start, 3)
    assert got == ["2026-11-06T00:00:00+00:00", "2026-11-13T00:00:00+00:00",
                   "2026-11-20T00:00:00+00:00"]
    assert fires("0 0 29 2 *", "UTC", start, 1) == ["2028-02-29T00:00:00+00:00"]
    assert fires("@hourly", "Asia/Kolkata", start, 2) == ["2026-11-01T06:00:00+05:30",
                                                           "2026-11-01T07:00:00+05:30"]


@pytest.mark.parametrize("text, words", [
    ("0 9 * *", "has 4 field"), ("61 * * * *", "outside the minute"), ("* * * * 8", "0-7"),
    ("*/0 * * * *", "step"), ("5-1 * * * *", "backwards"), ("@often", "unknown macro"),
    ("x * * * *", "not a number"), ("0 0 31 2 *", "never fires"), ("0,,5 * * * *", "empty item"),
    (None, "not text"), ("* * * FOO *", "JAN"),
])
def test_bad_expressions_say_what_is_allowed(text, words):
    with pytest.raises(InvalidScheduleError, match=words):
        CronExpression.parse(text)


def test_an_unknown_time_zone_is_refused():
    with pytest.raises(InvalidScheduleError, match="IANA"):
        CronExpression.parse("@daily").next_fire_ms(0, "Mars/Olympus")


@given(start=st.integers(0, 10**13), every=st.integers(1, 10**9), after=st.integers(0, 10**13))
def test_every_fire_is_the_first_step_after(start, every, after):
    got = next_every_fire_ms(after, start, every)
    assert got > after and got >= start and (got - start) % every == 0
    assert got == start or got - every <= after


def test_a_fire_time_itself_gives_the_next_fire():
    e = CronExpression.parse("0 9 * * *")
    first = e.next_fire_ms(ms(dt.datetime(2026, 1, 1, tzinfo=UTC)), "Europe/Paris")
    assert e.next_fire_ms(first, "Europe/Paris") == first + 86_400_000
    assert e.next_fire_ms(first - 1, "Europe/Paris") == first
