"""``config/replica.role``: the role a replica's server shares with its gRPC workers."""

from __future__ import annotations

import os
import struct
import threading
import zlib

import pytest

from store.base.errors import StoreError
from store.files import replica_role
from store.files.replica_role import LAYOUT, ROLE_FILE, ReplicaRole, RoleFile, monotonic_ms


def test_the_layout_is_eight_byte_words_big_endian(tmp_path):
    assert LAYOUT.size == 56 == struct.calcsize(">8sQqqqqQ")
    (tmp_path / "config").mkdir()
    writer = RoleFile.create(str(tmp_path))
    reader = RoleFile.open(str(tmp_path))
    try:
        assert reader.read() == ReplicaRole(0, False, 0, -1)  # made saying "not leading"
        writer.write(7, True, 123456, 4096)
        assert reader.read() == ReplicaRole(7, True, 123456, 4096)
        raw = (tmp_path / ROLE_FILE).read_bytes()
        assert raw[:8] == b"RMQROLE1"
        assert struct.unpack(">Qqqqq", raw[8:48]) == (2, 7, 1, 123456, 4096)  # 1 write
        assert struct.unpack(">Q", raw[48:56])[0] == zlib.crc32(raw[8:48])
    finally:
        reader.close()
        writer.close()


def test_takes_writes_only_leading_within_the_lease():
    now = monotonic_ms()
    assert ReplicaRole(1, True, now + 1000, -1).takes_writes(now)
    assert not ReplicaRole(1, True, now, -1).takes_writes(now)  # ran out
    assert not ReplicaRole(1, False, now + 1000, -1).takes_writes(now)


def test_a_reader_never_takes_fields_of_two_writes(tmp_path):
    """Every field written is the epoch times a constant: a torn read would break it."""
    (tmp_path / "config").mkdir()
    writer, reader = RoleFile.create(str(tmp_path)), RoleFile.open(str(tmp_path))
    stop = threading.Event()

    def write() -> None:
        e = 0
        while not stop.is_set():
            e += 1
            writer.write(e, e % 2 == 0, e * 3, e * 5)
    thread = threading.Thread(target=write)
    thread.start()
    try:
        for _ in range(20_000):
            r = reader.read()
            assert (r.lease_until_ms, r.acked_end, r.leading) == (
                r.epoch * 3, r.epoch * 5, r.epoch % 2 == 0) or r.epoch == 0
    finally:
        stop.set()
        thread.join()
        reader.close()
        writer.close()


def test_a_writer_dead_mid_write_reads_as_not_leading(tmp_path, monkeypatch):
    (tmp_path / "config").mkdir()
    writer, reader = RoleFile.create(str(tmp_path)), RoleFile.open(str(tmp_path))
    writer.write(3, True, monotonic_ms() + 10_000, 10)
    replica_role.GENERATION.pack_into(writer._map, replica_role.GENERATION_OFFSET, 5)  # odd
    monkeypatch.setattr(replica_role, "MAX_READ_WAIT_S", 0.01)
    assert reader.read() == replica_role.NOT_LEADING
    reader.close()
    writer.close()


def test_fields_seen_before_their_check_are_never_taken(tmp_path, monkeypatch):
    """A weakly ordered CPU may show another process the primary's new fields before its
    new check word (or the generation's move): a copy that mixes two writes is refused
    (read again, and taken for *not leading* if it stays so), never returned."""
    (tmp_path / "config").mkdir()
    writer, reader = RoleFile.create(str(tmp_path)), RoleFile.open(str(tmp_path))
    writer.write(3, False, 0, 10)
    # the next write's fields visible, its generation and check not yet
    replica_role.FIELDS.pack_into(writer._map, replica_role.FIELDS_OFFSET,
                                  4, 1, monotonic_ms() + 10_000, 20)
    monkeypatch.setattr(replica_role, "MAX_READ_WAIT_S", 0.01)
    assert reader.read() == replica_role.NOT_LEADING
    writer.write(4, True, monotonic_ms() + 10_000, 20)  # the write completes
    role = reader.read()
    assert (role.epoch, role.leading, role.acked_end) == (4, True, 20)
    reader.close()
    writer.close()


def test_a_missing_short_or_foreign_file_is_refused(tmp_path):
    (tmp_path / "config").mkdir()
    with pytest.raises(StoreError, match="made by the replica's server"):
        RoleFile.open(str(tmp_path))
    path = tmp_path / ROLE_FILE
    path.write_bytes(b"RMQROLE1" + bytes(8))
    with pytest.raises(StoreError, match="holds 16 bytes"):
        RoleFile.open(str(tmp_path))
    path.write_bytes(b"NOTAROLE" + bytes(48))
    with pytest.raises(StoreError, match="does not start with"):
        RoleFile.open(str(tmp_path))
    assert os.path.getsize(path) == 56  # a reader never writes
