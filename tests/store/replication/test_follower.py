"""The follower's loop without a network (a leader stand-in answering from a local store):
an answer cut off half-way leaves nothing visible, and the follower then goes on; the next
request (the follower's report) does not wait for the end of an answer's stream."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from store import Message, MessageStore, RemoteError, StoreReader
from store.base.remote_address import RemoteAddress
from store.remote import replication_stream as log_stream
from store.replication.follower import Follower

SMALL = {"commitlog_file_size_bytes": 64 * 1024}


class StandIn:
    """Answers ``log_chunks`` from a local store as the leader's service would; raises
    after ``cut_after`` batches of an answer while it is set."""

    address = RemoteAddress("127.0.0.1", 1)

    def __init__(self, store, cut_after: int | None, hold_end: threading.Event | None = None):
        self.store = store
        self.cut_after = cut_after
        self.cuts = 0
        self.hold_end = hold_end  # (set: an answer with data ends its stream only once set)
        self.starts: list[int] = []

    def log_chunks(self, start, *, tail_crc, file_size, max_bytes, wait_ms, replica=None,
                   high_watermark=None, epoch=None):
        request = log_stream.parse_request({"from": start, "tail_crc": tail_crc,
                                            "file_size": file_size, "max_bytes": max_bytes,
                                            "wait_ms": min(wait_ms, 50)})
        self.starts.append(start)
        first = log_stream.first_chunk(self.store, request)
        for i, batch in enumerate(log_stream.answer(self.store, request, first)):
            if self.cut_after is not None and i == self.cut_after:
                self.cuts += 1
                raise RemoteError("the leader went away half-way")
            yield batch
        if self.hold_end is not None and first.data:
            self.hold_end.wait()

    def refresh(self):
        pass

    def topics(self):
        return []

    def close(self):
        pass


def wait(what, check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_an_answer_cut_off_half_way_leaves_nothing_visible(tmp_path, monkeypatch):
    monkeypatch.setattr(log_stream, "CHUNK_BYTES", 4096)
    with MessageStore.open(str(tmp_path / "a"), SMALL) as leader, \
            MessageStore.open(str(tmp_path / "b"), SMALL) as store:
        leader.producer("g").send_table(pa.table({"body": [b"x%d" % i * 20 for i in range(2000)]}),
                                        topic="t")
        stand_in = StandIn(leader, cut_after=3)
        follower = Follower(store, stand_in).start()
        try:
            wait("a cut answer", lambda: stand_in.cuts >= 2)
            assert follower.state == "unreachable"
            assert store.confirmed_offset() == 0  # three chunks were appended, then dropped
            with StoreReader.open(str(tmp_path / "b")) as reader:
                assert reader.confirmed_offset() == 0
                assert all(reader.max_offset("t", q) == 0 for q in reader.queue_ids("t"))
            stand_in.cut_after = None
            wait("caught up", lambda: store.confirmed_offset() == leader.confirmed_offset())
            assert follower.status()["lag_bytes"] == 0
            assert sum(store.max_offset("t", q) for q in store.queue_ids("t")) == 2000
        finally:
            follower.stop()
        leader.producer("g").send(Message("t", b"more"))
        follower = Follower(store, stand_in).start()  # a restart goes on from its end
        try:
            wait("caught up again",
                 lambda: store.confirmed_offset() == leader.confirmed_offset())
        finally:
            follower.stop()


def test_the_next_request_does_not_wait_for_the_end_of_an_answers_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(log_stream, "CHUNK_BYTES", 4096)  # (answers of many batches)
    with MessageStore.open(str(tmp_path / "a"), SMALL) as leader, \
            MessageStore.open(str(tmp_path / "b"), SMALL) as store:
        table = pa.table({"body": [b"x%d" % i * 20 for i in range(2000)]})
        leader.producer("g").send_table(table, topic="t")
        hold = threading.Event()
        stand_in = StandIn(leader, cut_after=None, hold_end=hold)
        follower = Follower(store, stand_in).start()
        try:
            end = leader.confirmed_offset()
            # every batch of the answer read and appended, then the next request (its report
            # of the new end) made while the answer's stream has not ended
            wait("the report of the whole answer", lambda: end in stand_in.starts, 10.0)
            assert stand_in.starts[0] == 0 and store.confirmed_offset() == end
            leader.producer("g").send(Message("t", b"more"))
            wait("the next answer", lambda: store.confirmed_offset() == leader.confirmed_offset(),
                 10.0)
            assert sum(store.max_offset("t", q) for q in store.queue_ids("t")) == 2001
        finally:
            hold.set()
            follower.stop()
