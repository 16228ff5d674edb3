"""The first-use check of the message-key index files (store.core.key_lookup,
IndexFile.check_chains): a file whose slots or chains were damaged under an intact header,
or that was cut short, is noticed by a writable open (set aside, rebuilt from the
CommitLog) and by a reader (which answers from the CommitLog records the file held), so a
query by key never returns fewer messages than were sent."""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import pytest

from store import Message, MessageStore, StoreReader
from store.files.index_file import IndexFile, java_hash_text
from store.files.index_seal import SEAL_PATH, read_seal
from tests.conftest import SMALL

SLOTS_AT, ENTRIES_AT = 40, 40 + 4 * SMALL.max_hash_slot_num
KEYS = 50


def _store_with_keys(path: str) -> dict[str, list[int]]:
    """1,500 messages over 50 keys in two index files; ``key -> CommitLog offsets``."""
    with MessageStore.open(path, SMALL) as store:
        sent = store.producer("g").send_batch(
            [Message("T", b"x", keys=f"k{i % KEYS}") for i in range(1500)])
    offsets: dict[str, list[int]] = {}
    for i, r in enumerate(sent):
        offsets.setdefault(f"k{i % KEYS}", []).append(r.commitlog_offset)
    return offsets


def _files(path: str) -> list[str]:
    return sorted(os.path.join(path, "index", n) for n in os.listdir(os.path.join(path, "index"))
                  if n.isdigit())


def _zero_slots(file: str) -> None:
    with open(file, "r+b") as f:
        f.seek(SLOTS_AT)
        f.write(bytes(4 * SMALL.max_hash_slot_num))


def _break_chain(file: str) -> None:
    """The first entry from 700 on that links to an older one of its slot gets prevIndex 0:
    the older entries of its slot fall off the chain.  (Which entries share a slot depends on
    the messages' unique keys, different in each run.)"""
    with open(file, "r+b") as f:
        for entry in range(700, 1000):
            f.seek(ENTRIES_AT + 20 * entry + 16)
            if int.from_bytes(f.read(4), "big") != 0:
                break
        else:
            raise AssertionError("no entry from 700 to 999 links to an older one")
        f.seek(ENTRIES_AT + 20 * entry + 16)
        f.write(bytes(4))


def _truncate(file: str) -> None:
    os.truncate(file, ENTRIES_AT + 20 * 1000)


DAMAGE = {"zeroed slots": _zero_slots, "a broken chain": _break_chain, "cut short": _truncate}


def _answers(store, offsets: dict[str, list[int]]) -> None:
    for key, expected in offsets.items():
        got = [v.commitlog_offset for v in store.query_messages("T", key=key, max=1000)]
        assert sorted(got) == expected, key


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("which", [0, 1])
def test_a_reader_answers_every_key_of_a_damaged_file_from_the_commitlog(tmp_path, caplog,
                                                                         damage, which):
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    DAMAGE[damage](_files(path)[which])
    with caplog.at_level(logging.WARNING, "store.core.key_index"), \
            StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
        assert reader.view_message(reader.query_messages("T", key="k3")[0].msg_id)
    assert "is damaged" in caplog.text and "rmq repair" in caplog.text
    assert len(_files(path)) == 2  # a reader changes nothing


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_writable_open_sets_a_damaged_index_aside_and_rebuilds_it(tmp_path, damage):
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    damaged = _files(path)[0]
    DAMAGE[damage](damaged)
    with MessageStore.open(path, SMALL, flush_service=False) as store:
        _answers(store, offsets)
        for f in store.key_index._refresh():
            assert f.check_chains() is None
    assert os.path.exists(damaged + ".damaged-1")  # set aside, never deleted
    with StoreReader.open(path, SMALL) as reader:  # the rebuilt files answer by themselves
        assert reader.key_index.tail(reader.confirmed_offset()).shape[1] == 0
        for key, expected in offsets.items():
            assert sorted(reader.key_index.lookup("T", key, 1000)) == expected


