"""Staged records placed as they were encoded (:mod:`store.core.placement_chain`): a stage's
chunks get their placement fields in their headers before the record kernel copies them,
and the append writes them itself only when another write came between."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from store import MessageStore
from store.core import appender
from store.produce.table_producer import CHUNK_ROWS


def _table(n):
    return pa.table({"topic": ["orders"] * n, "body": [b"m%06d" % i for i in range(n)],
                     "tags": [("a", "b")[i // 5000 % 2] for i in range(n)]})


def _count_patches(monkeypatch) -> list:
    calls = []
    real = appender.patch_placed

    def counted(records, *args):
        calls.append(len(records.starts))
        return real(records, *args)

    monkeypatch.setattr(appender, "patch_placed", counted)
    return calls


def _check_committed(store, n: int, staged_at: int) -> None:
    """Every committed row's record says where it lies, in which queue, when it was staged
    and (PREPAREDTRANSACTIONOFFSET) the tagsCode of its ConsumeQueue entry."""
    seen = 0
    for q in store.queue_ids("orders"):
        e = store.queue_entries("orders", q, store.min_offset("orders", q),
                                store.max_offset("orders", q))
        for off, code in zip(e["offset"].tolist(), e["tags_code"].tolist()):
            rec = store.read_record(int(off))
            assert (rec.physical_offset, rec.queue_id, rec.queue_offset) == (off, q, -1)
            assert (rec.store_timestamp_ms, rec.prepared_transaction_offset) == (staged_at,
                                                                                  code)
            seen += 1
    assert seen == n


def test_staged_chunks_are_placed_as_encoded_without_a_pass_over_them(
        tmp_path, small_config, clock, monkeypatch):
    config = replace(small_config, commitlog_file_size_bytes=1 << 20)  # chunks cross segments
    n = 3 * CHUNK_ROWS + 77
    with MessageStore.open(str(tmp_path / "s"), config, clock=clock) as store:
        store.encode_threads = 1
        sink = store.sink("x")
        calls = _count_patches(monkeypatch)
        staged = sink.stage(_table(n))
        assert calls == []  # every chunk landed where it was presumed to
        staged_at = clock()
        clock.advance(10)
        assert sink.commit(0, staged).rows == n
        _check_committed(store, n, staged_at)


def test_a_write_between_staged_chunks_is_placed_around(tmp_path, small_config, clock,
                                                        monkeypatch):
    config = replace(small_config, commitlog_file_size_bytes=1 << 20)
    n = 3 * CHUNK_ROWS
    with MessageStore.open(str(tmp_path / "s"), config, clock=clock) as store:
        store.encode_threads = 1
        sink = store.sink("x")
        calls = _count_patches(monkeypatch)
        real = store.append_assembled
        chunks = []

        def append_assembled(records):  # another writer's record before the second chunk
            chunks.append(len(records.starts))
            if len(chunks) == 2:
                store.producer().send_table(pa.table({"topic": ["other"], "body": [b"x"]}))
            return real(records)

        monkeypatch.setattr(store, "append_assembled", append_assembled)
        staged = sink.stage(_table(n))
        # the other record, then the chunks after it: placed by the append
        assert calls == [1, CHUNK_ROWS, CHUNK_ROWS]
        staged_at = clock()
        assert sink.commit(0, staged).rows == n
        _check_committed(store, n, staged_at)
