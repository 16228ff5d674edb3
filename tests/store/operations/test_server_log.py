"""What ``rmq serve`` logs about deliveries: nothing for a step that delivered nothing, and at
most one INFO line a second summing the steps that did (a fake clock moves the time)."""

from __future__ import annotations

import logging

from conftest import SMALL, FakeClock

from store import Message, StoreServer

LOGGER = "store.operations.server"


def _delivery_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.getMessage().startswith("delivered")]


def test_idle_steps_log_nothing_and_deliveries_log_once_a_second(store_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    server = StoreServer(store_path, SMALL, clock=clock)
    try:
        for _ in range(30):  # three idle seconds of steps
            server.step()
            clock.advance(SMALL.timer_precision_ms)
        assert _delivery_lines(caplog) == []

        producer = server.store.producer("g")
        for i in range(5):  # due 100 ms apart: five steps deliver one each, within 0.5 s
            producer.send(Message("t", b"x%d" % i), delay_ms=100 * (i + 1))
        for _ in range(6):
            clock.advance(SMALL.timer_precision_ms)
            server.step()
        assert server.counters.delivered == 5
        # the first delivery is logged at once; the next four wait for the second to pass
        assert _delivery_lines(caplog) == ["delivered 1 due message(s) in 1 step(s)"]
        for _ in range(10):  # idle steps until a second has passed: the sum, once
            clock.advance(SMALL.timer_precision_ms)
            server.step()
        assert _delivery_lines(caplog) == ["delivered 1 due message(s) in 1 step(s)",
                                           "delivered 4 due message(s) in 4 step(s)"]
        for _ in range(20):
            clock.advance(SMALL.timer_precision_ms)
            server.step()
        assert len(_delivery_lines(caplog)) == 2
    finally:
        server.close()


def test_a_run_ending_logs_what_it_delivered_since_the_last_line(store_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    server = StoreServer(store_path, SMALL, clock=clock)
    producer = server.store.producer("g")
    producer.send(Message("t", b"a"), delay_ms=100)
    producer.send(Message("t", b"b"), delay_ms=200)
    clock.advance(100)
    server.step()
    clock.advance(100)
    server.step()  # within the second: not logged yet
    assert len(_delivery_lines(caplog)) == 1
    server.run(duration_s=0)  # one more step, then the run ends: the rest is logged
    assert _delivery_lines(caplog)[-1] == "delivered 1 due message(s) in 1 step(s)"
