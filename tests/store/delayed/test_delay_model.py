"""Model-based test of delayed delivery against a heap of due times.

Random sends (delay levels, relative and absolute timer delays, times in the past), cancels,
clock advances (up to weeks, far beyond the tiny wheel's span), deliveries and restarts.  After
every delivery the store's visible messages must be exactly the model's due ones: nothing
early, nothing missing, nothing twice, nothing cancelled.
"""

from __future__ import annotations

import heapq
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conftest import SMALL, FakeClock
from store import Message, MessageStore
from store.timer.timer_service import round_fire_time

P = 100
#: A tiny wheel: 64 slots of 100 ms (a 6.4 s turn), rolling beyond 8 slots.
TINY = SMALL.replace(timer_wheel_slots=64, timer_roll_window_slots=8,
                     message_delay_level="1s 3s 7s")
LEVELS = (1_000, 3_000, 7_000)
TOPICS = ("a", "b")


class DelayModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.path = tempfile.mkdtemp(prefix="rmq-model-")
        self.clock = FakeClock()
        self.store = MessageStore.open(self.path, TINY, clock=self.clock, flush_service=False)
        self.heap: list[tuple[int, str]] = []    # (visible from, msg_id)
        self.info: dict[str, dict] = {}           # msg_id -> topic, kind, fire, cancelled
        self.delivered: set[str] = set()

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)

    # -- sends ------------------------------------------------------------------------------
    def _expect(self, msg_id, topic, visible_from, **info):
        self.info[msg_id] = dict(topic=topic, visible_from=visible_from, cancelled=False, **info)
        heapq.heappush(self.heap, (visible_from, msg_id))

    @rule(topic=st.sampled_from(TOPICS), delay=st.integers(1, 20_000))
    def send_delay_ms(self, topic, delay):
        now = self.clock()
        r = self.store.producer("g").send(Message(topic, b"d"), delay_ms=delay)
        fire = now + delay
        self._expect(r.msg_id, topic, round_fire_time(fire, P) + P, kind="timer", fire=fire)

    @rule(topic=st.sampled_from(TOPICS), offset=st.integers(-5_000, 15_000))
    def send_deliver_at(self, topic, offset):
        now = self.clock()
        fire = now + offset
        r = self.store.producer("g").send(Message(topic, b"t"), deliver_at_ms=fire)
        if fire <= now:  # in the past: an ordinary message, visible at once
            self._expect(r.msg_id, topic, now, kind="plain", fire=None)
        else:
            self._expect(r.msg_id, topic, round_fire_time(fire, P) + P, kind="timer", fire=fire)

    @rule(topic=st.sampled_from(TOPICS), level=st.integers(1, 5))
    def send_level(self, topic, level):
        now = self.clock()
        r = self.store.producer("g").send(Message(topic, b"l"), delay_level=level)
        self._expect(r.msg_id, topic, now + LEVELS[min(level, 3) - 1], kind="level", fire=None)

    # -- cancels ----------------------------------------------------------------------------
    @precondition(lambda self: self.info)
    @rule(data=st.data(), other_topic=st.booleans())
    def cancel(self, data, other_topic):
        msg_id = data.draw(st.sampled_from(sorted(self.info)))
        m = self.info[msg_id]
        topic = m["topic"] if not other_topic else next(t for t in TOPICS if t != m["topic"])
        now = self.clock()
        expected = (m["kind"] == "timer" and not other_topic and m["fire"] > now
                    and not m["cancelled"])  # a second cancel finds nothing to cancel
        assert self.store.producer("g").cancel(topic, msg_id) is expected
        if expected:
            m["cancelled"] = True

    @rule()
    def cancel_unknown(self):
        assert self.store.producer("g").cancel("a", "F" * 32) is False

    # -- time, delivery, restarts -------------------------------------------------------------
    @rule(ms=st.one_of(st.integers(0, 3_000), st.integers(3_000, 60_000),
                       st.sampled_from([7 * 86_400_000, 30 * 86_400_000])))
    def advance(self, ms):
        self.clock.advance(ms)

    @rule()
    def deliver(self):
        self.store.deliver_due()
        now = self.clock()
        while self.heap and self.heap[0][0] <= now:
            _, msg_id = heapq.heappop(self.heap)
            if not self.info[msg_id]["cancelled"]:
                self.delivered.add(msg_id)
        self._check_visible(exact=True)

    @rule()
    def restart(self):
        self.store.close()
        self.store = MessageStore.open(self.path, TINY, clock=self.clock, flush_service=False)

    # -- checks -----------------------------------------------------------------------------
    def _visible(self):
        out = []
        for topic in TOPICS:
            try:
                queues = self.store.queue_ids(topic)
            except Exception:
                continue
            for q in queues:
                out.extend(self.store.pull(topic, q, 0, 10_000))
        return out

    def _check_visible(self, exact):
        views = self._visible()
        ids = [v.msg_id for v in views]
        assert len(ids) == len(set(ids)), "a message is visible twice"
        now = self.clock()
        for v in views:
            m = self.info[v.msg_id]
            assert v.topic == m["topic"]
            assert not m["cancelled"], "a cancelled message surfaced"
            assert v.store_timestamp_ms >= m["visible_from"], "visible early"
            if m["kind"] == "timer":
                assert v.deliver_timestamp_ms == m["fire"] <= v.store_timestamp_ms
            assert v.store_timestamp_ms <= now
        if exact:
            assert set(ids) == self.delivered

    @invariant()
    def never_early(self):
        self._check_visible(exact=False)


DelayModel.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestDelayModel = DelayModel.TestCase
