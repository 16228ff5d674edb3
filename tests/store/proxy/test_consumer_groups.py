"""Consumer groups of the gRPC endpoint (store/proxy/consumers.py), on a fake clock.

A model-based test drives receives, acks, invisibility changes, clock moves and restarts
against a simple model: a message is never handed out while an earlier hand-out of it is
invisible, never after it was acked, and every message is handed out until acked.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import SMALL, FakeClock  # noqa: E402
from store import Message, MessageStore  # noqa: E402
from store.proxy.consumers import ConsumerGroups, Handle, tag_filter  # noqa: E402
from store.proxy.convert import Code, Refused  # noqa: E402


def _store(path, clock, queues=2):
    s = MessageStore.open(path, SMALL.replace(default_queue_count=queues), clock=clock)
    return s


def _send(store, n, topic="t", tags=None):
    p = store.producer()
    return [p.send(Message(topic, f"m{i}".encode(), tags=tags)).msg_id for i in range(n)]


def test_hand_out_ack_and_progress_survive_a_restart(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock)
    ids = _send(store, 6)
    groups = ConsumerGroups(store)
    got = groups.receive("g", "t", batch=4, invisible_ms=10_000)
    assert len(got) == 4 and len({d.view.msg_id for d in got}) == 4
    for d in got:
        groups.ack("g", "t", d.handle)
    rest = groups.receive("g", "t", batch=32, invisible_ms=10_000)
    assert {d.view.msg_id for d in got} | {d.view.msg_id for d in rest} == set(ids)
    groups.close()
    store.close()
    # the acked four are not handed out again; the unacked two are (their leases were lost)
    store = _store(tmp_path / "s", clock)
    groups = ConsumerGroups(store)
    again = groups.receive("g", "t", batch=32, invisible_ms=10_000)
    assert {d.view.msg_id for d in again} == {d.view.msg_id for d in rest}
    groups.close()
    store.close()


def test_read_below_hands_out_only_below_the_bound(tmp_path):
    """With a read bound (a replica's high watermark), nothing at or past it is handed out,
    until it moves; ``None`` from it: the whole log."""
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 2)
    bound = [store.confirmed_offset()]
    store.producer().send(Message("t", b"late"))
    groups = ConsumerGroups(store)
    groups.read_below(lambda: bound[0])
    try:
        got = groups.receive("g", "t", batch=32, invisible_ms=10_000)
        assert [d.view.body for d in got] == [b"m0", b"m1"]
        assert groups.receive("g", "t", batch=32, invisible_ms=10_000) == []
        bound[0] = None
        got = groups.receive("g", "t", batch=32, invisible_ms=10_000)
        assert [d.view.body for d in got] == [b"late"]
    finally:
        groups.close()
        store.close()


def test_offsets_file_is_rocketmq_format(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 3)
    groups = ConsumerGroups(store)
    for d in groups.receive("g", "t", batch=32, invisible_ms=10_000):
        groups.ack("g", "t", d.handle)
    groups.close()
    text = (tmp_path / "s" / "config" / "consumerOffset.json").read_text()
    assert '"t@g"' in text and "0:3" in text.replace(" ", "")  # fastjson: bare integer keys
    store.close()


def test_unacked_message_returns_after_its_invisible_time_only(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 1)
    groups = ConsumerGroups(store)
    first = groups.receive("g", "t", batch=1, invisible_ms=5_000)
    assert len(first) == 1 and first[0].attempt == 1
    clock.advance(4_999)
    assert groups.receive("g", "t", batch=1, invisible_ms=5_000) == []
    clock.advance(1)
    second = groups.receive("g", "t", batch=1, invisible_ms=5_000)
    assert [d.view.msg_id for d in second] == [first[0].view.msg_id]
    assert second[0].attempt == 2
    # the first hand-out's handle is stale now
    with pytest.raises(Refused) as err:
        groups.ack("g", "t", first[0].handle)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    groups.ack("g", "t", second[0].handle)
    clock.advance(60_000)
    assert groups.receive("g", "t", batch=1, invisible_ms=5_000) == []
    groups.close()
    store.close()


def test_change_invisible_duration_gives_a_new_handle(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 1)
    groups = ConsumerGroups(store)
    (d,) = groups.receive("g", "t", batch=1, invisible_ms=5_000)
    handle = groups.change_invisible("g", "t", d.handle, 60_000)
    assert handle != d.handle
    clock.advance(10_000)
    assert groups.receive("g", "t", batch=1, invisible_ms=5_000) == []
    with pytest.raises(Refused):
        groups.ack("g", "t", d.handle)
    groups.ack("g", "t", handle)
    groups.close()
    store.close()


def test_expired_handle_and_garbage_handles_are_refused(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 1)
    groups = ConsumerGroups(store)
    (d,) = groups.receive("g", "t", batch=1, invisible_ms=1_000)
    clock.advance(1_000)
    for bad in (d.handle, "", "rmq1.x.y.z.w", "nonsense", "rmq1.0.0.1.2.3"):
        with pytest.raises(Refused) as err:
            groups.ack("g", "t", bad)
        assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    with pytest.raises(Refused):  # another group has no lease on it
        groups.ack("other", "t", Handle(0, 0, 1, clock() + 10).text())
    groups.close()
    store.close()


def test_two_groups_read_independently(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock)
    ids = _send(store, 5)
    groups = ConsumerGroups(store)
    a = groups.receive("a", "t", batch=32, invisible_ms=10_000)
    b = groups.receive("b", "t", batch=32, invisible_ms=10_000)
    assert sorted(d.view.msg_id for d in a) == sorted(ids) == sorted(d.view.msg_id for d in b)
    groups.close()
    store.close()


def test_tag_filter_skips_and_acks_other_tags(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    p = store.producer()
    p.send(Message("t", b"1", tags="a"))
    p.send(Message("t", b"2", tags="b"))
    p.send(Message("t", b"3", tags="c"))
    groups = ConsumerGroups(store)
    got = groups.receive("g", "t", batch=32, invisible_ms=10_000, tags=tag_filter("a || c"))
    assert [bytes(d.view.body) for d in got] == [b"1", b"3"]
    for d in got:
        groups.ack("g", "t", d.handle)
    assert groups.committed("g", "t") == {0: 3}
    with pytest.raises(Refused):
        tag_filter("||")
    assert tag_filter("*") is None and tag_filter("") is None
    groups.close()
    store.close()


def test_fifo_group_holds_a_queue_while_a_message_is_out(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 3)
    groups = ConsumerGroups(store)
    (first,) = groups.receive("g", "t", batch=32, invisible_ms=5_000, fifo=True)
    assert bytes(first.view.body) == b"m0"
    assert groups.receive("g", "t", batch=32, invisible_ms=5_000, fifo=True) == []
    clock.advance(5_000)  # not acked: the same message again, before the next one
    (again,) = groups.receive("g", "t", batch=32, invisible_ms=5_000, fifo=True)
    assert bytes(again.view.body) == b"m0"
    groups.ack("g", "t", again.handle)
    (second,) = groups.receive("g", "t", batch=32, invisible_ms=5_000, fifo=True)
    assert bytes(second.view.body) == b"m1"
    groups.close()
    store.close()


def test_dead_letter_after_max_attempts(tmp_path):
    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 1)
    groups = ConsumerGroups(store, max_attempts=3)
    dead = []
    for attempt in range(1, 4):
        (d,) = groups.receive("g", "t", batch=1, invisible_ms=1_000, dead_letter=dead.append)
        assert d.attempt == attempt
        clock.advance(1_000)
    assert groups.receive("g", "t", batch=1, invisible_ms=1_000, dead_letter=dead.append) == []
    assert len(dead) == 1 and bytes(dead[0].body) == b"m0"
    assert groups.committed("g", "t") == {0: 1}
    groups.close()
    store.close()


OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(1, 3)),
    st.tuples(st.just("receive"), st.integers(1, 4)),
    st.tuples(st.just("ack"), st.integers(0, 10)),
    st.tuples(st.just("tick"), st.sampled_from([500, 1_000, 3_000])),
    st.tuples(st.just("restart"), st.just(0)),
), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_model(fresh_dir, ops):
    path = fresh_dir("model") / "s"
    clock = FakeClock()
    store = _store(path, clock)
    groups = ConsumerGroups(store)
    sent: list[str] = []
    acked: set[str] = set()
    out: dict[str, tuple[str, int]] = {}  # msg id -> (handle, visible again at)
    try:
        for op, arg in ops:
            if op == "send":
                sent += _send(store, arg)
            elif op == "receive":
                for d in groups.receive("g", "t", batch=arg, invisible_ms=2_000):
                    mid = d.view.msg_id
                    assert mid not in acked, "an acked message was handed out again"
                    if mid in out:
                        assert out[mid][1] <= clock(), "handed out while invisible"
                    out[mid] = (d.handle, clock() + 2_000)
            elif op == "ack" and out:
                mid = sorted(out)[arg % len(out)]
                handle, visible = out.pop(mid)
                if visible > clock():
                    groups.ack("g", "t", handle)
                    acked.add(mid)
                else:
                    with pytest.raises(Refused):
                        groups.ack("g", "t", handle)
            elif op == "tick":
                clock.advance(arg)
            elif op == "restart":
                groups.close()
                store.close()
                store = _store(path, clock)
                groups = ConsumerGroups(store)
                out.clear()  # leases are in memory: every unacked message comes back
        clock.advance(10_000)
        seen = set()
        for _ in range(len(sent) + 1):
            for d in groups.receive("g", "t", batch=32, invisible_ms=2_000):
                assert d.view.msg_id not in acked
                seen.add(d.view.msg_id)
                groups.ack("g", "t", d.handle)
        assert seen == set(sent) - acked, "an unacked message was never handed out again"
    finally:
        groups.close()
        store.close()


def test_a_new_leader_takes_the_copied_progress_and_drops_its_own(tmp_path):
    """``take_role`` (a replica set's change of role): ``"leader"`` takes the progress in
    the files (a follower's copy of its old leader's), each offset at most its queue's end
    in this log; ``"follower"`` drops what was held in memory, unsaved."""
    from store.files.consumer_progress import ConsumerProgress, read_progress, write_progress

    clock = FakeClock()
    store = _store(tmp_path / "s", clock, queues=1)
    _send(store, 5)
    groups = ConsumerGroups(store)  # (its files: nothing consumed yet)
    try:
        # a copy came while following: 3 acked, and 4 acked above them
        write_progress(store.root, ConsumerProgress({("g", "t", 0): 3},
                                                    {("g", "t", 0): frozenset({4})}, 7))
        groups.take_role("leader")
        got = groups.receive("g", "t", batch=32, invisible_ms=10_000)
        assert [d.view.queue_offset for d in got] == [3]  # 0-2 and 4 were acked
        groups.ack("g", "t", got[0].handle)
        assert groups.committed("g", "t") == {0: 5}
        # a copy past this log's end (copied ahead of the log, asynchronously): the
        # messages this leader stores at those offsets are handed out
        groups.take_role("follower")
        write_progress(store.root, ConsumerProgress({("g", "t", 0): 9}, {}, 8))
        groups.take_role("leader")
        _send(store, 2)
        got = groups.receive("g", "t", batch=32, invisible_ms=10_000)
        assert [d.view.queue_offset for d in got] == [5, 6]
        groups.save()
        assert read_progress(store.root).offsets == {("g", "t", 0): 5}  # the end kept
        # deposed: what it held is dropped, not saved over the copies to come
        groups.ack("g", "t", got[0].handle)
        groups.take_role("follower")
        assert groups.committed("g", "t") == {}
        before = read_progress(store.root)
        groups.save()
        assert read_progress(store.root) == before
    finally:
        groups.close()
        store.close()
