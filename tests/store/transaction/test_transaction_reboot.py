"""A reboot tears the append of end_transactions after its commit record(s): the op is lost.

Recovery after a reboot keeps every valid record, so the commit record stays while its op
message (the mark that ends the transaction) is gone.  Ending the transaction again, by hand
or through the check loop, must not put a second copy in the real topic.
"""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import SMALL

from store import LocalTransactionState, Message, MessageStore
from store.formats.message import TRANS_OP_HALF_TOPIC
from store.transaction import transaction_service as service_module
from store.transaction.commit_repair import note_kept_commits, repair_path

HOUR = 3_600_000


class _Unknown:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, view):
        return LocalTransactionState.UNKNOW


def zero(path, offset, length, seg=SMALL.commitlog_file_size_bytes):
    name = os.path.join(path, "commitlog", f"{offset - offset % seg:020d}")
    with open(name, "r+b") as fh:
        fh.seek(offset % seg)
        fh.write(bytes(length))


def reboot(path) -> None:
    """Make the crashed copy look like it was left by another boot of the machine."""
    with open(os.path.join(path, "abort"), "w") as fh:
        fh.write("12345 00000000-0000-0000-0000-000000000000")


def committed(store) -> list[str]:
    if "payments" not in store.topics():
        return []
    return [v.transaction_id for q in store.queue_ids("payments")
            for v in store.pull("payments", q, 0, 1000)]


def op_count(store) -> int:
    if TRANS_OP_HALF_TOPIC not in store.topics(include_system=True):
        return 0
    return store.max_offset(TRANS_OP_HALF_TOPIC, 0)


def crashed_with_commits(store_path, tmp_path, clock, n, *, tear_op: bool):
    """n open halves (flushed), then one end_transactions(COMMIT) append not yet flushed;
    a copy of the store as a crash leaves it, with the op record torn when ``tear_op``."""
    s = MessageStore.open(store_path, SMALL, clock=clock, flush_service=False)
    txp = s.transaction_producer("pay", _Unknown())
    ids = [txp.send_in_transaction(Message("payments", b"x", keys=f"o-{i}")).transaction_id
           for i in range(n)]
    s.flush()
    assert s.transactions.end_transactions([(t, "COMMIT") for t in ids]) == [True] * n
    op_clog, op_size, _ = s.consume_queue(TRANS_OP_HALF_TOPIC, 0).entry(0)
    copy = str(tmp_path / "crashed")
    shutil.copytree(store_path, copy)
    s.close()
    if tear_op:  # the op's first bytes reached the disk, the rest did not
        zero(copy, op_clog + 12, op_size - 12)
    return copy, ids


def assert_ended_once(store, clock, ids) -> None:
    """Every id is in the real topic once, and nothing ends it again."""
    assert sorted(committed(store)) == sorted(ids)
    again = store.end_transaction(ids[0], "COMMIT")
    clock.advance(HOUR)
    result = store.check_transactions(lambda view: LocalTransactionState.COMMIT_MESSAGE)
    assert sorted(committed(store)) == sorted(ids)  # still one copy each
    assert again is False and (result.checked, result.committed) == (0, 0)
    assert store.end_transaction(ids[-1], "ROLLBACK") is False
    assert store.transactions.is_ended(ids) == [True] * len(ids)
    assert store.pending_transaction_stats()["pending"] == 0


@pytest.mark.parametrize("n", [1, 3])
def test_commit_kept_without_its_op_after_reboot_ends_once(store_path, tmp_path, clock, n):
    path, ids = crashed_with_commits(store_path, tmp_path, clock, n, tear_op=True)
    reboot(path)
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert store.recovered
        assert_ended_once(store, clock, ids)
        assert op_count(store) == 1  # the repair op: the torn one was cut
        assert not os.path.exists(repair_path(store))
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert_ended_once(store, clock, ids)


def test_whole_append_after_reboot_needs_no_repair(store_path, tmp_path, clock):
    path, ids = crashed_with_commits(store_path, tmp_path, clock, 2, tear_op=False)
    reboot(path)
    with MessageStore.open(path, SMALL, clock=clock) as store:
        assert store.recovered
        assert op_count(store) == 1  # the original op; no repair written
        assert not os.path.exists(repair_path(store))
        assert_ended_once(store, clock, ids)


def test_crash_between_recovery_and_repair_repairs_at_the_next_open(
        store_path, tmp_path, clock, monkeypatch):
    path, ids = crashed_with_commits(store_path, tmp_path, clock, 1, tear_op=True)
    reboot(path)
    # the process that recovers dies before its transaction service repairs: the note stays,
    # and a flush moves the durable point past the commit record before it dies
    monkeypatch.setattr(service_module, "repair_noted_commits", lambda store, index: 0)
    store = MessageStore.open(path, SMALL, clock=clock, flush_service=False)
    assert os.path.exists(repair_path(store))
    store.producer("g").send(Message("other", b"after"))
    store.flush()
    again = str(tmp_path / "crashed-again")
    shutil.copytree(path, again)  # same boot: abort names this boot
    store.close()
    monkeypatch.undo()
    with MessageStore.open(again, SMALL, clock=clock) as store:
        assert store.recovered
        assert not os.path.exists(repair_path(store))
        assert_ended_once(store, clock, ids)


def test_note_naming_no_commit_record_changes_nothing(store_path, clock):
    with MessageStore.open(store_path, SMALL, clock=clock) as store:
        r = store.transaction_producer("pay", _Unknown()).send_in_transaction(
            Message("payments", b"x", keys="o-1"))
        # a half (not a commit record), a record offset past the end, garbage
        note_kept_commits(store, [r.commitlog_offset, 10 ** 9, 3])
    with MessageStore.open(store_path, SMALL, clock=clock) as store:
        assert not os.path.exists(repair_path(store))
        assert op_count(store) == 0
        assert store.pending_transaction_stats()["pending"] == 1
        clock.advance(HOUR)
        result = store.check_transactions(lambda view: LocalTransactionState.COMMIT_MESSAGE)
        assert (result.checked, result.committed) == (1, 1)
        assert committed(store) == [r.transaction_id]
        assert store.end_transaction(r.transaction_id, "COMMIT") is False
        assert committed(store) == [r.transaction_id]
