"""Lets ``spark.read.format("rmq")`` work with no register call (Spark scans ``pyspark_*``).

The data source is loaded when first used, so that a set-up problem (a ``store.py`` in the
job's directory shadowing rmq's package) surfaces as an error saying so, instead of Spark's
bare ``DATA_SOURCE_NOT_FOUND``.
"""

from pyspark.sql.datasource import DataSource


def _source_class():
    try:
        from rmq_source.source import RmqDataSource
    except ImportError as exc:
        from rmq_source.setup_check import store_package_problem

        problem = store_package_problem()
        raise ImportError(f"the rmq data source cannot load: {problem or exc}") from exc
    return RmqDataSource


class DefaultSource(DataSource):
    """``format("rmq")``: delegates to :class:`rmq_source.source.RmqDataSource`."""

    @classmethod
    def name(cls) -> str:
        return "rmq"

    def _source(self):
        source = self.__dict__.get("_rmq")
        if source is None:
            source = self.__dict__["_rmq"] = _source_class()(self.options)
        return source

    def schema(self):
        return self._source().schema()

    def reader(self, schema):
        return self._source().reader(schema)

    def streamReader(self, schema):
        return self._source().streamReader(schema)

    def writer(self, schema, overwrite):
        return self._source().writer(schema, overwrite)

    def streamWriter(self, schema, overwrite):
        return self._source().streamWriter(schema, overwrite)


__all__ = ["DefaultSource"]
