"""The flush thread never swallows an error: it logs it and the next write raises it, typed."""

from __future__ import annotations

import logging
import time

import pytest

from store import FlushError, Message, MessageStore, StoreConfig


def test_a_failed_background_flush_is_logged_and_raised_by_the_next_write(store_path, caplog):
    config = StoreConfig(commitlog_file_size_bytes=1 << 16, flush_interval_commitlog_ms=10)
    s = MessageStore.open(store_path, config)
    p = s.producer("g")
    p.send(Message("t", b"x"))

    def broken(*_args, **_kwargs):
        raise OSError(5, "Input/output error")

    original = s.commit_log.flush
    s.commit_log.flush = broken
    with caplog.at_level(logging.ERROR, logger="store"):
        p.send(Message("t", b"y"))  # a new generation for the flusher to flush
        deadline = time.monotonic() + 5
        while s.flusher.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert any("flush of store" in r.getMessage() for r in caplog.records)
    s.commit_log.flush = original
    with pytest.raises(FlushError, match="Input/output error"):
        p.send(Message("t", b"z"))
    p.send(Message("t", b"z"))  # reported once; the store keeps working
    s.flush()
    s.close()


def test_flush_raises_the_background_error_too(store_path):
    s = MessageStore.open(store_path, StoreConfig(commitlog_file_size_bytes=1 << 16),
                          flush_service=False)
    s.flusher.error = OSError(28, "No space left on device")
    with pytest.raises(FlushError, match="No space left"):
        s.flush()
    s.flush()
    s.close()
