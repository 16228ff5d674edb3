"""One recurring schedule: the message it sends, when it fires, and what it sends of fires it
missed (its catch-up policy).

A schedule holds a message (topic, body, tags, keys, properties) and when to fire it: a cron
expression in a time zone (:mod:`store.schedule.cron`), or a fixed interval ``every_ms`` from
an anchor, optionally bounded by ``end_at_ms`` and ``max_fires``.  Its key names it: a
schedule added with the key of another replaces it.  :class:`Schedule` is one as the book
keeps it, with its progress (fires so far, the next fire time); :class:`ScheduleInfo` is what
a store lists of it; :func:`validate_schedule` checks a user's definition.  Where schedules
are kept and how their copies are fired exactly once is :mod:`store.schedule.schedule_book`.

**Missed fires** (the catch-up policy, ``catch_up``).  A step that finds more than one due
time of a schedule found fires the deliverer missed (the store closed, no server, a
deliverer slower than the interval); a deliverer that runs more often than the interval
never misses one.  Fires older than ``catch_up_window_ms`` (when set) are dropped first,
under every policy.  Then, per schedule (:meth:`Schedule.take_due`):

==============  ============================================================================
``all``         a copy per due time, each once (as overdue timer messages are)
``latest_once`` one copy, at the latest due time, standing for all of them: it carries
                ``RMQ_SCHEDULE_FIRES`` = how many due times it stands for (only when more
                than one); later fires keep the schedule's phase.  The default.
``skip``        nothing when several are due (a lone due time fires); later fires keep the
                schedule's phase
==============  ============================================================================

``fires`` and ``max_fires`` count copies sent: a caught-up copy is one fire.  A book written
before the policy existed has none recorded: its schedules keep ``all`` (what they did).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from ..base.errors import InvalidScheduleError, ScheduleIntervalError
from ..formats.message import validate_schedule_key
from .cron import CronExpression, next_every_fire_ms, time_zone

#: The catch-up policies (see the module); the first is the default of a new schedule.
CATCH_UP_POLICIES = ("latest_once", "all", "skip")
#: The policy of a schedule in a book written before policies existed (what it did then).
LEGACY_CATCH_UP = "all"


@dataclass(slots=True)
class Schedule:
    """One schedule as the book keeps it (see the module)."""

    key: str
    topic: str
    body: bytes
    properties: dict[str, str]  # the message's, with TAGS and KEYS
    cron: str | None = None
    every_ms: int | None = None
    tz: str = "UTC"
    anchor_ms: int = 0  # every_ms: fires at anchor + k * every_ms
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    max_fires: int | None = None
    fires: int = 0
    next_fire_ms: int | None = None  # None: ended (end_at_ms or max_fires reached)
    paused: bool = False
    created_ms: int = 0
    last_fire_ms: int | None = None
    catch_up: str = CATCH_UP_POLICIES[0]
    catch_up_window_ms: int | None = None  # None: no fire is too old to be sent
    _cron: CronExpression | None = field(default=None, repr=False, compare=False)

    def following(self, after_ms: int) -> int | None:
        """The first fire time strictly after ``after_ms`` within the bounds, or ``None``."""
        if self.max_fires is not None and self.fires >= self.max_fires:
            return None
        if self.start_at_ms is not None:
            after_ms = max(after_ms, self.start_at_ms - 1)
        if self.every_ms is not None:
            t = next_every_fire_ms(after_ms, self.anchor_ms, self.every_ms)
        else:
            if self._cron is None:
                self._cron = CronExpression.parse(self.cron)
            t = self._cron.next_fire_ms(after_ms, self.tz)
        if t is None or (self.end_at_ms is not None and t > self.end_at_ms):
            return None
        return t

    def latest_due(self, first_ms: int, now_ms: int) -> tuple[int, int]:
        """``(latest, count)``: the latest due time at or before ``now_ms`` from the due time
        ``first_ms`` on, and how many due times that is (``first_ms`` included).  A fixed
        interval counts them by arithmetic; a cron expression walks them."""
        if self.every_ms is not None:
            limit = now_ms if self.end_at_ms is None else min(now_ms, self.end_at_ms)
            latest = first_ms + (limit - first_ms) // self.every_ms * self.every_ms
            return latest, (latest - first_ms) // self.every_ms + 1
        latest, count = first_ms, 1
        while True:
            t = self.following(latest)
            if t is None or t > now_ms:
                return latest, count
            latest, count = t, count + 1

    def take_due(self, now: int, fires: list, budget: int | None) -> None:
        """Add the copies the due times of this schedule make under its catch-up policy to
        ``fires`` (``(schedule, fire time, due times it stands for)``, at most ``budget`` in
        all) and move its next fire on past what was taken or dropped."""
        t = self.next_fire_ms
        window = self.catch_up_window_ms
        if window is not None and t < now - window:
            t = self.following(now - window - 1)  # older than the window: dropped, any policy
            if t is None or t > now:
                self.next_fire_ms = t
                return
        if self.catch_up == "all":
            while t is not None and t <= now and (budget is None or len(fires) < budget):
                fires.append((self, t, 1))
                self.fires += 1
                self.last_fire_ms = t
                t = self.following(t)
            self.next_fire_ms = t
            return
        latest, count = self.latest_due(t, now)
        if count == 1 or self.catch_up == "latest_once":
            fires.append((self, latest, count))
            self.fires += 1
            self.last_fire_ms = latest
        # (skip with several due: all dropped) the next fire keeps the schedule's phase
        self.next_fire_ms = self.following(latest)

    def definition(self) -> tuple:
        """When a user's schedule fires and what (not its progress, nor its catch-up policy)."""
        return (self.key, self.topic, self.body, self.properties, self.cron, self.every_ms,
                self.tz, self.start_at_ms, self.end_at_ms, self.max_fires)

    def policy(self) -> tuple:
        """Its catch-up policy and window (a new one keeps the schedule's progress)."""
        return (self.catch_up, self.catch_up_window_ms)

    def info(self) -> ScheduleInfo:
        """What :meth:`~store.MessageStore.schedules` lists of it."""
        return ScheduleInfo(self.key, self.topic, self.cron, self.every_ms, self.tz,
                            self.next_fire_ms, self.fires, self.paused, self.start_at_ms,
                            self.end_at_ms, self.max_fires, self.last_fire_ms, self.catch_up,
                            self.catch_up_window_ms)

    def to_json(self) -> dict:
        return {"topic": self.topic, "body": base64.b64encode(self.body).decode("ascii"),
                "properties": self.properties, "cron": self.cron, "everyMs": self.every_ms,
                "tz": self.tz, "anchorMs": self.anchor_ms, "startAtMs": self.start_at_ms,
                "endAtMs": self.end_at_ms, "maxFires": self.max_fires, "fires": self.fires,
                "nextFireMs": self.next_fire_ms, "paused": self.paused,
                "createdMs": self.created_ms, "lastFireMs": self.last_fire_ms,
                "catchUp": self.catch_up, "catchUpWindowMs": self.catch_up_window_ms}

    @classmethod
    def from_json(cls, key: str, data: dict) -> Schedule:
        return cls(key, data["topic"], base64.b64decode(data["body"]),
                   dict(data.get("properties") or {}), data.get("cron"), data.get("everyMs"),
                   data.get("tz") or "UTC", int(data.get("anchorMs") or 0),
                   data.get("startAtMs"), data.get("endAtMs"), data.get("maxFires"),
                   int(data.get("fires") or 0), data.get("nextFireMs"),
                   bool(data.get("paused")), int(data.get("createdMs") or 0),
                   data.get("lastFireMs"), data.get("catchUp") or LEGACY_CATCH_UP,
                   data.get("catchUpWindowMs"))


