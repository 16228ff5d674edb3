"""``RmqDataSource``: the PySpark Python Data Source named ``rmq``.

``format("rmq")`` works with no register call through the ``pyspark_rmq`` shim (Spark scans
top-level ``pyspark_*`` modules); ``spark.dataSource.register(RmqDataSource)`` works too.
Options are parsed once per reader or writer (:func:`rmq_source.options.parse_options`), so a
bad option fails when the query starts.  The ``transaction_checks`` view and the
``end_transaction`` writer live in their own modules and are imported only when used.
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .errors import InvalidOptionError
from .options import RmqOptions, parse_options
from .schema import MESSAGE_SPARK_DDL, MESSAGE_SPARK_TYPES


class RmqDataSource(DataSource):
    """The ``rmq`` data source: batch and streaming reads of a store, and its writer.

    Views (option ``view``): ``messages`` (default; batch and streaming),
    ``transaction_checks`` (streaming) and ``schedules`` (batch).  Writing: messages through the exactly-once sink
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
        if opts.view == "schedules":
            from .schedules_view import SCHEDULES_DDL

            return SCHEDULES_DDL
        if opts.view == "transaction_checks":
            from .transaction_checks import TRANSACTION_CHECKS_DDL

            return TRANSACTION_CHECKS_DDL
        return MESSAGE_SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from .batch_reader import RmqBatchReader, RmqPushdownReader
        from .pushdown import check_push_option, spark_pushes_filters

        opts = self._options(streaming=False)
        if opts.view == "schedules":
            from .schedules_view import SchedulesReader

            return SchedulesReader(opts)
        # a reader with pushFilters only when Spark pushes: else it refuses the reader
        pushing = spark_pushes_filters()
        check_push_option(opts.push_filters, pushing)
        kind = RmqPushdownReader if pushing and opts.push_filters != "false" else RmqBatchReader
        return kind(replace(opts, columns=_check_schema(schema)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._options(streaming=True)
        if opts.view == "transaction_checks":
            from .stores import store_members
            from .transaction_checks import TransactionChecksStreamReader

            members = store_members(opts.path)
            if len(members) > 1:
                from .group_checks import GroupChecksStreamReader

                return GroupChecksStreamReader(opts, members)
            return TransactionChecksStreamReader(replace(opts, path=members[0][1]))
        from .stream_reader import RmqStreamReader

        return RmqStreamReader(replace(opts, columns=_check_schema(schema)))

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


def _check_schema(schema: StructType) -> tuple[str, ...] | None:
    """The message columns a user-given schema asks for (``None``: the whole messages schema).

    A schema may name any of the messages schema's columns, with their types, in any order;
    only those are decoded.
    """
    given = [f.name for f in schema.fields]
    if given == list(MESSAGE_SPARK_TYPES):
        return None
    wrong = [f"{f.name} {f.dataType.simpleString()}" for f in schema.fields
             if MESSAGE_SPARK_TYPES.get(f.name) != f.dataType.simpleString()]
    if wrong or not given or len(set(given)) != len(given):
        raise InvalidOptionError(
            f"schema with columns {given} was given ({', '.join(wrong) or 'repeated or none'} "
            "does not fit); allowed: any of the messages schema's columns with their types, "
            f"each once, in any order: {MESSAGE_SPARK_DDL}")
    return tuple(given)
