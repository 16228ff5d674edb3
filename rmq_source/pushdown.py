"""Filter pushdown of batch reads: which of Spark's filters the ``rmq`` source takes, how it
narrows the queue ranges it plans, and the exact check of the rows it reads.

Spark hands :meth:`RmqPushdownReader.pushFilters` the ``AND``-ed filters of a query on
top-level columns.  The source takes (and Spark then no longer checks):

* ``=`` and ``IN`` on ``topic`` and ``queue_id``: the queues not named are not read;
* ``=`` and ``IN`` on ``tags``: read with the ConsumeQueue's tagsCode (the tag's Java hash)
  before any record is touched, then by the tag itself, like the ``tags`` option;
* ``=`` and ``IN`` on ``msg_id``: found through the store's key index when it has one (the
  index holds every message's unique key; :mod:`rmq_source.key_lookup`), else by the scan;
  then checked on the decoded rows;
* ``=`` and ``IN`` on ``keys`` (a whole array: ``keys = array('a', 'b')``): the same, looked up
  by each array's first key;
* ``=`` and ``IN`` on ``transaction_id``: checked on the decoded rows;
* ``IS NOT NULL`` on a column never null, or on one another pushed filter checks;
* ``<``, ``<=``, ``>``, ``>=`` and ``=`` on ``queue_offset`` (each queue's offset range is cut),
  ``commitlog_offset`` (cut by a binary search over the ConsumeQueue's CommitLog offsets),
  ``store_timestamp`` (cut by a binary search on store time, the store's
  ``offset_for_timestamp``, as RocketMQ's own lookup by time), ``born_timestamp`` and
  ``deliver_timestamp``; then checked on the decoded rows.

Every pushed filter is exact: a row the source returns satisfies it, and a row it drops does
not, so results equal those of the same query with pushdown off.  The binary search on store
time assumes what RocketMQ assumes: store times do not go backwards within a queue.  Anything
else (``OR`` trees are never offered; ``NOT``, ``IS NULL``, ``LIKE``, ``<=>`` with null, a value
of another type, an empty tag, a key with a space; ``array_contains``, which Spark never
offers: the option ``keys`` reads by key instead) is returned to Spark.

The option ``keys`` (messages carrying any of the keys given) travels in the same
:class:`RowFilter`, pushdown or not: the planner looks its keys up in the index, and every
row read is checked against it.

Pushdown is offered only when Spark's ``spark.sql.python.filterPushdown.enabled`` is true:
with it false, Spark refuses any reader that implements ``pushFilters``
(``DATA_SOURCE_PUSHDOWN_DISABLED``), so the data source hands out a reader without it.  The
conf is not readable in the Python worker that calls ``DataSource.reader()``, but Spark calls
``reader()`` from a worker of its own (``pyspark.sql.worker.data_source_pushdown_filters``) only
when pushdown is enabled: :func:`spark_pushes_filters` looks for that caller.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from store import StoreError

from .errors import InvalidOptionError

#: the Python worker module from which Spark asks a reader for filters (PySpark 4.1+)
PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
#: the one line a user needs (docs/options.md, and the error of ``pushFilters=true``)
HOW_TO_ENABLE = f"spark.conf.set('{PUSHDOWN_CONF}', 'true')"

#: columns taking ``=`` / ``IN`` -> the Python type of their values
SET_COLUMNS = {"topic": str, "queue_id": int, "tags": str, "msg_id": str, "transaction_id": str}
#: the array column taking ``=`` / ``IN`` of whole arrays (of keys without spaces)
KEYS_COLUMN = "keys"
#: columns taking ranges; the timestamps' bounds are kept in microseconds since the epoch
RANGE_COLUMNS = ("queue_offset", "commitlog_offset", "store_timestamp", "born_timestamp",
                 "deliver_timestamp")
_TIMESTAMPS = frozenset({"store_timestamp", "born_timestamp", "deliver_timestamp"})
#: what the planner already makes exact (the queues and offsets read; tags by read_arrow)
_PLANNED = frozenset({"topic", "queue_id", "queue_offset", "tags"})
#: columns of the record's header and place: never null
_NEVER_NULL = frozenset({"topic", "queue_id", "queue_offset", "commitlog_offset",
                         "store_timestamp", "born_timestamp"})
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MIN, _MAX = -(1 << 63), (1 << 63) - 1


def spark_pushes_filters() -> bool:
    """Whether this ``DataSource.reader()`` call comes from Spark's filter pushdown worker
    (pushdown is enabled in the session); ``False`` from anywhere else."""
    frame = sys._getframe(1)
    while frame is not None:
        names = frame.f_globals
        spec = names.get("__spec__")
        if PUSHDOWN_WORKER in (names.get("__name__"), getattr(spec, "name", None)):
            return True
        frame = frame.f_back
    return False


def check_push_option(mode: str, pushing: bool) -> None:
    """Option ``pushFilters=true`` demands pushdown: fail in one line saying what to set."""
    if mode == "true" and not pushing:
        raise InvalidOptionError(
            f"option pushFilters='true' needs Spark's filter pushdown, which is off; allowed: "
            f"run {HOW_TO_ENABLE} first, or leave pushFilters at its default 'auto'")


@dataclass(frozen=True, slots=True)
class RowFilter:
    """The pushed filters of a query, combined (picklable: it travels in each partition).

    Parameters
    ----------
    sets : tuple of (column, tuple of values)
        ``column IN values`` for each (one entry per column: ``=`` and ``IN`` intersected).
    ranges : tuple of (column, low, high)
        ``low <= column <= high`` (integers; timestamps in microseconds since the epoch).
    keys : tuple of str, optional
        The option ``keys``: the ``keys`` array holds at least one of them.
    """

    sets: tuple[tuple[str, tuple], ...] = ()
    ranges: tuple[tuple[str, int, int], ...] = ()
    #: option ``keys``: a row passes when its ``keys`` array holds one of these
    keys: tuple[str, ...] | None = None

    def values(self, column: str) -> tuple | None:
        """The values ``column`` may take, or ``None`` when no filter names it."""
        return dict(self.sets).get(column)

    def bounds(self, column: str) -> tuple[int, int] | None:
        for name, low, high in self.ranges:
            if name == column:
                return low, high
        return None

    @property
    def nothing(self) -> bool:
        """No row can pass (an empty ``IN`` set, a range with low > high)."""
        return any(not v for _, v in self.sets) or any(lo > hi for _, lo, hi in self.ranges)

    @property
    def checked_columns(self) -> tuple[str, ...]:
        """Columns a read must check row by row (the planner has not made them exact)."""
        names = [c for c, _ in self.sets] + [c for c, _, _ in self.ranges]
        if self.keys is not None:
            names.append(KEYS_COLUMN)
        return tuple(dict.fromkeys(c for c in names if c not in _PLANNED))

    def mask(self, batch: pa.RecordBatch) -> pa.Array:
        """A boolean array: which rows of ``batch`` pass every row-checked filter."""
        keep = None
        for column in self.checked_columns:
            data = batch.column(column)
            values = self.values(column)
            if column == KEYS_COLUMN:
                test = _keys_test(data, values, self.keys)
            elif values is not None:
                test = pc.is_in(data, value_set=pa.array(values, data.type))
            else:
                low, high = self.bounds(column)
                if column in _TIMESTAMPS:
                    low, high = (pa.scalar(v, data.type) for v in (low, high))
                test = pc.and_kleene(pc.greater_equal(data, low), pc.less_equal(data, high))
            keep = test if keep is None else pc.and_kleene(keep, test)
        return pc.fill_null(keep, False)

    def apply(self, batch: pa.RecordBatch, columns: tuple[str, ...] | None) -> pa.RecordBatch:
        """The rows of ``batch`` that pass, with only ``columns`` (``None``: as they are)."""
        batch = batch.filter(self.mask(batch))
        return batch if columns is None else batch.select(list(columns))


def _keys_test(data: pa.Array, arrays: tuple | None, any_of: tuple[str, ...] | None
               ) -> pa.Array:
    """Which rows of the ``keys`` column equal one of ``arrays`` (whole, in order) and hold
    one of ``any_of`` (either left out: not asked)."""
    test = None
    if arrays is not None:  # stored keys never hold a space: joined by one, equal as arrays
        joined = pc.binary_join(data, " ")
        test = pc.is_in(joined, value_set=pa.array([" ".join(a) for a in arrays], pa.string()))
    if any_of is not None:
        flat = pc.list_flatten(data)
        hit = pc.is_in(flat, value_set=pa.array(any_of, flat.type)).to_numpy(
            zero_copy_only=False)
        rows = np.zeros(len(data), dtype=bool)
        rows[pc.list_parent_indices(data).to_numpy()[hit]] = True
        held = pa.array(rows)
        test = held if test is None else pc.and_kleene(test, held)
    return test


def _key_arrays(given: list) -> set[tuple[str, ...]] | None:
    """Values of ``keys =`` / ``keys IN``, as tuples; ``None`` when one cannot be pushed (not
    an array of non-empty keys without spaces)."""
    out = set()
    for value in given:
        if not isinstance(value, (list, tuple)) or not all(
                type(k) is str and k and " " not in k for k in value):
            return None
        out.add(tuple(value))
    return out


def _micros(value: dt.datetime) -> int:
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


def _range_value(column: str, value) -> int | None:
    """A range bound as an int (µs for a timestamp), or ``None`` when it cannot be pushed."""
    if column in _TIMESTAMPS:
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            return _micros(value)
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def push_filters(filters: Iterable) -> tuple[RowFilter, list]:
    """Split Spark's filters into what the source takes (one :class:`RowFilter`) and what
    Spark must still apply (returned as given, in order)."""
    from pyspark.sql.datasource import (
        EqualNullSafe,
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
    )

    sets: dict[str, set] = {}
    ranges: dict[str, tuple[int, int]] = {}
    rejected = []
    for f in filters:
        path = getattr(f, "attribute", ())  # Not(...) has none of its own
        column = path[0] if len(path) == 1 else None
        if isinstance(f, (EqualTo, EqualNullSafe, In)) and column == KEYS_COLUMN:
            values = _key_arrays(f.value if isinstance(f, In) else [f.value])
            if values is not None:
                sets[column] = sets[column] & values if column in sets else values
                continue
        elif isinstance(f, (EqualTo, EqualNullSafe, In)) and column in SET_COLUMNS:
            given = f.value if isinstance(f, In) else (f.value,)
            kind = SET_COLUMNS[column]
            # a null in IN matches nothing; EqualNullSafe with null means IS NULL (not taken)
            values = {v for v in given if v is not None or isinstance(f, EqualNullSafe)}
            if all(type(v) is kind and v != "" for v in values) and (
                    values or not isinstance(f, EqualNullSafe)):
                sets[column] = sets[column] & values if column in sets else values
                continue
        elif column in RANGE_COLUMNS and isinstance(
                f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
            value = _range_value(column, f.value)
            if value is not None:
                low, high = ranges.get(column, (_MIN, _MAX))
                if isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual)):
                    low = max(low, value + (1 if isinstance(f, GreaterThan) else 0))
                if isinstance(f, (EqualTo, LessThan, LessThanOrEqual)):
                    high = min(high, value - (1 if isinstance(f, LessThan) else 0))
                ranges[column] = (low, high)
                continue
        rejected.append(f)
    pushed = RowFilter(tuple((c, tuple(sorted(v))) for c, v in sorted(sets.items())),
                       tuple((c, lo, hi) for c, (lo, hi) in sorted(ranges.items())))
    # IS NOT NULL holds for a column never null, or one a pushed filter already checks
    implied = _NEVER_NULL | sets.keys() | ranges.keys()
    return pushed, [f for f in rejected if not (
        isinstance(f, IsNotNull) and len(f.attribute) == 1 and f.attribute[0] in implied)]


# --------------------------------------------------------------------------- planning


def narrow_ranges(store, ranges: list, pushed: RowFilter) -> list:
    """The queue ranges (:class:`~rmq_source.partitions.QueueRange`) of a store that can hold
    rows passing ``pushed``: other topics and queues dropped, each range cut to the queue
    offsets, store times and CommitLog offsets asked for.  Runs on the driver."""
    if pushed.nothing:
        return []
    topics, queue_ids = pushed.values("topic"), pushed.values("queue_id")
    out = []
    for r in ranges:
        if (topics is not None and r.topic not in topics) or (
                queue_ids is not None and r.queue_id not in queue_ids):
            continue
        start, end = r.start, r.end
        bounds = pushed.bounds("queue_offset")
        if bounds is not None:
            start, end = max(start, bounds[0]), min(end, bounds[1] + 1)
        bounds = pushed.bounds("store_timestamp")
        if bounds is not None and start < end:
            # store times are whole milliseconds: [low µs, high µs] -> [ceil ms, floor ms]
            start, end = _cut(start, end, bounds, partial(
                _first_at_store_time, store, r.topic, r.queue_id), scale=1000)
        bounds = pushed.bounds("commitlog_offset")
        if bounds is not None and start < end:
            start, end = _cut(start, end, bounds, partial(
                _first_at_commitlog_offset, store, r.topic, r.queue_id, start, end), scale=1)
        if start < end:
            out.append(type(r)(r.topic, r.queue_id, start, end))
    return out


def _cut(start: int, end: int, bounds: tuple[int, int], first_at, scale: int
         ) -> tuple[int, int]:
    """Cut ``[start, end)`` to the offsets whose value lies in ``bounds`` (inclusive, in
    units of ``1/scale`` of what ``first_at(value)`` searches: the first offset at or above
    it).  A search the store cannot answer leaves that side uncut (the rows are still
    checked one by one)."""
    low, high = bounds
    try:
        if low > _MIN:
            start = max(start, first_at(-(-low // scale)))
        if high < _MAX:
            end = min(end, first_at(high // scale + 1))
    except LookupError:
        pass
    return start, end


def _first_at_store_time(store, topic: str, queue_id: int, ms: int) -> int:
    """The store's ``offset_for_timestamp``; :class:`LookupError` when damage stops it."""
    try:
        return store.offset_for_timestamp(topic, queue_id, ms)
    except (StoreError, AssertionError) as exc:
        raise LookupError(str(exc)) from None