def test_check_chains_names_what_is_wrong(tmp_path):
    f = IndexFile(str(tmp_path / "i"), 16, 64, create=True)
    f.put(np.array([1, 2, 17, 33, 5]), np.arange(5) * 100, np.full(5, 1_700_000_000_000))
    assert f.check_chains() is None
    slots = f._slots()
    slots[1] = 0
    assert "slot 1 points at entry 0; allowed: 4" in f.check_chains()
    slots[1] = 3  # an older entry of the slot: the newest is skipped
    assert "slot 1 points at entry 3; allowed: 4" in f.check_chains()
    slots[1] = 4
    entries = f._entries()
    entries["prev_index"][4] = 1  # 33 -> 1, skipping 17
    assert "entry 4 has prevIndex 1" in f.check_chains()
    entries["prev_index"][4] = 3
    entries["key_hash"][2] = -2
    assert "entry 2 has keyHash -2" in f.check_chains()
    entries["key_hash"][2] = 2
    f.header()
    f._mm[32:36] = (9).to_bytes(4, "big")  # hashSlotCount
    assert "hashSlotCount 9; allowed: 3" in f.check_chains()
    f.close()


def test_a_put_in_progress_or_torn_passes(tmp_path):
    """Entries and slot heads published before the header (a put in progress, or one a
    killed writer left): the check takes them with the published ones."""
    f = IndexFile(str(tmp_path / "i"), 16, 64, create=True)
    f.put(np.array([1, 2, 17, 33, 5, 6, 7, 8, 9, 10]), np.arange(10) * 100,
          np.full(10, 1_700_000_000_000))
    f._mm[32:40] = bytes(f._mm[32:36]) + (6).to_bytes(4, "big")  # indexCount back to 6
    assert f.check_chains() is None
    f.close()


def test_a_reader_checking_while_a_writer_indexes_sees_no_damage(tmp_path, caplog):
    """Readers opened over and over while the builder thread indexes new sends: a file
    half-published by a put is checked again under the builders' lock, never taken for
    damaged."""
    path = str(tmp_path / "s")
    stop = threading.Event()
    with MessageStore.open(path, SMALL) as store:
        producer = store.producer("g")
        producer.send(Message("T", b"x", keys="k1"))

        def send() -> None:
            i = 0
            while not stop.is_set():
                producer.send_batch([Message("T", b"x", keys=f"k{(i + j) % KEYS}")
                                     for j in range(40)])
                i += 40
        sender = threading.Thread(target=send)
        sender.start()
        try:
            with caplog.at_level(logging.WARNING, "store.core.key_index"):
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    with StoreReader.open(path, SMALL) as reader:
                        assert reader.query_messages("T", key="k1")
        finally:
            stop.set()
            sender.join()
    assert "is damaged" not in caplog.text


class _Counts:
    """Counts the directory listings, ``flock`` calls and index-file openings of a block."""

    def __init__(self, monkeypatch) -> None:
        import fcntl

        from store.core import key_lookup
        self.listings = self.locks = self.opens = 0
        listdir, flock, index_file = os.listdir, fcntl.flock, key_lookup.IndexFile

        def counted_listdir(*args):
            self.listings += 1
            return listdir(*args)

        def counted_flock(*args):
            self.locks += 1
            return flock(*args)

        def counted_open(*args, **kwargs):
            self.opens += 1
            return index_file(*args, **kwargs)
        monkeypatch.setattr(os, "listdir", counted_listdir)
        monkeypatch.setattr(fcntl, "flock", counted_flock)
        monkeypatch.setattr(key_lookup, "IndexFile", counted_open)

    def reset(self) -> tuple[int, int, int]:
        got = self.listings, self.locks, self.opens
        self.listings = self.locks = self.opens = 0
        return got


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_file_costs_a_reader_the_lock_and_the_listing_once(tmp_path, monkeypatch,
                                                                    damage):
    """The verdict on a damaged file is kept for the file's identity: the second query takes
    it without the builders' lock, a directory listing or opening the file again."""
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    DAMAGE[damage](_files(path)[0])
    with StoreReader.open(path, SMALL) as reader:
        counts = _Counts(monkeypatch)
        _answers(reader, {"k1": offsets["k1"]})
        listings, locks, _ = counts.reset()
        assert listings >= 1 and locks >= 1  # the first look, under the builders' lock
        _answers(reader, offsets)
        assert counts.reset() == (0, 0, 0)


