"""``deliverDue`` in a streaming runner: a bounded step per trigger, the rest in the background."""

from __future__ import annotations

import time

from rmq_source import delivery
from store import Message, MessageStore


def test_a_trigger_delivers_one_step_and_the_drain_the_rest_once(store_path, small_config):
    with MessageStore.open(store_path, small_config) as s:
        p = s.producer("g")
        for i in range(500):
            p.send(Message("t", b"%d" % i), delay_ms=150)
    time.sleep(0.5)  # all due (precision 100 ms)
    try:
        assert delivery.deliver_due_kept_open(store_path, max_messages=64) == 64
        deliverer = delivery._deliverers[store_path]
        assert deliverer.thread is not None  # the step was full: a drain goes on
        deliverer.thread.join(30)
        assert not deliverer.thread.is_alive()
        assert delivery.deliver_due_kept_open(store_path, max_messages=64) == 0
    finally:
        delivery.close_kept_open(store_path)
    with MessageStore.open(store_path, small_config, read_only=True) as s:
        got = []
        for q in s.queue_ids("t"):
            got += [int(v.body) for v in s.pull("t", q, 0, 1000)]
        assert sorted(got) == list(range(500))  # every message once
