"""Cron expressions: parsing, and the next fire time in a time zone, daylight saving included.

An expression is the standard five fields, or one of the macros::

    minute  hour  day-of-month  month  day-of-week
    0-59    0-23  1-31          1-12   0-7 (0 and 7: Sunday)
                                JAN-DEC SUN-SAT (any case)

    @yearly (@annually) = 0 0 1 1 *     @monthly = 0 0 1 * *     @weekly = 0 0 * * 0
    @daily (@midnight)  = 0 0 * * *     @hourly  = 0 * * * *

A field is a comma-separated list of ``*``, ``N``, ``N-M``, each optionally followed by
``/STEP`` (``N/STEP`` runs from ``N`` to the field's maximum).  When both day fields are
restricted (neither starts with ``*``), a day matches when either does, as in Vixie cron;
otherwise both must.

**Time zones and daylight saving.**  Fire times are wall-clock times in the schedule's time
zone (an IANA name, read with :mod:`zoneinfo`).  The rule, for every zone:

* every wall-clock minute that matches fires **once**, at the first instant the clock has
  reached it;
* so a matching time skipped when clocks go forward (02:30 on the night the clock jumps from
  02:00 to 03:00) fires once, at the jump (03:00 new time), and several skipped ones fire
  together there, once;
* a matching time repeated when clocks go back (01:30 twice) fires at its first occurrence
  only; during the repeated hour nothing fires a second time.

A schedule that must keep a fixed interval across changes of the clock (every 5 minutes,
even in the repeated hour) is an ``every_ms`` schedule, which counts real time, not a cron one.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..base.errors import InvalidScheduleError

__all__ = ["CronExpression", "next_every_fire_ms", "time_zone"]

MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name: i + 1 for i, name in enumerate(
    ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"))}
_WEEKDAYS = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
#: (name, lowest, highest, names) of the five fields.
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
           ("month", 1, 12, _MONTHS), ("day of week", 0, 7, _WEEKDAYS))
_UTC = _dt.timezone.utc
_MINUTE = _dt.timedelta(minutes=1)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)
#: Days a search looks ahead before it says the expression never fires again (a leap day on
#: a given weekday recurs within 28 years).
_HORIZON_DAYS = 366 * 29
#: Days per month in a leap year: whether a day of month can ever exist in that month.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def time_zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; :class:`InvalidScheduleError` when unknown."""
    try:
        return _zone(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidScheduleError(
            f"time zone {name!r} is not known; allowed: an IANA name such as 'UTC', "
            "'Europe/Paris' or 'America/New_York'") from None


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _parse_value(text: str, field: tuple, expression: str) -> int:
    name, low, high, names = field
    value = names.get(text.upper()) if names else None
    if value is None:
        if not text.isdigit():
            raise InvalidScheduleError(
                f"cron {expression!r}: {text!r} in the {name} field is not a number"
                + (f" or a name ({', '.join(names)})" if names else "")
                + f"; allowed: {low}-{high}")
        value = int(text)
    if not low <= value <= high:
        raise InvalidScheduleError(f"cron {expression!r}: {value} is outside the {name} field's "
                                   f"range; allowed: {low}-{high}")
    return value


def _parse_field(text: str, field: tuple, expression: str) -> frozenset[int]:
    name, low, high, _ = field
    values: set[int] = set()
    for item in text.split(","):
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise InvalidScheduleError(
                    f"cron {expression!r}: step {step_text!r} in the {name} field; allowed: a "
                    "whole number of at least 1")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _parse_value(a, field, expression), _parse_value(b, field, expression)
            if first > last:
                raise InvalidScheduleError(
                    f"cron {expression!r}: range {base!r} in the {name} field runs backwards; "
                    f"allowed: low-high within {low}-{high}")
        elif base:
            first = _parse_value(base, field, expression)
            last = high if slash else first
        else:
            raise InvalidScheduleError(f"cron {expression!r}: an empty item in the {name} "
                                       "field; allowed: *, N, N-M, each with an optional /STEP")
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronExpression:
    """A parsed cron expression: five fields or a macro such as ``@daily``; :meth:`parse`
    builds one, :meth:`next_fire_ms` gives its next fire in a time zone (each matching
    wall-clock minute fires once, at the first instant the clock reaches it: a time skipped
    by a daylight-saving change fires at the change, a repeated one at its first occurrence).
    """

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # the day-of-month field starts with '*'
    any_weekday: bool  # the day-of-week field starts with '*'

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        """Parse ``text``; :class:`InvalidScheduleError` says what is wrong and what is allowed."""
        if not isinstance(text, str):
            raise InvalidScheduleError(f"cron expression {text!r} is not text; allowed: five "
                                       "fields such as '0 9 * * *', or @hourly, @daily, ...")
        source = " ".join(text.split())
        expanded = MACROS.get(source.lower(), source)
        if expanded.startswith("@"):
            raise InvalidScheduleError(f"cron {text!r}: unknown macro; allowed: "
                                       f"{', '.join(MACROS)}")
        fields = expanded.split(" ")
        if len(fields) != 5:
            raise InvalidScheduleError(
                f"cron {text!r} has {len(fields)} field(s); allowed: five (minute hour "
                "day-of-month month day-of-week), or @hourly, @daily, @weekly, @monthly, "
                "@yearly")
        parsed = [_parse_field(f, spec, text) for f, spec in zip(fields, _FIELDS)]
        weekdays = frozenset(d % 7 for d in parsed[4])
        expression = cls(source, parsed[0], parsed[1], parsed[2], parsed[3], weekdays,
                         fields[2].startswith("*"), fields[4].startswith("*"))
        if expression.any_weekday and not any(
                day <= _MONTH_DAYS[month - 1] for month in expression.months
                for day in expression.days):
            raise InvalidScheduleError(f"cron {text!r} never fires: no month of it has such a "
                                       "day; allowed: a day of month that exists in one of its "
                                       "months")
        return expression

    def _day_matches(self, day: _dt.date) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def next_wall_time(self, after: _dt.datetime) -> _dt.datetime | None:
        """The first matching wall-clock minute strictly after ``after`` (naive), or ``None``
        when none comes within 29 years."""
        t = after.replace(second=0, microsecond=0) + _MINUTE
        limit = t + _dt.timedelta(days=_HORIZON_DAYS)
        while t < limit:
            if t.month not in self.months:
                year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
                t = _dt.datetime(year, month, 1)
                continue
            if not self._day_matches(t.date()):
                t = _dt.datetime(t.year, t.month, t.day) + _dt.timedelta(days=1)
                continue
            if t.hour not in self.hours:
                hour = min((h for h in self.hours if h > t.hour), default=None)
                t = (_dt.datetime(t.year, t.month, t.day) + _dt.timedelta(days=1)
                     if hour is None else t.replace(hour=hour, minute=0))
                continue
            if t.minute not in self.minutes:
                minute = min((m for m in self.minutes if m > t.minute), default=None)
                t = (t.replace(minute=0) + _dt.timedelta(hours=1) if minute is None
                     else t.replace(minute=minute))
                continue
            return t
        return None

    def next_fire_ms(self, after_ms: int, zone: ZoneInfo | str = "UTC") -> int | None:
        """The first fire strictly after the instant ``after_ms`` (epoch ms), by the rule of
        the module; ``None`` when the expression never fires again (within 29 years)."""
        zone = time_zone(zone) if isinstance(zone, str) else zone
        after = _EPOCH + _dt.timedelta(milliseconds=int(after_ms))
        # in the repeated hour after clocks went back, candidates map to their first
        # occurrence, before ``after``: passed over until the clock shows new times
        wall = _wall(after, zone)
        while True:
            candidate = self.next_wall_time(wall)
            if candidate is None:
                return None
            fire = _first_instant(candidate, zone)
            if fire > after:
                return _ms(fire)
            wall = candidate


def next_every_fire_ms(after_ms: int, start_ms: int, every_ms: int) -> int:
    """The first of ``start_ms + k * every_ms`` (k >= 0) strictly after ``after_ms``."""
    if after_ms < start_ms:
        return start_ms
    return start_ms + ((after_ms - start_ms) // every_ms + 1) * every_ms


def _ms(instant: _dt.datetime) -> int:
    delta = instant - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _wall(instant: _dt.datetime, zone: ZoneInfo) -> _dt.datetime:
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def _change_between(lo: _dt.datetime, hi: _dt.datetime, zone: ZoneInfo) -> _dt.datetime | None:
    """The last instant in ``(lo, hi]`` at which the zone's offset changes (to the offset of
    ``hi``), to the second; ``None`` when the offset at ``lo`` is already ``hi``'s."""
    target = hi.astimezone(zone).utcoffset()
    if lo.astimezone(zone).utcoffset() == target:
        return None
    while hi - lo > _dt.timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).utcoffset() == target:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)


def _first_instant(wall: _dt.datetime, zone: ZoneInfo) -> _dt.datetime:
    """The first instant the clock of ``zone`` shows ``wall`` or has passed it."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(_UTC)
    if _wall(first, zone) == wall:
        return first  # shown (the first time, if clocks went back over it)
    # skipped when clocks went forward: the instant of the jump
    other = wall.replace(tzinfo=zone, fold=1).astimezone(_UTC)
    return _change_between(min(first, other), max(first, other), zone)