def test_a_damaged_file_replaced_or_changed_is_checked_again(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    damaged = _files(path)[0]
    with open(damaged, "rb") as f:
        sound = f.read()
    _truncate(damaged)
    with StoreReader.open(path, SMALL) as reader:
        counts = _Counts(monkeypatch)
        _answers(reader, offsets)
        assert reader.key_index._checked()[1]  # a range walked instead of the file
        counts.reset()
        os.truncate(damaged, ENTRIES_AT + 20 * 500)  # cut again, in place: checked again
        _answers(reader, offsets)
        _, locks, opens = counts.reset()
        assert locks >= 1 and opens >= 1
        _answers(reader, offsets)
        assert counts.reset() == (0, 0, 0)
        with open(damaged + ".repaired", "wb") as f:  # a sound copy put back in its place
            f.write(sound)
        os.replace(damaged + ".repaired", damaged)
        _answers(reader, offsets)
        assert counts.reset()[0] >= 1
        assert reader.key_index._checked()[1] == []  # the file answers again
        assert reader.key_index.tail(reader.confirmed_offset()).shape[1] == 0


def test_a_writer_still_rebuilds_what_a_reader_found_damaged(tmp_path):
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    _break_chain(_files(path)[1])
    with StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
        assert reader.key_index._checked()[1]
        with MessageStore.open(path, SMALL, flush_service=False):
            pass  # sets the damaged index aside and rebuilds it
        _answers(reader, offsets)
        assert reader.key_index._checked()[1] == []
        for key, expected in offsets.items():
            assert sorted(reader.key_index.lookup("T", key, 1000)) == expected


@pytest.mark.parametrize("damage", ["zeroed slots", "a broken chain"])
def test_a_reader_maps_a_sound_copy_put_back_under_the_same_name(tmp_path, damage):
    """A file of the right size replaced by a sound copy: the reader opens the new file
    (its old mapping still holds the damaged one) and answers from it."""
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    damaged = _files(path)[0]
    with open(damaged, "rb") as f:
        sound = f.read()
    DAMAGE[damage](damaged)
    with StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
        assert reader.key_index._checked()[1]
        with open(damaged + ".repaired", "wb") as f:
            f.write(sound)
        os.replace(damaged + ".repaired", damaged)
        _answers(reader, offsets)
        assert reader.key_index._checked()[1] == []


# -- the seal: what a writer found sound, taken by a CRC instead of the check -------------------

def _count_checks(monkeypatch) -> list[str]:
    """The names of the files whose chains are checked from now on (every check, in order)."""
    checked: list[str] = []
    check = IndexFile.check_chains

    def counted(self):
        checked.append(self.name)
        return check(self)
    monkeypatch.setattr(IndexFile, "check_chains", counted)
    return checked


def test_a_fresh_reader_takes_the_files_a_clean_close_sealed_without_the_check(tmp_path,
                                                                              monkeypatch):
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    assert set(read_seal(path)) == {os.path.basename(f) for f in _files(path)}
    checked = _count_checks(monkeypatch)
    with StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
        assert checked == []  # (before the seal: both files, at the first query)
        assert [f.first_use for f in reader.key_index._refresh()] == ["sealed", "sealed"]
    with MessageStore.open(path, SMALL, flush_service=False) as store:  # a writable open too
        _answers(store, offsets)
        assert checked == []


def test_a_builder_seals_a_file_when_it_fills(tmp_path, monkeypatch):
    """While the writer runs, a reader's first query checks only the file still filling."""
    path = str(tmp_path / "s")
    with MessageStore.open(path, SMALL, flush_service=False) as store:
        store.producer("g").send_batch([Message("T", b"x", keys=f"k{i}") for i in range(1500)])
        store.key_index.build(store.confirmed_offset())
        full, filling = _files(path)
        assert set(read_seal(path)) == {os.path.basename(full)}
        checked = _count_checks(monkeypatch)
        with StoreReader.open(path, SMALL) as reader:
            assert len(reader.query_messages("T", key="k7")) == 1
        assert checked == [os.path.basename(filling)]


@pytest.mark.parametrize("seal_damage", ["seal flipped", "file changed, its mtime put back"])
def test_a_seal_that_does_not_match_costs_a_check_never_a_skip(tmp_path, monkeypatch, caplog,
                                                               seal_damage):
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    first = _files(path)[0]
    if seal_damage == "seal flipped":
        seal = os.path.join(path, SEAL_PATH)
        with open(seal, "r+b") as f:
            f.seek(30)
            byte = f.read(1)
            f.seek(30)
            f.write(bytes([byte[0] ^ 1]))
        assert read_seal(path) == {}
    else:
        st = os.stat(first)
        _break_chain(first)
        os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))
    checked = _count_checks(monkeypatch)
    with caplog.at_level(logging.WARNING, "store.core.key_index"), \
            StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
    if seal_damage == "seal flipped":
        assert sorted(checked) == [os.path.basename(f) for f in _files(path)]
        assert "is damaged" not in caplog.text
    else:
        assert checked[0] == os.path.basename(first) and "is damaged" in caplog.text


