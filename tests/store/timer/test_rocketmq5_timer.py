"""Taking over the timer of a store a RocketMQ 5 broker wrote.

No RocketMQ 5 store is among the fixtures, so the broker's store is made from an rmq store
with every file and field of rmq's own removed: ``config/store.json``, ``queueTable.json``
and the timer's owner mark ``timercheck.rmq`` deleted, the ``checkpoint`` reduced to
RocketMQ's 40 bytes and ``config/timercheck`` to RocketMQ 5's 56 (``timerwheel``, ``timerlog`` and the timer
ConsumeQueue already have RocketMQ 5's layout, tag hashes included).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter

import pytest
from conftest import SMALL
from queue_reading import visible  # noqa: E402  (tests/ helper)

from store import Message, MessageStore, StoreReader
from store.base.errors import ConfigMismatchError
from store.formats.message import TIMER_TOPIC
from store.timer import timer_checkpoint as ckpt


def _strip_rmq_fields(path: str) -> None:
    for name in ("store.json", "store.json.bak", "queueTable.json", "queueTable.json.bak",
                 "timercheck.rmq"):
        full = os.path.join(path, "config", name)
        if os.path.exists(full):
            os.remove(full)
    for name, keep in (("checkpoint", 40), (os.path.join("config", "timercheck"), 56)):
        full = os.path.join(path, name)
        with open(full, "r+b") as fh:
            data = fh.read()
            fh.seek(0)
            fh.write(data[:keep] + bytes(len(data) - keep))


def _digest(path: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def _broker_store(path, clock):
    """A store with timer messages delivered, pending in the wheel, rolled and queued."""
    with MessageStore.open(path, SMALL, clock=clock) as s:
        p = s.producer("g")
        sent = [p.send(Message("t", b"soon-%d" % i, tags="S"), delay_ms=500 + 100 * i)
                for i in range(20)]
        sent += [p.send(Message("t", b"far-%d" % i), delay_ms=200_000 + i) for i in range(5)]
        clock.advance(1_050)
        delivered = s.deliver_due()
        assert 0 < delivered < 20
        sent += [p.send(Message("t", b"queued-%d" % i), delay_ms=3_000) for i in range(5)]
        state = ckpt.load(os.path.join(path, "config", "timercheck"))
    _strip_rmq_fields(path)
    return sent, delivered, state


def test_a_rocketmq5_wheel_is_taken_over_not_rebuilt(store_path, clock):
    sent, delivered, before = _broker_store(store_path, clock)
    stripped = ckpt.load(os.path.join(store_path, "config", "timercheck"))
    assert ckpt.written_by_rocketmq(stripped)
    log_digest = _digest(os.path.join(store_path, "timerlog"))
    with MessageStore.open(store_path, SMALL, clock=clock) as s:
        state = ckpt.load(os.path.join(store_path, "config", "timercheck"))
        assert (state.last_timer_queue_offset, state.last_read_time_ms,
                state.last_timer_log_flush_pos) == (before.last_timer_queue_offset,
                                                    before.last_read_time_ms,
                                                    before.last_timer_log_flush_pos)
        assert (state.precision_ms, state.wheel_slots, state.deliver_mark) == (
            SMALL.timer_precision_ms, SMALL.timer_wheel_slots, -1)
        assert _digest(os.path.join(store_path, "timerlog")) == log_digest  # not rebuilt
        assert len(visible(s, "t")) == delivered  # nothing delivered again at open
        for _ in range(30):
            clock.advance(10_000)
            s.deliver_due()
        views = visible(s, "t")
        counts = Counter(v.msg_id for v in views)
        assert counts == Counter(r.msg_id for r in sent)  # each exactly once
        assert all(v.store_timestamp_ms >= v.deliver_timestamp_ms for v in views)


def test_a_broker_wheel_of_another_precision_is_refused(store_path, clock):
    _broker_store(store_path, clock)
    with pytest.raises(ConfigMismatchError, match="timer_precision_ms"):
        MessageStore.open(store_path, SMALL.replace(timer_precision_ms=1000), clock=clock)
    # nothing of the broker's timer was changed by the refused open (no owner mark either)
    path = os.path.join(store_path, "config", "timercheck")
    assert ckpt.written_by_rocketmq(ckpt.load(path), path)
    assert not ckpt.marked_as_rmqs(path)


def _tree(path: str) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def test_a_refused_open_writes_nothing(store_path, clock):
    """A writable open refused for the broker's timer precision recorded that precision in
    ``config/store.json`` (the next open then took it for the store's own)."""
    _broker_store(store_path, clock)
    before = _tree(store_path)
    with pytest.raises(ConfigMismatchError, match="timer_precision_ms"):
        MessageStore.open(store_path, SMALL.replace(timer_precision_ms=1000), clock=clock)
    after = _tree(store_path)
    assert ",".join(sorted(k for k, v in after.items() if before.get(k) != v)) == ""
    with MessageStore.open(store_path, SMALL, clock=clock) as s:  # the right one still opens
        assert s.config.timer_precision_ms == SMALL.timer_precision_ms


def test_a_rocketmq5_store_reads_without_writing_a_byte(store_path, clock):
    sent, delivered, _ = _broker_store(store_path, clock)
    before = _tree(store_path)
    with StoreReader.open(store_path) as reader:
        assert reader.topics() == ["t"]  # rmq_sys_wheel_timer stays hidden
        views = visible(reader, "t")
        assert len(views) == delivered
        assert {v.msg_id for v in views} <= {r.msg_id for r in sent}
        assert TIMER_TOPIC in reader.topics(include_system=True)
    assert _tree(store_path) == before
