"""``prepared_in_order``: work prepared on two threads, handed back in order."""

from __future__ import annotations

import threading
import time
from contextlib import closing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.core.pipeline import HELPER_NAME, prepared_in_order


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == HELPER_NAME]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 0.002), max_size=30))
def test_results_come_back_in_order_and_both_threads_work(delays):
    seen_threads = set()

    def prepare(i):
        seen_threads.add(threading.current_thread().name)
        time.sleep(delays[i])
        return i * i

    assert list(prepared_in_order(len(delays), prepare)) == [i * i for i in range(len(delays))]
    if len(delays) <= 1:
        assert seen_threads <= {threading.current_thread().name}  # no helper for one chunk
    assert not _helpers()


def test_the_helper_takes_chunks_while_this_thread_is_busy():
    threads = []

    def prepare(i):
        threads.append(threading.current_thread().name)
        time.sleep(0.01)
        return i

    out = []
    for value in prepared_in_order(8, prepare):
        time.sleep(0.02)  # a slow append: the helper prepares ahead meanwhile
        out.append(value)
    assert out == list(range(8))
    assert threads.count(HELPER_NAME) >= 4


@pytest.mark.parametrize("bad", [0, 1, 5])
def test_an_error_is_raised_in_order_and_nothing_after_it(bad):
    consumed = []

    def prepare(i):
        if i == bad:
            raise ValueError(f"chunk {i}")
        return i

    with pytest.raises(ValueError, match=f"chunk {bad}"):
        for value in prepared_in_order(8, prepare):
            consumed.append(value)
    assert consumed == list(range(bad))  # chunks before the bad one, none after
    assert not _helpers()


def test_stopping_early_stops_the_helper():
    started = []

    def prepare(i):
        started.append(i)
        time.sleep(0.005)
        return i

    with closing(prepared_in_order(100, prepare)) as chunks:
        for value in chunks:
            if value == 2:
                break
    assert not _helpers()
    assert len(started) < 100  # the helper did not run through the rest


def test_one_encode_thread_prepares_everything_on_the_calling_thread():
    threads = set()

    def prepare(i):
        threads.add(threading.current_thread().name)
        time.sleep(0.002)
        return i

    # threads=1: as a store's encode_threads, which the rmq sink sets in Spark tasks
    assert list(prepared_in_order(10, prepare, threads=1)) == list(range(10))
    assert threads == {threading.current_thread().name}


@pytest.mark.parametrize("ahead", [1, 2, 5])
def test_no_chunk_is_prepared_more_than_ahead_past_the_one_taken_next(ahead):
    """However slowly the caller takes them, at most ``ahead`` chunks past the one it takes
    next are prepared (what a large append holds in memory)."""
    started = []

    def prepare(i):
        started.append(i)
        return i

    out = []
    for value in prepared_in_order(30, prepare, ahead=ahead):
        for _ in range(3):  # a slow append: the helper runs as far ahead as it may
            time.sleep(0.001)
            assert max(started) < value + 1 + ahead, (value, max(started))
        out.append(value)
    assert out == list(range(30)) and sorted(started) == list(range(30))
    assert not _helpers()
