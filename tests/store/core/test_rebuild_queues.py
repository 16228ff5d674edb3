"""Derived files rebuilt from the CommitLog: queues deleted, truncated, zeroed or garbled,
and the topic table lost, come back exactly as they were (``store.rebuild_queues()``)."""

from __future__ import annotations

import glob
import os

import pytest

from store import CorruptRecordError, LocalTransactionState, Message, MessageStore


class Commit:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, view):
        return LocalTransactionState.COMMIT_MESSAGE


def _everything(store):
    out = {}
    for topic in store.topics(include_system=True):
        for q in store.queue_ids(topic):
            lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
            for v in store.pull(topic, q, lo, hi - lo + 1):
                out[(topic, q, v.queue_offset)] = (v.msg_id, v.body, v.tags,
                                                   v.commitlog_offset)
    return out


@pytest.fixture
def filled(store_path, small_config, clock):
    cfg = small_config.replace(default_queue_count=8)
    with MessageStore.open(store_path, cfg, clock=clock) as s:
        p = s.producer("g")
        for i in range(600):
            p.send(Message(("orders", "pay")[i % 2], b"m%d" % i, tags=("a", "b")[i % 3 % 2]))
        p.send(Message("orders", b"later"), delay_ms=3_600_000)
        p.send(Message("orders", b"level"), delay_level=3)
        s.transaction_producer("tx", Commit()).send_in_transaction(Message("pay", b"tx"))
        expected = _everything(s)
    return store_path, cfg, expected


@pytest.mark.parametrize("damage", ["delete", "truncate", "zero", "garble", "topics"])
def test_damaged_queues_come_back_from_the_commitlog(filled, clock, damage):
    path, cfg, expected = filled
    files = sorted(glob.glob(os.path.join(path, "consumequeue", "orders", "*", "*")))
    assert files
    for f in files:
        if damage == "delete":
            os.remove(f)
        elif damage == "truncate":
            with open(f, "r+b") as fh:
                fh.truncate(100)
        elif damage in ("zero", "garble"):
            size = os.path.getsize(f)
            with open(f, "r+b") as fh:
                fh.write((b"\0" if damage == "zero" else b"\x13\x37") * (size // 2))
    if damage == "topics":
        for name in ("topics.json", "topics.json.bak"):
            p = os.path.join(path, "config", name)
            if os.path.exists(p):
                with open(p, "w") as fh:
                    fh.write("{not json")
    with MessageStore.open(path, cfg, read_only=True, clock=clock) as r:
        if damage != "topics":  # the damage shows to a reader: messages missing, or typed
            try:
                assert _everything(r) != expected
            except CorruptRecordError as exc:
                assert "damaged" in str(exc)
    with MessageStore.open(path, cfg, clock=clock) as s:
        # queues ending below the ends recorded at the last close: rebuilt by the open
        assert _everything(s) == expected
        result = s.rebuild_queues()
        assert _everything(s) == expected
        assert result.entries >= len(expected) and not result.stopped_early
        if damage == "truncate":  # the damaged files were kept
            assert glob.glob(os.path.join(path, "consumequeue", "orders", "*", "*.damaged*"))
        # the services keep working on the rebuilt queues
        clock.advance(3_600_000 + 1_000)
        assert s.deliver_due() == 2
        assert sum(1 for k in _everything(s) if k[0] == "orders") == 302
    with MessageStore.open(path, cfg, clock=clock) as s:  # and after a reopen
        assert sum(1 for k in _everything(s) if k[0] == "orders") == 302


def test_rmq_repair_command(filled):
    from click.testing import CliRunner

    from rmq_cli.cli import main

    path, cfg, expected = filled
    for f in glob.glob(os.path.join(path, "consumequeue", "pay", "*", "*")):
        os.remove(f)
    r = CliRunner().invoke(main, ["repair", "--store", path])
    assert r.exit_code == 0, r.output
    assert "rebuilt" in r.output
    with MessageStore.open(path, cfg) as s:
        assert _everything(s) == expected


def test_rebuild_reports_progress(tmp_path):
    from conftest import SMALL

    from store import Message, MessageStore

    with MessageStore.open(str(tmp_path / "s"), SMALL) as store:
        p = store.producer("g")
        for _ in range(6):
            p.send_batch([Message("t", bytes(900)) for _ in range(20)])
        seen = []
        result = store.rebuild_queues(lambda done, total: seen.append((done, total)))
        assert result.records == 120 and len(seen) >= 2
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
        assert all(0 <= d <= t for d, t in seen)


def test_a_second_repair_keeps_what_the_first_set_aside(filled, clock):
    """A wrong-length queue file goes to ``<name>.damaged-<n>``; a second repair that finds
    another one under the same name sets it aside beside the first, never over it."""
    path, cfg, expected = filled
    qdir = os.path.join(path, "consumequeue", "orders", "0")
    stray = os.path.join(qdir, "00000000000099999980")
    with MessageStore.open(path, cfg, clock=clock) as s:
        for content in (b"first", b"second"):
            with open(stray, "wb") as fh:
                fh.write(content)
            result = s.rebuild_queues()
            assert any(name.startswith(os.path.join("consumequeue", "orders", "0",
                                                    "00000000000099999980.damaged-"))
                       for name in result.set_aside), result.set_aside
            assert _everything(s) == expected
    kept = sorted(glob.glob(stray + ".damaged-*"))
    assert [open(k, "rb").read() for k in kept] == [b"first", b"second"]
