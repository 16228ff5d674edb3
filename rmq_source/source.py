"""``RmqDataSource``: the PySpark Python Data Source named ``rmq``.

``format("rmq")`` works with no register call through the ``pyspark_rmq`` shim (Spark scans
top-level ``pyspark_*`` modules); ``spark.dataSource.register(RmqDataSource)`` works too.
Options are parsed once per reader or writer (:func:`rmq_source.options.parse_options`), so a
bad option fails when the query starts.  The ``transaction_checks`` view and the
``end_transaction`` writer live in their own modules and are imported only when used.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from store import MESSAGE_SCHEMA

from .errors import InvalidOptionError
from .options import RmqOptions, parse_options
from .schema import MESSAGE_SPARK_DDL


class RmqDataSource(DataSource):
    """The ``rmq`` data source: batch and streaming reads of a store, and its writer.

    Views (option ``view``): ``messages`` (default; batch and streaming) and
    ``transaction_checks`` (streaming).  Writing: messages through the exactly-once sink
    (:mod:`rmq_source.sink_writer`), or ``action=end_transaction``.
    """

    @classmethod
    def name(cls) -> str:
        return "rmq"

    def _options(self, *, streaming: bool | None, write: bool = False) -> RmqOptions:
        return parse_options(dict(self.options), streaming=streaming, write=write)

    def schema(self) -> str:
        if "action" in self.options:  # a write: the rows it takes
            return "transaction_id string, state string"
        if "subscribe" not in self.options and "subscribepattern" not in self.options and \
                "view" not in self.options:  # a write of messages: the sink's columns
            return "topic string, body binary"
        opts = self._options(streaming=None)
        if opts.view == "transaction_checks":
            from .transaction_checks import TRANSACTION_CHECKS_DDL

            return TRANSACTION_CHECKS_DDL
        return MESSAGE_SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from .batch_reader import RmqBatchReader

        opts = self._options(streaming=False)
        _check_schema(schema)
        return RmqBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._options(streaming=True)
        if opts.view == "transaction_checks":
            from .transaction_checks import TransactionChecksStreamReader

            return TransactionChecksStreamReader(opts)
        from .stream_reader import RmqStreamReader

        _check_schema(schema)
        return RmqStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = self._options(streaming=False, write=True)
        if opts.action is None:
            from .sink_writer import RmqSinkWriter

            return RmqSinkWriter(opts, schema)
        from .writer import EndTransactionWriter

        return EndTransactionWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = self._options(streaming=True, write=True)
        if opts.action is None:
            from .sink_writer import RmqSinkStreamWriter

            return RmqSinkStreamWriter(opts, schema)
        from .writer import EndTransactionStreamWriter

        return EndTransactionStreamWriter(opts)


def _check_schema(schema: StructType) -> None:
    """A user-given schema must be the messages schema (the rows are decoded in that shape)."""
    given = [f.name for f in schema.fields]
    expected = list(MESSAGE_SCHEMA.names)
    if given != expected:
        raise InvalidOptionError(
            f"schema with columns {given} was given; allowed: no .schema(...) call, or the "
            f"messages schema {MESSAGE_SPARK_DDL}")
