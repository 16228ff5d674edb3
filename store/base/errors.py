"""Typed errors of the message store.

Every failure the store reports is a :class:`StoreError` subclass whose message says what
was wrong, the value given and what is allowed.  "No new message" is never an exception:
reads return an empty result instead.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error raised by the ``store`` package."""


class InvalidConfigError(StoreError, ValueError):
    """A :class:`~store.base.config.StoreConfig` field is missing, unknown or out of range."""


class ConfigMismatchError(StoreError):
    """A store was reopened with a setting that contradicts the one recorded on disk."""


class InvalidTopicError(StoreError, ValueError):
    """A topic name breaks RocketMQ's naming rules or names a system topic."""


class InvalidMessageError(StoreError, ValueError):
    """A message body, tag, key or property breaks a RocketMQ limit."""


class MessageTooLargeError(InvalidMessageError):
    """A body, properties string or batch exceeds its size limit."""


class InvalidBatchError(InvalidMessageError):
    """A batch breaks RocketMQ's batch rules (one topic, no delay, no retry topic, 4 MiB)."""


class InvalidDelayError(InvalidMessageError):
    """A delay level, delay or deliver time is not allowed."""


class InvalidScheduleError(InvalidMessageError):
    """A recurring schedule's cron expression, interval, time zone or bounds are not allowed."""


class ScheduleIntervalError(InvalidScheduleError):
    """A recurring schedule's ``every_ms`` is below the store's floor
    (``StoreConfig.schedule_min_interval_ms``)."""


class UnknownMessageError(StoreError, LookupError):
    """A message id (for cancel) or transaction id is not known to the store."""


class TimerFlowControlError(StoreError):
    """A timer message was refused because its wheel slot is congested (RocketMQ's
    WHEEL_TIMER_FLOW_CONTROL; only with ``timer_congest_num_each_slot`` set)."""


class TransactionStateError(StoreError, ValueError):
    """An end-transaction request names an invalid state or a non-transactional message."""


class DiskFullError(StoreError, OSError):
    """The filesystem holding the store has no space left (ENOSPC); what was being written
    did not land (an append is cut back as after a crash), stored data is intact."""


class SinkCommitError(StoreError):
    """A batch of the exactly-once sink cannot commit: a half it lists is no longer open."""


class InvalidGroupError(StoreError, ValueError):
    """A store group's member list (``group.json``) or a member name breaks the group's rules."""


class OffsetOutOfRangeError(StoreError, LookupError):
    """A requested queue offset was removed by retention or lies beyond the queue's end."""


class KeyIndexUnavailableError(StoreError, LookupError):
    """A query by key on a store without a message-key index (``message_index_enable`` was
    off when its messages were written, and no ``index/`` file holds them)."""


class UnknownTopicError(StoreError, LookupError):
    """A topic or queue id that the store does not hold."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """A directory opened read-only is not an rmq store."""


class StoreClosedError(StoreError):
    """The store was used after :meth:`~store.MessageStore.close`."""


class ReadOnlyStoreError(StoreClosedError):
    """A write operation was called on a store opened read-only (the message names it)."""

    def __init__(self, root: str, operation: str) -> None:
        self.root = root
        self.operation = operation
        super().__init__(
            f"{operation}() writes to the store, but store {root} was opened read-only; "
            "open it with MessageStore.open(path) to write")


class FlushError(StoreError):
    """The background flush could not make appended data durable (the cause is chained).

    Raised by the next write or :meth:`~store.MessageStore.flush` after the flush thread
    failed; the failure is also logged when it happens.
    """


class CorruptRecordError(StoreError):
    """A stored record could not be decoded.

    Parameters
    ----------
    file : str
        The segment file (or store path) the record was read from.
    position : int
        Its absolute CommitLog offset (or byte position in ``file``).
    reason : str
        What was wrong with it.
    """

    def __init__(self, file: str, position: int, reason: str) -> None:
        self.file = file
        self.position = position
        self.reason = reason
        super().__init__(f"corrupt record in {file} at position {position}: {reason}")


class RemoteError(StoreError):
    """A store served over the network (``rmq://``) could not be reached or answered wrongly:
    refused, timed out, or the connection was lost.  The message names the address."""


class AuthenticationError(RemoteError):
    """A served store refused a request: its token is missing or wrong (nothing was done)."""


class StoreReplacedError(StoreClosedError):
    """The store directory was removed or replaced while this process had it open: the
    process stopped writing to it (reopen the store at its path to use what is there now)."""


class StoreFormatError(ConfigMismatchError):
    """The store's on-disk format version is one this rmq cannot read (newer than it, or
    older with no step forward): nothing was changed."""


class AccessDeniedError(RemoteError, PermissionError):
    """A served store refused a request its account has no right to (a topic it may not
    publish to or read, an action for admins); nothing was done."""


class ReplicationError(StoreError):
    """A replica could not copy the CommitLog from its leader, or a leader refused to send
    it: different segment sizes, an offset its log no longer holds, bytes that fail the
    record checks (the message says which)."""


class ReplicaDivergedError(ReplicationError):
    """A follower's CommitLog is not a prefix of its leader's (its end lies past the
    leader's, inside a record, or its last bytes differ): it refuses to follow."""


class NotLeaderError(StoreError):
    """A write was sent to a follower of a replica set: only the leader takes writes (the
    message names it)."""


class LeaderDeposedError(NotLeaderError):
    """A write on a replica set's leader with ``min_insync_replicas`` above 1 was appended
    there and waited for its copies, but the replica no longer led when they came (deposed
    by the voters, or its lease ran out).  It was **not acknowledged**, but unlike a plain
    :class:`NotLeaderError` it may be stored: the sender retries only what is safe to repeat
    (with a key, to find a duplicate)."""


class SendOutcomeUnknownError(RemoteError):
    """The connection to a replica set's leader broke during a send that is not safe to
    repeat: it may or may not be stored (the message says how to find out); the client
    does not send it again by itself."""


class ReplicaBehindError(ReplicationError):
    """A follower asked to become leader holds less than its leader acknowledged (as far as
    it last heard): promoting it would lose acknowledged messages (``--force`` does)."""


class ConsumerProgressError(ReplicationError):
    """A copy of a leader's consumer progress (the gRPC face's groups) was malformed or
    beyond its bounds (the message says what); nothing of it was written."""


class ReplicaAckTimeoutError(ReplicationError):
    """A write on a replica set's leader with ``min_insync_replicas`` above 1 was appended
    there, but not enough replicas reported holding it within ``replica_ack_timeout_ms``.
    It was **not acknowledged**: the write may or may not survive a change of leader; the
    sender retries (with a key, to find a duplicate) as after any unanswered send."""


class ReplicaWriterError(ReplicationError):
    """A process other than the replica set's server tried to append to a leader's directory
    that requires ``min_insync_replicas`` above 1: its writes could not be waited for, so
    they are refused (write through the server's URL)."""
