"""Typed errors of the ``rmq`` Spark source.

Every message names the option (or queue), the value given and what is allowed, because the
message text is what users read inside Spark's ``PythonException`` / ``STREAM_FAILED`` wrapper.
"""

from __future__ import annotations


class RmqSourceError(Exception):
    """Base class of every error raised by the ``rmq_source`` package."""


class InvalidOptionError(RmqSourceError, ValueError):
    """A data source option is unknown, missing, malformed or not allowed in this mode."""


class DataLossError(RmqSourceError):
    """Requested offsets were removed by retention and ``failOnDataLoss`` is ``true``."""


class OffsetsPastEndError(DataLossError):
    """A query's offsets (its checkpoint, or a batch planned before a restart) lie past a
    queue's end: the store no longer holds messages the query had read, or planned to read
    (a failover to a replica that had not copied them, a restore from an older copy, a crash
    with ``ASYNC_FLUSH``), and ``failOnDataLoss`` is ``true``."""
