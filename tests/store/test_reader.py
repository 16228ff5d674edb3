"""A store opened read-only: reads what the writer wrote, refuses every write with a typed error."""

from __future__ import annotations

import hashlib
import os

import pytest

from store import (
    Message,
    MessageStore,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
    StoreReader,
)
from store.facade.store_reader import WRITE_METHODS


def _tree_digest(root: str) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture
def written(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        p = s.producer("g")
        for i in range(5):
            p.send(Message("orders", b"m%d" % i, tags="t"))
    return store_path


def test_open_read_only_returns_a_reader_that_reads_like_the_writer(written):
    with MessageStore.open(written, read_only=True) as reader:
        assert isinstance(reader, StoreReader) and reader.read_only
        assert reader.topics() == ["orders"]
        bodies = sorted(v.body for q in reader.queue_ids("orders")
                        for v in reader.pull("orders", q, 0))
        assert bodies == [b"m%d" % i for i in range(5)]


@pytest.mark.parametrize("operation", WRITE_METHODS)
def test_every_write_method_is_refused_naming_the_operation(written, operation):
    before = _tree_digest(written)
    reader = StoreReader.open(written)
    with pytest.raises(ReadOnlyStoreError) as info:
        getattr(reader, operation)()
    assert info.value.operation == operation
    assert f"{operation}()" in str(info.value) and "read-only" in str(info.value)
    assert isinstance(info.value, StoreError) and isinstance(info.value, StoreClosedError)
    reader.close()
    assert _tree_digest(written) == before


def test_the_reader_covers_every_public_write_method_of_the_store():
    """A new write method on MessageStore must be refused by the reader too."""
    reads = {name for name in dir(StoreReader) if not name.startswith("_")} - set(WRITE_METHODS)
    store_methods = {name for name in dir(MessageStore)
                     if not name.startswith("_") and callable(getattr(MessageStore, name))}
    # the core's own surface for services, and figures that need the services
    core_only = {"open", "start", "next_queue", "queue_count_for", "tags_code", "tag_hashes",
                 "has_tags_rule", "max_record_bytes",
                 "register_system_topic",
                 "add_retention_listener", "add_retention_guard", "add_recovery_listener",
                 "pending_delayed_stats", "pending_transaction_stats", "pending_messages",
                 "retention_plan", "transaction_origins",
                 # a writable process's check that its store was not replaced under it
                 "check_identity", "replaced_error",
                 # a replica set leader's wait for its copies (the server's, around a write)
                 "defer_replica_wait", "end_replica_wait"}
    missing = store_methods - reads - set(WRITE_METHODS) - core_only
    assert missing == set()


def test_a_closed_reader_says_closed(written):
    reader = StoreReader.open(written)
    reader.close()
    with pytest.raises(StoreClosedError, match="closed"):
        reader.producer()


def test_a_directory_that_is_not_a_store_is_refused(tmp_path):
    with pytest.raises(StoreNotFoundError):
        StoreReader.open(str(tmp_path))
