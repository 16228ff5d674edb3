"""The pipelined restore: chunks prepared on two threads, appended in order on one."""

from __future__ import annotations

import threading

import pytest

from store import Message, MessageStore
from store.core.pipeline import HELPER_NAME
from store.delayed import restore as bulk


def _records(store, topic):
    """Every record of ``topic`` as stored: queue, offset and the record's own fields (not
    its CommitLog offset: chunks of other sizes fill segment tails differently)."""
    out = []
    for q in sorted(store.queue_ids(topic)):
        for v in store.pull(topic, q, 0, 100_000):
            rec = store.read_record(v.commitlog_offset)
            props = {k: v for k, v in rec.properties.items() if k != "UNIQ_KEY"}  # per store
            out.append((q, v.queue_offset, rec.body, props, rec.flag, rec.sys_flag,
                        rec.store_timestamp_ms, rec.born_timestamp_ms, v.tags))
    return out


def _fill(store):
    p = store.producer("g")
    for i in range(500):  # two slots, a delay level, tags on some
        p.send(Message("t", b"m%d" % i, tags="x" if i % 3 else None, keys=f"k{i}"),
               delay_ms=1_050 + 200 * (i % 2))
    for i in range(60):
        p.send(Message("lv", b"l%d" % i, tags="y"), delay_level=2)
    p.cancel("t", p.send(Message("t", b"gone"), delay_ms=1_050).msg_id)
    store.deliver_due()  # into the wheel


def test_many_small_chunks_write_what_one_chunk_writes(tmp_path, clock, small_config,
                                                       monkeypatch):
    one = MessageStore.open(str(tmp_path / "one"), small_config, clock=clock)
    many = MessageStore.open(str(tmp_path / "many"), small_config, clock=clock)
    _fill(one)
    _fill(many)
    clock.advance(60_000)
    threads = set()
    real = bulk._prepare_chunk

    def prepare(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(bulk, "_prepare_chunk", prepare)
    monkeypatch.setattr(bulk, "RESTORE_CHUNK", 1_000_000)
    assert one.deliver_due() == 560
    assert threads == {"MainThread"}  # one chunk: no helper thread
    monkeypatch.setattr(bulk, "RESTORE_CHUNK", 7)
    assert many.deliver_due() == 560
    assert HELPER_NAME in threads  # the pipeline ran
    for topic in ("t", "lv"):
        assert _records(many, topic) == _records(one, topic)
    assert b"gone" not in [r[2] for r in _records(many, "t")]
    one.close()
    many.close()


def test_a_failure_while_preparing_stops_the_run_and_it_is_redone_once(
        store_path, clock, small_config, monkeypatch):
    s = MessageStore.open(store_path, small_config, clock=clock)
    p = s.producer("g")
    for i in range(300):
        p.send(Message("t", b"%d" % i), delay_ms=1_050)
    s.deliver_due()
    clock.advance(5_000)
    original = bulk._prepare_chunk
    calls, threads = [], set()

    def prepare_then_fail(*args, **kwargs):
        calls.append(1)
        threads.add(threading.current_thread().name)
        if len(calls) == 5:
            raise MemoryError("no room for the next chunk")
        return original(*args, **kwargs)

    monkeypatch.setattr(bulk, "_prepare_chunk", prepare_then_fail)
    monkeypatch.setattr(bulk, "RESTORE_CHUNK", 10)
    with pytest.raises(MemoryError):
        s.deliver_due()
    assert not any(t.name == HELPER_NAME for t in threading.enumerate())  # helper stopped
    monkeypatch.setattr(bulk, "_prepare_chunk", original)
    s.deliver_due()
    bodies = sorted(int(v.body) for q in s.queue_ids("t") for v in s.pull("t", q, 0, 1000))
    assert bodies == list(range(300))  # every message once, the ones before the failure too
    s.close()
    s = MessageStore.open(store_path, small_config, clock=clock)
    assert s.deliver_due() == 0
    assert sum(s.max_offset("t", q) for q in s.queue_ids("t")) == 300
    s.close()


def test_one_call_delivers_everything_due_before_the_compiled_loops_are_in(
        tmp_path, clock, small_config, monkeypatch):
    """Until a process has its compiled loops, deliver_due works in small steps (their Python
    versions); a step that delivers less than it may (the timer stops at a slot) must not end
    the call while more is due.  It did: 510 of 560 in a fresh process, the rest a call later."""
    from store.facade.message_store import jit

    monkeypatch.setattr(jit, "ready", lambda: False)  # a fresh process: numba not loaded yet
    store = MessageStore.open(str(tmp_path / "s"), small_config, clock=clock)
    _fill(store)
    clock.advance(60_000)
    assert store.deliver_due() == 560
    assert store.deliver_due() == 0
    store.close()