def test_a_seal_that_cannot_be_written_costs_the_next_process_a_check(tmp_path, monkeypatch,
                                                                      caplog):
    from store.core import key_index

    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(key_index, "write_seal", full)
    path = str(tmp_path / "s")
    with caplog.at_level(logging.WARNING, "store.core.key_index"):
        offsets = _store_with_keys(path)  # (the builder filled a file, the close sealed)
    assert "seal was not written" in caplog.text and read_seal(path) == {}
    checked = _count_checks(monkeypatch)
    with StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
    assert len(checked) == 2


def _break_key_chain(file: str, key: str) -> None:
    """The newest entry of ``key`` in ``file`` that links to an older one gets prevIndex 0:
    the key's older entries in the file fall off its chain."""
    f = IndexFile(file, SMALL.max_hash_slot_num, SMALL.max_index_num, read_only=True)
    entries = f.entries()
    linked = np.flatnonzero((entries["key_hash"] == java_hash_text(key))
                            & (entries["prev_index"] != 0))
    f.close()
    with open(file, "r+b") as out:
        out.seek(ENTRIES_AT + 20 * (int(linked[-1]) + 1) + 16)
        out.write(bytes(4))


def test_a_file_damaged_in_a_writers_life_is_not_sealed_by_it(tmp_path, monkeypatch, caplog):
    """A writer took the newest file as sound at its open; the file is damaged while it runs,
    then fills: the builder seals it only after checking it again (its bytes are no longer
    those it took), so the next reader does not skip the check and loses no message."""
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    filling = _files(path)[1]
    with caplog.at_level(logging.WARNING, "store.core.key_index"), \
            MessageStore.open(path, SMALL, flush_service=False) as store:
        assert store.key_index._refresh()[1].first_use == "sealed"  # taken at the open
        _break_key_chain(filling, "T#k3")  # damage in the writer's life
        sent = store.producer("g").send_batch(
            [Message("T", b"x", keys=f"k{i % KEYS}") for i in range(600)])
        store.key_index.build(store.confirmed_offset())  # fills the file: sealed then
        assert len(_files(path)) == 3
    assert "not sealed" in caplog.text
    for i, r in enumerate(sent):
        offsets[f"k{i % KEYS}"].append(r.commitlog_offset)
    checked = _count_checks(monkeypatch)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "store.core.key_index"), \
            StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
    assert os.path.basename(filling) in checked and "is damaged" in caplog.text


def test_a_reader_checks_only_the_blocks_its_lookups_read(tmp_path, monkeypatch, caplog):
    """A reader takes a sealed file by its header's block, and each lookup's answer by the
    blocks it read; a block changed since the seal costs that file the whole check."""
    from store.files import index_seal

    monkeypatch.setattr(index_seal, "BLOCK_BYTES", 256)
    path = str(tmp_path / "s")
    offsets = _store_with_keys(path)
    first = _files(path)[0]
    record = read_seal(path)[os.path.basename(first)]
    assert record.block_bytes == 256 and len(record.crcs) > 100
    checked = _count_checks(monkeypatch)
    read: list[int] = []
    crcs = index_seal._block_crcs

    def counted(f, begin, last, covered, block):
        read.append(last - begin + 1)
        return crcs(f, begin, last, covered, block)
    monkeypatch.setattr(index_seal, "_block_crcs", counted)
    with StoreReader.open(path, SMALL) as reader:
        assert reader.query_messages("T", key="absent") == []
        assert 0 < sum(read) < len(record.crcs)  # its chain's blocks, not the files' 2 x 169
        assert len(reader.query_messages("T", key="k3", max=1000)) == len(offsets["k3"])
        assert checked == []
    _break_key_chain(first, "T#k3")  # (a block k3's lookups read)
    with caplog.at_level(logging.WARNING, "store.core.key_index"), \
            StoreReader.open(path, SMALL) as reader:
        _answers(reader, offsets)
    assert set(checked) == {os.path.basename(first)} and "is damaged" in caplog.text