def _first_at_commitlog_offset(store, topic: str, queue_id: int, start: int, end: int,
                               offset: int) -> int:
    """The first queue offset in ``[start, end)`` whose CommitLog offset is >= ``offset``
    (``end`` when none is): a binary search over the queue's entries, which are in
    CommitLog order.  Raises :class:`LookupError` when the store cannot say (no
    ``queue_entries``, a blank entry)."""
    entries = getattr(store, "queue_entries", None)
    if entries is None:
        raise LookupError("the store does not give queue entries")
    low, high = start, end
    while low < high:
        mid = (low + high) // 2
        entry = entries(topic, queue_id, mid, mid + 1)
        if len(entry) != 1 or int(entry["size"][0]) <= 0:
            raise LookupError(f"no entry at queue offset {mid} of {topic}/{queue_id}")
        if int(entry["offset"][0]) < offset:
            low = mid + 1
        else:
            high = mid
    return low


# --------------------------------------------------------------------------- reading

#: read the matching rows again by runs (rather than all rows, then filter) when at most
#: one row in this many passes the probe
PROBE_SHARE = 8


def read_checked(read, start: int, end: int, pushed: RowFilter,
                 columns: tuple[str, ...] | None) -> list[pa.RecordBatch]:
    """The rows of queue offsets ``[start, end)`` that pass ``pushed``'s row checks.

    ``read(start, end, columns)`` is the store's ``read_arrow`` of the range's queue.  A probe
    first reads only ``queue_offset`` and the checked columns (no body; no properties unless
    a property column is checked); when few rows pass, only their runs of offsets are read
    whole, so that a selective filter on ``msg_id`` or a time decodes few bodies.
    """
    probe_columns = tuple(dict.fromkeys(("queue_offset",) + pushed.checked_columns))
    probe = read(start, end, probe_columns)
    keep = pushed.mask(probe)
    passed = pc.sum(keep).as_py() or 0
    if columns is not None and set(columns) <= set(probe_columns):
        return [probe.filter(keep).select(list(columns))]
    if passed == 0:
        return []
    if passed == probe.num_rows:
        return [read(start, end, columns)]
    if passed * PROBE_SHARE > probe.num_rows:
        whole = read(start, end, None if columns is None else tuple(dict.fromkeys(
            columns + pushed.checked_columns)))
        return [pushed.apply(whole, columns)]
    offsets = probe.column("queue_offset").filter(keep).to_numpy()
    runs = np.split(offsets, np.flatnonzero(np.diff(offsets) != 1) + 1)
    return [read(int(run[0]), int(run[-1]) + 1, columns) for run in runs]
