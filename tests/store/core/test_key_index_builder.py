"""The message-key index built behind the sends (store.core.key_index): the query sees what
the index has not reached, a writer killed between its appends and their index, two writer
processes building one index, retention of index files, and ``rmq repair`` of the index."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
from click.testing import CliRunner

from rmq_cli.cli import main as cli
from store import Message, MessageStore, StoreReader
from tests.conftest import ROOT, SMALL

#: a writer process: sends ``count`` messages of keys ``w{writer}-{i}`` to topic T in batches
#: of 1 to 20, printing ``key commitlog_offset`` once each is acknowledged; ``--no-builder``
#: runs no builder thread (``flush_service=False``) and indexes once after the first third;
#: ``--kill`` SIGKILLs itself after the last acknowledgement; ``--close`` closes cleanly.
WRITER = textwrap.dedent("""
    import os, random, signal, sys
    sys.path.insert(0, {root!r})
    from store import Message, MessageStore
    from tests.conftest import SMALL
    path, writer, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = MessageStore.open(path, SMALL, flush_service=(mode != "no-builder"))
    producer = store.producer("g")
    rng = random.Random(writer)
    i = 0
    while i < count:
        n = min(count - i, rng.randint(1, 20))
        msgs = [Message("T", b"x" * rng.randint(10, 300), keys=f"w{{writer}}-{{j}}")
                for j in range(i, i + n)]
        results = [producer.send(msgs[0])] if n == 1 else producer.send_batch(msgs)
        sys.stdout.write("".join(f"w{{writer}}-{{j}} {{r.commitlog_offset}}\\n"
                                 for j, r in zip(range(i, i + n), results)))
        sys.stdout.flush()
        i += n
        if mode == "no-builder" and i >= count // 3 and i - n < count // 3:
            store.key_index.build(store.confirmed_offset())
    if mode == "close":
        store.close()
    else:
        os.kill(os.getpid(), signal.SIGKILL)
