"""The consumer-progress copy sends only what changed: a leader's log stamps each queue
with the version that last changed it, a follower asks with the version it holds and is
answered the queues changed since (a full copy when its version is unknown, of another
term or of another log), checks the delta against what it holds, and writes the same files
as a full copy would; peers of the previous version are answered and understood."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_consumer_progress import files_bytes

from store.files import consumer_progress as files
from store.files.consumer_progress import (
    ConsumerProgress,
    merged,
    parse_progress,
    progress_fields,
    read_progress,
    write_progress,
)
from store.files.progress_table import (
    ProgressLog,
    merged_table,
    parse_answer,
    read_table,
    table_of,
    write_table,
)
from store.remote.wire import dumps, loads
from store.replication.consumer_progress import ProgressCopy

EPOCH = 3


def progress(n: int, bump: dict | None = None, acks: dict | None = None) -> ConsumerProgress:
    """``n`` queues over a few groups and topics; ``bump``: queue number -> offset."""
    offsets = {(f"group{i % 3}", f"topic{i % 7}", i): 100 + i for i in range(n)}
    keys = list(offsets)
    for i, offset in (bump or {}).items():
        offsets[keys[i]] = offset
    return ConsumerProgress(offsets, {keys[i]: frozenset(a) for i, a in (acks or {}).items()})


class Leader:
    """A leader over the files at ``root``, answering as the Flight action does (through
    its JSON), counting the rows each answer carries; ``old``: a leader of the previous
    version (the body not read, the older shape answered)."""

    def __init__(self, root: str, *, old: bool = False) -> None:
        self.root, self.old, self.epoch = root, old, EPOCH
        self.log = ProgressLog(root)
        self.address = SimpleNamespace(url="rmq://127.0.0.1:1")
        self.asked: list = []
        self.rows: list[int] = []
        self.replace = None  # a function of the answer giving the answer sent instead

    def consumer_progress(self, **asked):
        self.asked.append(asked)
        if self.old:
            answer = progress_fields(read_progress(self.root), self.epoch)
            self.rows.append(sum(len(q) for q in answer["offsets"].values()))
        else:
            answer = self.log.answer(self.epoch, loads(dumps(asked), "body"))
            self.rows.append(len(answer["queue"]))
        if self.replace is not None:
            answer = self.replace(answer)
        return loads(dumps(answer), "the answer")

    def close(self) -> None:
        pass


def roots(tmp_path):
    out = []
    for name in ("leader", "follower"):
        (tmp_path / name / "config").mkdir(parents=True)
        out.append(str(tmp_path / name))
    return out


def follower(root: str, leader: Leader) -> ProgressCopy:
    return ProgressCopy(SimpleNamespace(root=root, now_ms=lambda: 1), leader, 100)


def same_progress(a: str, b: str) -> bool:
    pa, pb = read_progress(a), read_progress(b)
    return pa.offsets == pb.offsets and pa.acks == pb.acks


# ---------------------------------------------------------------- only what changed


def test_a_delta_carries_only_the_queues_changed(tmp_path):
    leader_root, root = roots(tmp_path)
    write_progress(leader_root, progress(1000, acks={5: {200, 300}}))
    leader = Leader(leader_root)
    copy = follower(root, leader)
    assert copy.copy() and leader.rows == [1000]  # the first copy: whole
    assert same_progress(root, leader_root)
    assert copy.copy() is False and leader.rows[-1] == 0  # nothing changed: nothing sent
    # 1 % of the queues move on (and one's acks change)
    write_progress(leader_root, progress(1000, bump={i: 5000 + i for i in range(0, 1000, 100)},
                                         acks={5: {200, 300, 400}}))
    before_ask = len(leader.asked)
    assert copy.copy()
    assert leader.rows[-1] == 11 and leader.asked[before_ask]["since"] is not None
    assert same_progress(root, leader_root)
    assert read_progress(root).epoch == EPOCH


def test_a_follower_that_missed_intervals_is_sent_every_change_since(tmp_path):
    leader_root, root = roots(tmp_path)
    write_progress(leader_root, progress(200))
    leader = Leader(leader_root)
    copy = follower(root, leader)
    copy.copy()
    for step in range(3):  # three saves of the leader, none asked for
        write_progress(leader_root, progress(200, bump={step: 1000, 50 + step: 2000}))
        leader.log.answer(EPOCH, {"since": None})  # (another follower asks meanwhile)
    assert copy.copy() and leader.rows[-1] == 6
    assert same_progress(root, leader_root)


def test_written_files_are_the_bytes_a_full_write_gives(tmp_path):
    leader_root, root = roots(tmp_path)
    held = progress(300, acks={1: {500, 700}, 299: {1000}})
    held = ConsumerProgress(held.offsets, held.acks, epoch=7)
    write_progress(leader_root, held)
    write_table(root, table_of(held), {})
    assert files_bytes(root) == files_bytes(leader_root)
    table, other = read_table(root)
    assert table.to_progress() == held and other == {}


def test_the_columns_read_from_the_files_are_what_the_lenient_reader_gives(tmp_path):
    root = str(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / files.OFFSETS_FILE).write_text(
        '{"offsetTable":{"t@g":{0:5,2:9,1:3},"u@g":{"3":"7"},"nogroup":{0:1},'
        '"v@h":{}},"dataVersion":{"counter":4}}')
    (tmp_path / files.ACKS_FILE).write_text(
        '{"t@g":{"0":[8,6,2],"1":[4],"9":[50]},"u@g":{"3":["12"]},"x@y":{"0":[1]}}')
    lenient = read_progress(root)
    assert lenient.offsets[("g", "u", 3)] == 7  # (a string offset: read leniently)
    for bounded in (False, True):
        table, other = read_table(root, bounded=bounded)
        assert table.to_progress() == table_of(lenient, bounded=bounded).to_progress()
        assert other == {"dataVersion": {"counter": 4}}
    (tmp_path / files.OFFSETS_FILE).write_text('{"offsetTable":{"t@g":{0:5,2:9,1:3}}}')
    (tmp_path / files.ACKS_FILE).write_text('{"t@g":{"0":[8,6,2]}}')
    table, _ = read_table(root)  # (plain integers: the columns' own path)
    assert table.to_progress() == table_of(read_progress(root)).to_progress()
    assert table.acks.tolist() == [6, 8]


@pytest.mark.parametrize("how", ["restarted", "new term", "leader restarted"])
def test_a_follower_without_a_version_the_leader_knows_gets_a_full_copy(tmp_path, how):
    leader_root, root = roots(tmp_path)
    write_progress(leader_root, progress(100))
    leader = Leader(leader_root)
    copy = follower(root, leader)
    copy.copy()
    write_progress(leader_root, progress(100, bump={3: 9000}))
    if how == "restarted":
        copy = follower(root, leader)
    elif how == "new term":
        leader.epoch = EPOCH + 1
    else:
        leader.log = ProgressLog(leader_root)
    copy.copy()
    assert leader.rows[-1] == 100
    assert same_progress(root, leader_root)


# ---------------------------------------------------------------- the previous version


def test_a_leader_of_the_previous_version_is_copied_whole(tmp_path):
    leader_root, root = roots(tmp_path)
    write_progress(leader_root, progress(50))
    leader = Leader(leader_root, old=True)
    copy = follower(root, leader)
    assert copy.copy() and same_progress(root, leader_root)
    assert copy.copy() is False  # the same answer again: nothing to do
    write_progress(leader_root, progress(50, bump={7: 777}))
    assert copy.copy() and same_progress(root, leader_root)
    assert copy.error is None and all("since" in a for a in leader.asked)


def test_a_follower_of_the_previous_version_is_answered_the_older_shape(tmp_path):
    leader_root, _ = roots(tmp_path)
    held = progress(40, acks={2: {400}})
    write_progress(leader_root, held)
    answer = ProgressLog(leader_root).answer(EPOCH, {})  # the older follower's empty body
    assert set(answer) == {"epoch", "offsets", "acks"}
    got = parse_progress(loads(dumps(answer), "the answer"))
    assert got.offsets == held.offsets and got.acks == held.acks and got.epoch == EPOCH


# ---------------------------------------------------------------- a bad delta


def _delta_bad(how: str):
    def replace(answer):
        if answer["since"] is None:
            return answer
        if how == "wrong term":
            answer["epoch"] = EPOCH + 1
        elif how == "another log":
            answer["log"] = "ffff"
        elif how == "from the future":
            answer["since"] += 5
            answer["version"] += 5
        elif how == "version before since":
            answer["version"] = answer["since"] - 1
        elif how == "a queue twice":
            for column in ("name", "queue", "offset", "ack_count"):
                answer[column] = answer[column] * 2
        elif how == "offset moved back":
            answer["offset"][0] = 1
        elif how == "acks below the offset":
            answer["ack_count"][0] = 1
            answer["acks"] = [0]
        elif how == "acks twice":
            answer["ack_count"][0] = 2
            answer["acks"] = [10 ** 6, 10 ** 6]
        elif how == "a bool offset":
            answer["offset"][0] = True
        elif how == "an offset too large":
            answer["offset"][0] = 1 << 64
        elif how == "a field more":
            answer["more"] = 1
        elif how == "a name unknown":
            answer["name"][0] = len(answer["names"])
        elif how == "a column short":
            answer["queue"] = answer["queue"][1:]
        return answer
    return replace


@pytest.mark.parametrize("how", [
    "wrong term", "another log", "from the future", "version before since", "a queue twice",
    "offset moved back", "acks below the offset", "acks twice", "a bool offset",
    "an offset too large", "a field more", "a name unknown", "a column short"])
def test_a_malformed_delta_leaves_the_files_byte_identical(tmp_path, how, caplog):
    leader_root, root = roots(tmp_path)
    write_progress(leader_root, progress(100))
    leader = Leader(leader_root)
    copy = follower(root, leader)
    assert copy.copy()
    before = files_bytes(root)
    write_progress(leader_root, progress(100, bump={1: 5000, 2: 6000}))
    leader.replace = _delta_bad(how)
    assert copy.copy() is False
    assert files_bytes(root) == before
    assert copy.error
    assert len([r for r in caplog.records if "consumer progress" in r.getMessage()]) == 1
    # refused: the next ask is for a full copy, which mends it
    leader.replace = None
    copy.copy()
    assert leader.asked[-1] == {"since": None}
    assert same_progress(root, leader_root) and copy.error is None


def test_an_oversized_delta_is_refused_whole(tmp_path, monkeypatch):
    leader_root, root = roots(tmp_path)
    write_progress(leader_root, progress(10))
    leader = Leader(leader_root)
    copy = follower(root, leader)
    copy.copy()
    before = files_bytes(root)
    write_progress(leader_root, progress(10, bump={i: 900 + i for i in range(5)},
                                         acks={0: {2000, 2001, 2002}}))
    monkeypatch.setattr(files, "MAX_QUEUES", 4)

    def more_rows(answer):  # (the leader itself sends at most MAX_QUEUES)
        extra = list(range(1000, 1006))
        return {**answer, "name": answer["name"] + [0] * 6, "queue": answer["queue"] + extra,
                "offset": answer["offset"] + [1] * 6, "ack_count": answer["ack_count"] + [0] * 6}
    leader.replace = more_rows
    assert copy.copy() is False and "at most" in copy.error
    assert files_bytes(root) == before
    copy.copy()  # (the full copy asked next)
    before = files_bytes(root)
    write_progress(leader_root, progress(10, bump={i: 1900 + i for i in range(5)},
                                         acks={0: {3000, 3001, 3002}}))
    monkeypatch.setattr(files, "MAX_QUEUES", 100)
    monkeypatch.setattr(files, "MAX_ACKS_PER_QUEUE", 2)
    leader.replace = lambda a: {**a, "ack_count": [3] + a["ack_count"][1:]}
    assert copy.copy() is False
    assert files_bytes(root) == before


def test_a_check_costs_arrays_not_a_python_object_per_queue():
    """A copy parses to columns (NumPy), rows ordered by group, topic and queue."""
    answer = {"epoch": 1, "log": "ab", "version": 1, "since": None,
              "names": ["t@b", "t@a"], "name": [0, 1, 1], "queue": [0, 2, 1],
              "offset": [5, 6, 7], "ack_count": [1, 0, 0], "acks": [9]}
    table = parse_answer(answer)
    assert table.names == ("t@a", "t@b") and isinstance(table.offset, np.ndarray)
    assert table.queue.tolist() == [1, 2, 0] and table.offset.tolist() == [7, 6, 5]
    assert table.acks.tolist() == [9] and table.ack_count.tolist() == [0, 0, 1]


def test_the_columns_merge_as_the_dictionaries_do():
    """The columnar merge keeps what :func:`merged` (the previous version's) keeps, over
    random copies of the same and of other terms."""
    rng = np.random.default_rng(7)

    def random_progress(epoch):
        offsets, acks = {}, {}
        for _ in range(int(rng.integers(0, 40))):
            key = (f"g{rng.integers(3)}", f"t{rng.integers(3)}", int(rng.integers(6)))
            offsets[key] = int(rng.integers(0, 20))
            if rng.random() < 0.3:
                acks[key] = frozenset(int(a) for a in rng.integers(21, 30, 3))
        return ConsumerProgress(offsets, acks, epoch)

    for _ in range(300):
        held = random_progress(int(rng.integers(1, 3)))
        copy = random_progress(int(rng.integers(1, 3)))
        expected = merged(held, copy)
        got = merged_table(table_of(held), table_of(copy))
        if expected is None:
            assert got is None or got.to_progress() == held
        else:
            assert got is not None and got.to_progress() == expected


@pytest.mark.parametrize("since", [
    None, "3", {"epoch": EPOCH, "log": "other", "version": 1},
    {"epoch": EPOCH - 1, "version": 1}, {"epoch": EPOCH, "version": 99},  # (log filled in)
    {"epoch": EPOCH, "version": -1}, {"epoch": EPOCH, "version": True}])
def test_a_leader_answers_whole_a_version_it_does_not_know(tmp_path, since):
    leader_root, _ = roots(tmp_path)
    write_progress(leader_root, progress(20))
    log = ProgressLog(leader_root)
    assert log.answer(EPOCH, {"since": None})["version"] == 1
    if isinstance(since, dict) and "log" not in since:
        since = {**since, "log": log.log}
    answer = log.answer(EPOCH, {"since": since})
    assert answer["since"] is None and len(answer["queue"]) == 20
    known = log.answer(EPOCH, {"since": {"epoch": EPOCH, "log": log.log, "version": 1}})
    assert known["since"] == 1 and known["queue"] == []
