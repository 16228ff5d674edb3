"""Lets ``spark.read.format("rmq")`` work with no register call (Spark scans ``pyspark_*``)."""

from rmq_source.source import RmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