""").format(root=ROOT)


def _writer(path: str, writer: int, count: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, path, str(writer), str(count), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _acked(out: str) -> dict[str, int]:
    return {key: int(off) for key, off in (line.split() for line in out.splitlines()
                                           if line.count(" ") == 1)}


def _entries(store) -> int:
    return sum(f.index_count - 1 for f in store.key_index._refresh())


def _records(store) -> int:
    return sum(store.max_offset("T", q) for q in store.queue_ids("T"))


def _every_key_indexed_once(store, acked: dict[str, int]) -> None:
    """Each acknowledged key's record is in the index files exactly once, and the files hold
    two entries (UNIQ_KEY and the key) per record of the log: none twice, none skipped."""
    for key, offset in acked.items():
        assert store.key_index.lookup("T", key, 64) == [offset], key
        (view,) = store.query_messages("T", key=key)
        assert view.commitlog_offset == offset
    assert _entries(store) == 2 * _records(store)


def test_a_query_sees_what_the_index_has_not_reached(tmp_path):
    """Sends do not index: the files stay empty until the builder runs, yet a query finds
    every message acknowledged before it (the unindexed tail is walked)."""
    with MessageStore.open(str(tmp_path / "s"), SMALL, flush_service=False) as store:
        p = store.producer("g")
        first = p.send(Message("T", b"a", keys="k"))
        batch = p.send_batch([Message("T", b"b", keys=f"k{i} k") for i in range(5)])
        assert store.key_index.lookup("T", "k", 64) == []  # built behind the sends
        assert store.key_index.indexed_to() == 0
        want = [first.msg_id] + [r.msg_id for r in batch]
        assert [v.msg_id for v in store.query_messages("T", key="k")] == want
        assert store.view_message(batch[2].msg_id).msg_id == batch[2].msg_id
        # a reader of the store (a server's, another process's) before any index file exists
        with StoreReader.open(store.root, SMALL) as reader:
            assert not reader.key_index.has_files()
            assert [v.msg_id for v in reader.query_messages("T", key="k")] == want
        store.key_index.build(store.confirmed_offset())
        assert store.key_index.indexed_to() == store.confirmed_offset()
        assert len(store.key_index.lookup("T", "k", 64)) == 6
        assert [v.msg_id for v in store.query_messages("T", key="k")] == want
        later = p.send(Message("T", b"c", keys="k"))  # half indexed, half tail
        assert [v.msg_id for v in store.query_messages("T", key="k")] == want + [later.msg_id]
        assert [v.msg_id for v in store.query_messages("T", key="k", max=2)] == [
            want[-1], later.msg_id]


def test_the_builder_thread_catches_up(tmp_path):
    with MessageStore.open(str(tmp_path / "s"), SMALL) as store:
        store.producer("g").send_batch([Message("T", b"x", keys=f"k{i}") for i in range(50)])
        deadline = time.monotonic() + 10
        while store.key_index.indexed_to() < store.confirmed_offset():
            assert time.monotonic() < deadline, "the builder thread did not catch up"
            time.sleep(0.01)
        assert len(store.key_index.lookup("T", "k7", 64)) == 1


def test_a_writer_killed_between_its_appends_and_their_index(tmp_path):
    """No builder thread: a third of the log indexed, the rest only appended, then SIGKILL.
    The next open indexes the rest: every key once."""
    path = str(tmp_path / "s")
    proc = _writer(path, 1, 600, "no-builder")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    acked = _acked(out)
    assert len(acked) == 600
    with MessageStore.open(path, SMALL, flush_service=False) as store:
        _every_key_indexed_once(store, acked)
        assert store.key_index.indexed_to() == store.confirmed_offset()


def test_writers_killed_at_random_moments_while_the_builder_runs(tmp_path):
    rng = random.Random(53)
    path = str(tmp_path / "s")
    acked: dict[str, int] = {}
    for round_ in range(3):
        proc = _writer(path, round_, 100_000, "kill")
        lines = [proc.stdout.readline() for _ in range(rng.randint(50, 1500))]
        time.sleep(rng.uniform(0, 0.2))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        acked.update(_acked("".join(lines) + out))
    assert len(acked) > 100
    with MessageStore.open(path, SMALL, flush_service=False) as store:
        _every_key_indexed_once(store, acked)


def test_two_writer_processes_build_one_index(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, SMALL):
        pass  # created, so that both writers join one store
    procs = [_writer(path, w, 1500, "close") for w in (1, 2)]
    acked: dict[str, int] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        acked.update(_acked(out))
    assert len(acked) == 3000
    with MessageStore.open(path, SMALL, flush_service=False) as store:
        assert store.key_index.indexed_to() == store.confirmed_offset()  # clean closes
        _every_key_indexed_once(store, acked)


def test_index_files_older_than_the_commitlog_kept_go_with_it(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, SMALL, flush_service=False) as store:
        p = store.producer("g")
        sent = [p.send_batch([Message("T", b"x" * 200, keys=f"k{i}-{j}") for j in range(100)])
                for i in range(40)]  # 4000 records, 8000 entries: 4 to 5 files of 2047
        store.key_index.build(store.confirmed_offset())
        before = {f.name: f.end_phy_offset for f in store.key_index._refresh()}
        assert len(before) >= 4
        assert store.clean_expired_files(force=True) > 0
        low = store.commit_log.min_offset()
        after = [f.name for f in store.key_index._refresh()]
        gone = [n for n, end in before.items() if end < low and n != max(before)]
        assert gone and not set(gone) & set(after)
        assert set(after) == set(before) - set(gone)
        for batch in sent[-3:]:  # what the kept segment holds is still found
            for r in batch:
                if r.commitlog_offset >= low:
                    key = f"k{sent.index(batch)}-{batch.index(r)}"
                    assert [v.msg_id for v in store.query_messages("T", key=key)] == [r.msg_id]
    assert sorted(os.listdir(os.path.join(path, "index"))) == sorted(after)


def _repair(path: str) -> str:
    result = CliRunner().invoke(cli, ["repair", "--store", path])
    assert result.exit_code == 0, result.output
    return result.output


def _store_with_keys(path: str) -> list:
    with MessageStore.open(path, SMALL) as store:
        return store.producer("g").send_batch(
            [Message("T", b"x", keys=f"k{i % 50}") for i in range(1500)])  # two files


def _found(path: str, sent: list) -> None:
    """Every key's records in the index files (read-only: the open builds nothing)."""
    with MessageStore.open(path, SMALL, read_only=True) as store:
        for k in range(50):
            offsets = sorted(store.key_index.lookup("T", f"k{k}", 64))
            assert offsets == [r.commitlog_offset for i, r in enumerate(sent) if i % 50 == k]


