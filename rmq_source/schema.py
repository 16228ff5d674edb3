"""The Spark schema of the ``messages`` view, as a DDL string (the store's Arrow schema in Spark).

``store.MESSAGE_SCHEMA`` is the same schema in Arrow; a test checks that Spark turns this DDL
into exactly that Arrow schema.
"""

MESSAGE_SPARK_DDL = (
    "topic string, queue_id int, queue_offset bigint, commitlog_offset bigint, msg_id string, "
    "tags string, keys array<string>, body binary, properties map<string,string>, "
    "born_timestamp timestamp, store_timestamp timestamp, deliver_timestamp timestamp, "
    "transaction_id string, reconsume_times int"
)

#: Column name -> Spark type (``simpleString``) of :data:`MESSAGE_SPARK_DDL`.
MESSAGE_SPARK_TYPES = dict(part.split(" ", 1) for part in MESSAGE_SPARK_DDL.split(", "))
