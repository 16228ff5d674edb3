"""What writes to a served store: :class:`RemoteProducer`, :class:`RemoteTransactionProducer`
and :class:`RemoteSink`, with the results and the typed errors of the local
:class:`~store.produce.producer.Producer`, transaction producer and :class:`~store.Sink`.

They are made by :class:`~store.remote.flight_client.RemoteStore` (``producer``,
``transaction_producer``, ``sink``) and hold it as ``store``; each call is one of its Flight
calls (``_action``, ``_put``, ``_exchange``: a replica set's leader found and called again as
:mod:`store.remote.failover` says), whose request bodies are formed here.  Nothing here
imports ``pyarrow.flight``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from ..formats.message import LocalTransactionState, Message, SendResult
from ..produce.table_rows import as_table
from ..produce.transaction_producer import TransactionSendResult
from ..sink.sink import SinkCommit
from ..timer.delay_keys import key_list
from ..transaction.check_loop import parse_state
from .wire import RESULT_FIELDS, b64, loads, schedule_info


def _message_body(message: Message) -> dict:
    body = message.body
    if isinstance(body, str):
        body = body.encode("utf-8")
    keys = message.keys
    if isinstance(keys, tuple):
        keys = list(keys)
    return {"topic": message.topic, "body": b64(body), "tags": message.tags, "keys": keys,
            "properties": dict(message.properties or {}), "flag": message.flag}


def _send_result(fields: dict, cls=SendResult, **extra) -> SendResult:
    return cls(**{k: fields.get(k) for k in RESULT_FIELDS}, **extra)


class RemoteProducer:
    """``send``, ``send_batch``, ``send_table`` and ``cancel`` of one producer group, on a
    served store (results and errors as :class:`~store.produce.producer.Producer`'s)."""

    def __init__(self, store, group: str) -> None:
        self.store = store
        self.group = group
        #: the member's name when the store belongs to a store group (set by the group)
        self.store_name: str | None = None

    def send(self, message: Message, *, delay_level: int | None = None,
             delay_ms: int | None = None, deliver_at_ms: int | None = None,
             queue_id: int | None = None, sharding_key: str | None = None,
             key: str | None = None) -> SendResult:
        fields = self.store._action("send", {
            "group": self.group, "message": _message_body(message), "delay_level": delay_level,
            "delay_ms": delay_ms, "deliver_at_ms": deliver_at_ms, "queue_id": queue_id,
            "sharding_key": sharding_key, "key": key})
        return _send_result(fields, store_name=self.store_name)

    def send_batch(self, messages: Sequence[Message], *, queue_id: int | None = None,
                   sharding_key: str | None = None) -> list[SendResult]:
        answer = self.store._action("send_batch", {
            "group": self.group, "messages": [_message_body(m) for m in messages],
            "queue_id": queue_id, "sharding_key": sharding_key})
        return [_send_result(r, store_name=self.store_name) for r in answer["results"]]

    def send_table(self, data, *, topic: str | None = None) -> pa.Table:
        """A table of messages, as ``Producer.send_table``: validated and stored on the server;
        returns the results table."""
        return self.store._exchange({"op": "send_table", "group": self.group, "topic": topic},
                                    as_table(data))

    def cancel(self, topic: str | None = None, msg_id: str | None = None, *,
               key: str | None = None) -> bool:
        return bool(self.store._action("cancel", {"group": self.group, "topic": topic,
                                                  "msg_id": msg_id, "key": key})["cancelled"])

    def cancel_keys(self, keys) -> np.ndarray:
        """As ``Producer.cancel_keys``: per key, whether it named a pending message."""
        answer = self.store._action("cancel_keys", {"group": self.group, "keys": key_list(keys)})
        return np.array(answer["cancelled"], dtype=bool)

    def pending_keys(self, keys) -> np.ndarray:
        """As ``Producer.pending_keys``."""
        answer = self.store._action("pending_keys", {"group": self.group, "keys": key_list(keys)})
        return np.array(answer["pending"], dtype=bool)

    def replace_table(self, data, *, topic: str | None = None) -> pa.Table:
        """As ``Producer.replace_table``, stored on the server; returns the results table."""
        return self.store._exchange({"op": "replace_table", "group": self.group,
                                     "topic": topic}, as_table(data))

    def schedule_table(self, data, *, topic: str | None = None):
        """As ``Producer.schedule_table``, applied by the served store."""
        from ..schedule.schedule_table import ScheduleTableResult

        out = self.store._exchange({"op": "schedule_table", "group": self.group,
                                    "topic": topic}, as_table(data)).to_pylist()[0]
        return ScheduleTableResult(out["changed"], out["unchanged"], out["removed"])

    def schedule(self, message: Message, *, key: str, cron: str | None = None,
                 every_ms: int | None = None, tz: str = "UTC", start_at_ms: int | None = None,
                 end_at_ms: int | None = None, max_fires: int | None = None,
                 catch_up: str = "latest_once", catch_up_window_ms: int | None = None):
        """As ``Producer.schedule``: a recurring schedule kept by the served store."""
        answer = self.store._action("schedule", {
            "group": self.group, "message": _message_body(message), "key": key, "cron": cron,
            "every_ms": every_ms, "tz": tz, "start_at_ms": start_at_ms,
            "end_at_ms": end_at_ms, "max_fires": max_fires, "catch_up": catch_up,
            "catch_up_window_ms": catch_up_window_ms})
        return schedule_info(answer["schedule"])


class RemoteTransactionProducer(RemoteProducer):
    """Transactional sends on a served store: the half message is stored there, the local
    transaction runs here, and its answer ends the half there."""

    def __init__(self, store, group: str, listener) -> None:
        super().__init__(store, group)
        self.listener = listener

    def send_in_transaction(self, message: Message, arg: object = None
                            ) -> TransactionSendResult:
        fields = self.store._action("send_half", {"group": self.group,
                                                  "message": _message_body(message)})
        error = None
        try:
            answer = self.listener.execute_local_transaction(message, arg)
            state = LocalTransactionState.UNKNOW if answer is None else parse_state(answer)
        except Exception as exc:  # noqa: BLE001 - user code; the outcome is unknown
            error = f"{type(exc).__name__}: {exc}"
            state = LocalTransactionState.UNKNOW
        ended = False
        if state is not LocalTransactionState.UNKNOW:
            ended = self.store.end_transaction(fields["transaction_id"], state)
        return _send_result(fields, TransactionSendResult, local_state=state, ended=ended,
                            error=error, half_topic=fields.get("half_topic"),
                            store_name=self.store_name)


class RemoteSink:
    """The exactly-once sink ``sink_id`` on a served store (as :class:`~store.Sink`)."""

    def __init__(self, store, sink_id: str, group: str,
                 commit: str = "index") -> None:
        self.store = store
        self.sink_id = sink_id
        self.group = group
        self.commit_mode = commit

    def _body(self, **more) -> dict:
        return {"sink_id": self.sink_id, "group": self.group, **more}

    def stage(self, data, *, topic: str | None = None) -> list[str]:
        """Validate and stage rows on the server; return the halves' ids."""
        raw = self.store._put({"op": "sink_stage", **self._body(topic=topic),
                               "commit": self.commit_mode}, as_table(data))
        return list(loads(raw, "the answer of sink_stage")["transactions"])

    def commit(self, batch_id: int, transactions: Iterable[str]) -> SinkCommit:
        done = self.store._action("sink_commit", self._body(
            batch_id=int(batch_id), transactions=list(transactions)))
        return SinkCommit(done["rows"], done["halves"], done["rolled_back"], done["replayed"])

    def abort(self) -> int:
        return int(self.store._action("sink_abort", self._body())["rolled_back"])

    def open_halves(self) -> list[str]:
        return list(self.store._action("sink_open_halves", self._body())["transactions"])

    def committed_batches(self) -> dict[int, dict]:
        done = self.store._action("sink_committed_batches", self._body())["batches"]
        return {int(k): v for k, v in done.items()}