@dataclass(frozen=True)
class ScheduleInfo:
    """What :meth:`~store.MessageStore.schedules` lists of one schedule."""

    key: str
    topic: str
    cron: str | None
    every_ms: int | None
    tz: str
    next_fire_ms: int | None
    fires: int
    paused: bool
    start_at_ms: int | None
    end_at_ms: int | None
    max_fires: int | None
    last_fire_ms: int | None
    #: defaults: what a server of an earlier version did (it sends neither)
    catch_up: str = LEGACY_CATCH_UP
    catch_up_window_ms: int | None = None

    @property
    def state(self) -> str:
        """``"active"``, ``"paused"`` or ``"ended"`` (no fire left within its bounds)."""
        if self.next_fire_ms is None:
            return "ended"
        return "paused" if self.paused else "active"


def validate_schedule(key: object, cron: object, every_ms: object, tz: object,
                      start_at_ms: object, end_at_ms: object, max_fires: object,
                      catch_up: object = CATCH_UP_POLICIES[0],
                      catch_up_window_ms: object = None, *, min_interval_ms: int = 1) -> None:
    """Raise :class:`InvalidScheduleError` naming what is wrong and what is allowed;
    ``min_interval_ms`` is the store's floor for ``every_ms``
    (``StoreConfig.schedule_min_interval_ms``)."""
    validate_schedule_key(key)
    if (cron is None) == (every_ms is None):
        raise InvalidScheduleError("give exactly one of cron (e.g. '0 9 * * *') and every_ms "
                                   "(an interval in ms)")
    if every_ms is not None and (isinstance(every_ms, bool) or not isinstance(every_ms, int)
                                 or every_ms < 1):
        raise InvalidScheduleError(f"every_ms={every_ms!r}; allowed: an int >= 1")
    if every_ms is not None and every_ms < min_interval_ms:
        raise ScheduleIntervalError(
            f"every_ms={every_ms} is below this store's floor of {min_interval_ms} ms "
            f"(StoreConfig.schedule_min_interval_ms); allowed: every_ms >= {min_interval_ms}")
    if catch_up not in CATCH_UP_POLICIES:
        raise InvalidScheduleError(f"catch_up={catch_up!r}; allowed: "
                                   f"{', '.join(repr(p) for p in CATCH_UP_POLICIES)}")
    if catch_up_window_ms is not None and (
            isinstance(catch_up_window_ms, bool) or not isinstance(catch_up_window_ms, int)
            or catch_up_window_ms < 0):
        raise InvalidScheduleError(f"catch_up_window_ms={catch_up_window_ms!r}; allowed: an "
                                   "int >= 0 (ms), or None (no fire is too old)")
    if cron is not None:
        CronExpression.parse(cron)
    time_zone(tz)
    for name, value in (("start_at_ms", start_at_ms), ("end_at_ms", end_at_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise InvalidScheduleError(f"{name}={value!r}; allowed: epoch ms >= 0, or None")
    if start_at_ms is not None and end_at_ms is not None and end_at_ms < start_at_ms:
        raise InvalidScheduleError(f"end_at_ms={end_at_ms} is before start_at_ms={start_at_ms};"
                                   " allowed: end_at_ms >= start_at_ms")
    if max_fires is not None and (isinstance(max_fires, bool) or not isinstance(max_fires, int)
                                  or max_fires < 1):
        raise InvalidScheduleError(f"max_fires={max_fires!r}; allowed: an int >= 1, or None")
