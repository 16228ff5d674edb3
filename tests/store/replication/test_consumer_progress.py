"""The gRPC face's consumer progress in a replica set: a follower copies its leader's
(``consumer_progress``, every ``consumer_progress_sync_ms``), checks the copy before
writing it, never moves a group back from an older copy, and a follower that comes to lead
hands out from the copy, not from its own (stale or empty) files."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from test_replica_set import SMALL, free_port

from store import StoreServer, connect
from store.base.errors import (
    AccessDeniedError,
    ConsumerProgressError,
    InvalidConfigError,
    NotLeaderError,
)
from store.files import consumer_progress as files
from store.files.consumer_progress import (
    ACKS_FILE,
    OFFSETS_FILE,
    ConsumerProgress,
    merged,
    parse_progress,
    progress_fields,
    read_progress,
    write_progress,
)
from store.files.progress_table import parse_answer
from store.remote.wire import InvalidRequest
from store.replication.consumer_progress import ProgressCopy
from store.replication.replica_set import ReplicaSet

# ---------------------------------------------------------------- the copy, checked


class FakeLeader:
    """A leader whose ``consumer_progress`` answer is ``answer`` (raised when an error)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.address = SimpleNamespace(url="rmq://127.0.0.1:1")

    def consumer_progress(self, **asked):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def fake_store(tmp_path):
    (tmp_path / "config").mkdir(exist_ok=True)
    return SimpleNamespace(root=str(tmp_path), now_ms=lambda: 1)


def answer(epoch=3, offsets=None, acks=None) -> dict:
    return {"epoch": epoch, "offsets": offsets if offsets is not None else
            {"orders@billing": {"0": 10, "1": 4}}, "acks": acks if acks is not None else
            {"orders@billing": {"0": [12, 13]}}}


def files_bytes(root) -> tuple:
    out = []
    for name in (OFFSETS_FILE, ACKS_FILE):
        try:
            with open(f"{root}/{name}", "rb") as fh:
                out.append(fh.read())
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


def test_a_copy_is_written_in_the_format_the_groups_load(tmp_path):
    store = fake_store(tmp_path)
    assert ProgressCopy(store, FakeLeader(answer()), 100).copy()
    held = read_progress(store.root)
    assert held.offsets == {("billing", "orders", 0): 10, ("billing", "orders", 1): 4}
    assert held.acks == {("billing", "orders", 0): frozenset({12, 13})}
    assert held.epoch == 3
    text = (tmp_path / OFFSETS_FILE).read_text()
    assert '"orders@billing"' in text and "offsetTable" in text  # RocketMQ's table


@pytest.mark.parametrize("bad", [
    "not an object",
    {"epoch": 3, "offsets": {}},  # a field missing
    {**answer(), "more": 1},  # a field too many
    answer(offsets={"orders": {"0": 1}}),  # no group
    answer(offsets={"orders@bill@ing": {"0": 1}}, acks={}),  # a name with '@'
    answer(offsets={"../x@g": {"0": 1}}, acks={}),  # a name that is no topic
    answer(offsets={"orders@billing": {"-1": 1}}, acks={}),  # a queue id
    answer(offsets={"orders@billing": {"0": -5}}, acks={}),  # a negative offset
    answer(offsets={"orders@billing": {"0": True}}, acks={}),  # a bool offset
    answer(offsets={"orders@billing": {"0": "7"}}, acks={}),  # a string offset
    answer(offsets={"orders@billing": {"0": 1 << 64}}, acks={}),  # too large
    answer(acks={"orders@billing": {"0": [3]}}),  # an ack below the committed offset
    answer(acks={"orders@billing": {"2": [30]}}),  # acks of a queue without its offset
    answer(acks={"orders@billing": {"0": "12"}}),  # acks not a list
    answer(epoch="3"),
    InvalidRequest("the answer of consumer_progress is not JSON"),
    NotLeaderError("rmq://127.0.0.1:1 does not lead"),
])
def test_a_malformed_copy_leaves_the_files_as_they_were(tmp_path, bad):
    store = fake_store(tmp_path)
    assert ProgressCopy(store, FakeLeader(answer(epoch=2)), 100).copy()
    before = files_bytes(store.root)
    copy = ProgressCopy(store, FakeLeader(bad), 100)
    assert not copy.copy()
    assert copy.error  # told in the follower's status
    assert files_bytes(store.root) == before


def test_an_oversized_copy_is_refused_whole(tmp_path, monkeypatch):
    store = fake_store(tmp_path)
    monkeypatch.setattr(files, "MAX_QUEUES", 3)
    monkeypatch.setattr(files, "MAX_ACKS_PER_QUEUE", 2)
    many_queues = answer(offsets={"orders@billing": {str(q): 1 for q in range(4)}}, acks={})
    many_acks = answer(acks={"orders@billing": {"0": [11, 12, 13]}})
    for bad in (many_queues, many_acks):
        with pytest.raises(ConsumerProgressError, match="at most"):
            parse_progress(bad)
        copy = ProgressCopy(store, FakeLeader(bad), 100)
        assert not copy.copy()
    assert files_bytes(store.root) == (None, None)
    # a leader's answer keeps within the bounds: the acks of a queue with too many are
    # left out (handed out again after a failover), queues past the bound too
    progress = ConsumerProgress({("g", "t", q): 5 for q in range(4)},
                                {("g", "t", 0): frozenset({6, 7, 8}),
                                 ("g", "t", 1): frozenset({7})})
    sent = parse_progress(progress_fields(progress, 1))
    assert len(sent.offsets) == 3 and sent.acks == {("g", "t", 1): frozenset({7})}