def test_repair_rebuilds_an_index_whose_slots_or_chains_are_damaged(tmp_path):
    """Damage under a right header: a slot head past indexCount in one file, a chain
    pointing forward in the other.  ``rmq repair`` sets both aside and rebuilds the index
    from the CommitLog (a writable open would too: tests/store/core/test_key_index_check.py)."""
    path = str(tmp_path / "s")
    sent = _store_with_keys(path)
    names = sorted(os.listdir(os.path.join(path, "index")))
    assert len(names) == 2
    slots_at, entries_at = 40, 40 + 4 * SMALL.max_hash_slot_num
    with open(os.path.join(path, "index", names[0]), "r+b") as f:
        f.seek(slots_at + 4 * 7)
        f.write((5000).to_bytes(4, "big"))  # slot 7's head: an entry that does not exist
    with open(os.path.join(path, "index", names[1]), "r+b") as f:
        f.seek(entries_at + 20 * 3 + 16)
        f.write((9).to_bytes(4, "big"))  # entry 3's prevIndex: a later entry
    _repair(path)  # (its writable open finds them, or its own check does)
    listing = os.listdir(os.path.join(path, "index"))
    assert {f"{n}.damaged-1" for n in names} <= set(listing)
    _found(path, sent)
    assert "rebuilt the message-key index" not in _repair(path)  # a sound index is kept


def test_repair_rebuilds_a_missing_index(tmp_path):
    path = str(tmp_path / "s")
    sent = _store_with_keys(path)
    for name in os.listdir(os.path.join(path, "index")):
        os.unlink(os.path.join(path, "index", name))
    assert "rebuilt the message-key index" in _repair(path)
    _found(path, sent)


def test_verify_names_what_is_wrong(tmp_path):
    from store.files.index_file import IndexFile

    f = IndexFile(str(tmp_path / "i"), 16, 64, create=True)
    f.put(np.array([1, 2, 17]), np.array([100, 200, 300]), np.full(3, 1_700_000_000_000))
    assert f.verify(1000) is None
    assert "below the log end 300" in f.verify(300)
    f._slots()[5] = 9
    assert "slot 5 points at entry 9" in f.verify(1000)
    f.close()


def test_a_record_whose_keys_straddle_two_files_is_indexed_whole_after_a_crash(tmp_path):
    """A file fills between a record's two keys (2,047 entries a file, two a record); the
    builder dies before the next file holds the rest and before ``index_phy_offset`` moves.
    Indexing again from an earlier record adds the record's missing key, once."""
    with MessageStore.open(str(tmp_path / "s"), SMALL, flush_service=False) as store:
        sent = store.producer("g").send_batch(
            [Message("T", b"x", keys=f"k{i}") for i in range(1100)])
        store.key_index.build(store.confirmed_offset())
        first, newest = store.key_index._refresh()
        assert first.is_full() and newest.entries()["phy_offset"][0] == first.end_phy_offset
        newest.rechain(0)  # (the next file as the killed builder left it: empty)
        store.key_index._set_indexed_to(sent[1000].commitlog_offset)
        store.key_index.build(store.confirmed_offset())
        for i, r in enumerate(sent):
            assert store.key_index.lookup("T", f"k{i}", 64) == [r.commitlog_offset], i
        assert _entries(store) == 2 * len(sent)
