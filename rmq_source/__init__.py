"""rmq_source: the PySpark Python Data Source ``rmq`` over a :mod:`store` directory.

>>> df = spark.read.format("rmq").option("subscribe", "orders").load("/data/rmq")  # doctest: +SKIP

Importing this package does not import PySpark; :class:`RmqDataSource` is loaded on first use.
"""

from __future__ import annotations

from .errors import DataLossError, InvalidOptionError, RmqSourceError

__all__ = ["DataLossError", "InvalidOptionError", "RmqDataSource", "RmqSourceError"]


def __getattr__(name: str):
    if name == "RmqDataSource":
        from .source import RmqDataSource

        return RmqDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
