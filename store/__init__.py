"""rmq store: a file-backed message store in the shape of Apache RocketMQ's broker store.

The CommitLog (append-only segments) is the only truth; ConsumeQueues index it per topic
and queue.  Delayed messages (4.x delay levels and the 5.x timer wheel) and transactional
messages work through system topics, as in RocketMQ.  This package never imports Spark.

Example
-------
>>> from store import MessageStore, Message
>>> with MessageStore.open("/tmp/rmq-doc") as store:       # doctest: +SKIP
...     r = store.producer("g").send(Message("orders", b"hi", tags="created"))
...     store.pull("orders", r.queue_id, r.queue_offset)
"""

from .arrow_decode import MESSAGE_SCHEMA, MESSAGE_SPARK_DDL
from .codec import Record, RecordSpec
from .config import StoreConfig
from .errors import (ConfigMismatchError, CorruptRecordError, InvalidBatchError,
                     InvalidConfigError, InvalidDelayError, InvalidMessageError,
                     InvalidTopicError, MessageTooLargeError, OffsetOutOfRangeError,
                     StoreClosedError, StoreError, StoreNotFoundError, TransactionStateError,
                     UnknownMessageError,                      UnknownTopicError)
from .message import (LocalTransactionState, Message, MessageView, SendResult,
                      TransactionListener, is_system_topic, java_string_hash, validate_topic)
from .message_store import AppendResult, MessageStore, system_clock

__all__ = [
    "MESSAGE_SCHEMA", "MESSAGE_SPARK_DDL",
    "AppendResult", "ConfigMismatchError", "CorruptRecordError", "InvalidBatchError",
    "InvalidConfigError", "InvalidDelayError", "InvalidMessageError", "InvalidTopicError",
    "LocalTransactionState", "Message", "MessageStore", "MessageTooLargeError", "MessageView",
    "OffsetOutOfRangeError", "Record", "RecordSpec", "SendResult", "StoreClosedError",
    "StoreConfig", "StoreError", "StoreNotFoundError", "TransactionListener",
    "TransactionStateError",
    "UnknownMessageError", "UnknownTopicError", "is_system_topic", "java_string_hash",
    "system_clock", "validate_topic",
]