def test_no_group_moves_back_from_an_older_copy(tmp_path):
    key, other = ("billing", "orders", 0), ("billing", "orders", 1)
    held = ConsumerProgress({key: 10, other: 4}, {key: frozenset({12})}, epoch=3)
    # the same term: each queue keeps the copy that is further on
    older = ConsumerProgress({key: 8, other: 6}, {key: frozenset({9})}, epoch=3)
    kept = merged(held, older)
    assert kept.offsets == {key: 10, other: 6} and kept.acks == {key: frozenset({12})}
    assert merged(held, held) is None  # nothing new: nothing written
    # a copy of an earlier term is ignored
    assert merged(held, ConsumerProgress({key: 50}, {}, epoch=2)) is None
    # a new leader's copy is taken whole: an offset of an earlier term could lie past
    # what its log holds there
    new = ConsumerProgress({key: 7}, {}, epoch=4)
    assert merged(held, new) == new
    # a store's own progress (no copy yet) gives way to its leader's
    assert merged(ConsumerProgress({key: 10}), new) == new


def test_the_copy_runs_on_its_thread_at_its_interval_until_stopped(tmp_path):
    store = fake_store(tmp_path)
    leader = FakeLeader(answer())
    leader.closed = False
    leader.close = lambda: setattr(leader, "closed", True)
    copy = ProgressCopy(store, leader, 50).start()
    try:
        _wait("the first copy", lambda: copy.copies == 1)
        offset = ("billing", "orders", 0)
        leader.answer = answer(offsets={"orders@billing": {"0": 20, "1": 4}}, acks={})
        _wait("the next copy", lambda: read_progress(store.root).offsets[offset] == 20)
        assert copy.status() == {"consumer_progress_copied_ms": 1,
                                 "consumer_progress_error": None}
    finally:
        copy.stop()
    leader.answer = answer(offsets={"orders@billing": {"0": 30, "1": 4}}, acks={})
    time.sleep(0.3)  # (several intervals)
    assert read_progress(store.root).offsets[offset] == 20  # nothing after stop
    _wait("the connection closed by the thread", lambda: leader.closed)
    assert copy.copy() is False  # (a copy asked after stop writes nothing either)
    assert read_progress(store.root).offsets[offset] == 20


def test_the_interval_is_a_field_of_the_replica_set_file():
    urls = ["rmq://127.0.0.1:7001", "rmq://127.0.0.1:7002"]
    assert ReplicaSet.of({"replicas": urls}).consumer_progress_sync_ms == 5000
    assert ReplicaSet.of({"replicas": urls, "consumer_progress_sync_ms": 250}
                         ).consumer_progress_sync_ms == 250
    for bad in (0, -1, "5000", True, 10 ** 9):
        with pytest.raises(InvalidConfigError, match="consumer_progress_sync_ms"):
            ReplicaSet.of({"replicas": urls, "consumer_progress_sync_ms": bad})


# ---------------------------------------------------------------- who may ask


def test_only_a_replicas_account_may_ask_and_only_a_leader_answers(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "reader", "secretKey": "reader-secret", "defaultTopicPerm": "PUB|SUB"},
        {"accessKey": "replicator", "secretKey": "replicator-secret", "replicate": True}]}))
    ports = (free_port(), free_port())
    urls = [f"rmq://127.0.0.1:{p}" for p in ports]
    rs = tmp_path / "replicas.json"
    rs.write_text(json.dumps({"replicas": urls, "account": "replicator",
                              "secret_file": str(_secret(tmp_path))}))
    (tmp_path / "s0" / "config").mkdir(parents=True)
    write_progress(str(tmp_path / "s0"), ConsumerProgress({("billing", "orders", 0): 9}))
    servers = []
    try:
        for i in (0, 1):
            servers.append(StoreServer(str(tmp_path / f"s{i}"), SMALL,
                                       listen=f"127.0.0.1:{ports[i]}", replica_set=str(rs),
                                       acl=str(acl)))
        leader, follower = servers
        for asked in ({}, {"since": None}):  # the older shape and the columns
            with connect(leader.url, account="reader", secret="reader-secret") as reader, \
                    pytest.raises(AccessDeniedError, match="replication right"):
                reader.consumer_progress(**asked)
            with connect(follower.url, account="replicator",
                         secret="replicator-secret") as ok, pytest.raises(NotLeaderError):
                ok.consumer_progress(**asked)
        with connect(leader.url, account="replicator", secret="replicator-secret") as ok:
            got = parse_progress(ok.consumer_progress())
            full = ok.consumer_progress(since=None)
            since = {k: full[k] for k in ("epoch", "log", "version")}
            delta = ok.consumer_progress(since=since)
        assert got.offsets == {("billing", "orders", 0): 9}
        assert got.epoch == leader.replica.epoch
        assert parse_answer(full).to_progress().offsets == got.offsets
        assert full["since"] is None and full["epoch"] == got.epoch
        assert delta["since"] == full["version"] and delta["queue"] == []  # nothing since
    finally:
        for s in servers:
            s.close()


def _secret(tmp_path):
    path = tmp_path / "replicator.secret"
    path.write_text("replicator-secret")
    return path


# ---------------------------------------------------------------- across a failover


def _wait(what: str, check, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
