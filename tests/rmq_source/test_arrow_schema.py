"""The hard-coded Arrow schema of decoded batches is exactly what Spark expects for the DDL."""

from __future__ import annotations

import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rmq_source.schema import MESSAGE_SPARK_DDL
from store.core.arrow_decode import MESSAGE_SCHEMA, empty_batch

# MESSAGE_SPARK_DDL written out by hand (all nullable, as the DDL parser makes them)
SPARK_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("queue_id", IntegerType()),
    StructField("queue_offset", LongType()),
    StructField("commitlog_offset", LongType()),
    StructField("msg_id", StringType()),
    StructField("tags", StringType()),
    StructField("keys", ArrayType(StringType())),
    StructField("body", BinaryType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("born_timestamp", TimestampType()),
    StructField("store_timestamp", TimestampType()),
    StructField("deliver_timestamp", TimestampType()),
    StructField("transaction_id", StringType()),
    StructField("reconsume_times", IntegerType()),
])


def test_message_schema_is_sparks_arrow_schema_without_a_session():
    expected = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
    assert MESSAGE_SCHEMA.equals(expected, check_metadata=True)
    # field by field too, so a failure names the column (nested names and nullability count)
    for ours, theirs in zip(MESSAGE_SCHEMA, expected):
        assert ours.equals(theirs), (ours, theirs)
    assert str(MESSAGE_SCHEMA.field("born_timestamp").type) == "timestamp[us, tz=UTC]"
    assert str(MESSAGE_SCHEMA.field("body").type) == "binary"
    assert empty_batch().schema.equals(expected)


@pytest.mark.spark
def test_ddl_string_is_the_same_spark_schema(spark):
    from pyspark.sql.types import _parse_datatype_string

    parsed = _parse_datatype_string(MESSAGE_SPARK_DDL)
    assert parsed == SPARK_SCHEMA
    assert MESSAGE_SCHEMA.equals(to_arrow_schema(parsed, timezone="UTC"))
