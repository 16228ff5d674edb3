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

from .transaction.published_checks import (drop_query_rounds, last_check_round,
                                           read_check_round_table, read_query_round,
                                           write_query_round)
from .formats.record_codec import Record, RecordSpec
from .base.config import StoreConfig
from .core.append_types import AppendResult, BatchAppendResult
from .core.arrow_decode import MESSAGE_SCHEMA, keep_freed_heap
from .core.reading import system_clock
from .base.errors import (
                     ConfigMismatchError,
                     CorruptRecordError,
                     DiskFullError,
                     FlushError,
                     InvalidBatchError,
                     InvalidConfigError,
                     InvalidDelayError,
                     InvalidGroupError,
                     InvalidMessageError,
                     InvalidScheduleError,
                     ScheduleIntervalError,
                     InvalidTopicError,
                     MessageTooLargeError,
                     OffsetOutOfRangeError,
                     ReadOnlyStoreError,
                     AuthenticationError,
                     RemoteError,
                     SinkCommitError,
                     StoreClosedError,
                     StoreError,
                     StoreFormatError,
                     StoreNotFoundError,
                     StoreReplacedError,
                     NotLeaderError,
                     LeaderDeposedError,
                     ReplicaAckTimeoutError,
                     ReplicaBehindError,
                     SendOutcomeUnknownError,
                     ReplicaDivergedError,
                     ReplicationError,
                     ReplicaWriterError,
                     TimerFlowControlError,
                     TransactionStateError,
                     UnknownMessageError,
                     UnknownTopicError,
                     KeyIndexUnavailableError,
)
from .formats.message import (
                     LocalTransactionState,
                     Message,
                     MessageView,
                     SendResult,
                     TransactionListener,
                     is_system_topic,
                     java_string_hash,
                     validate_group,
                     validate_topic,
)
from .group.store_group import GroupProducer, GroupSink, StoreGroup
from .files.group_file import is_group as is_store_group
from .facade.message_store import MessageStore
from .facade.store_reader import StoreReader
from .operations.face_limits import FaceLimits
from .operations.server import StoreServer, server_status
from .operations.warm_up import warm_up
from .operations.promotion import promote_replica
from .replication.replica import replication_status
from .replication.witness import Witness
from .remote import connect
from .base.remote_address import is_remote, read_token
from .schedule.cron import CronExpression
from .schedule.schedule_table import ScheduleTableResult
from .schedule.recurring_schedule import ScheduleInfo
from .sink.sink import Sink, SinkCommit

__all__ = [
    "MESSAGE_SCHEMA",
    "AppendResult", "BatchAppendResult", "ConfigMismatchError", "CorruptRecordError",
    "DiskFullError", "FlushError", "InvalidBatchError",
    "GroupProducer", "GroupSink", "InvalidGroupError", "StoreGroup", "is_store_group",
    "InvalidConfigError", "InvalidDelayError", "InvalidMessageError", "InvalidTopicError",
    "CronExpression", "InvalidScheduleError", "ScheduleIntervalError", "ScheduleInfo",
    "ScheduleTableResult",
    "LocalTransactionState", "Message", "MessageStore", "MessageTooLargeError", "MessageView",
    "OffsetOutOfRangeError", "ReadOnlyStoreError", "Record", "RecordSpec", "SendResult",
    "Sink", "SinkCommit", "SinkCommitError",
    "StoreClosedError", "StoreConfig", "StoreError", "StoreFormatError", "StoreNotFoundError",
    "StoreReader", "StoreReplacedError", "StoreServer", "FaceLimits",
    "TimerFlowControlError", "TransactionListener", "TransactionStateError",
    "UnknownMessageError", "UnknownTopicError", "KeyIndexUnavailableError", "is_system_topic", "java_string_hash",
    "last_check_round", "read_check_round_table", "server_status", "system_clock", "validate_group",
    "keep_freed_heap", "warm_up",
    "validate_topic",
    "connect", "is_remote", "read_token", "RemoteError", "AuthenticationError",
    "write_query_round", "read_query_round", "drop_query_rounds",
    "NotLeaderError", "LeaderDeposedError", "SendOutcomeUnknownError",
    "ReplicaAckTimeoutError", "ReplicaBehindError", "ReplicaDivergedError", "ReplicationError",
    "ReplicaWriterError",
    "replication_status", "promote_replica", "Witness",
]
