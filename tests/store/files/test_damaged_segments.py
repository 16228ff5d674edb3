"""One damaged file leaves the rest of the store readable (issue: damaged files, items 4-6).

CommitLog and ConsumeQueue files of the wrong length, damage in an older segment during a
full rescan, queues that lost their head or tail, queue entries pointing at the wrong record,
bodies whose CRC fails: the store opens, serves every intact message, reports the damaged
ones with a typed error naming the file, and keeps every damaged file it replaces.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from click.testing import CliRunner

from store import CorruptRecordError, Message, MessageStore

SEG = 64 * 1024


@pytest.fixture
def filled(store_path, small_config, clock):
    """Four CommitLog segments of messages on one queue, closed cleanly."""
    cfg = small_config.replace(default_queue_count=1)
    sent = []
    with MessageStore.open(store_path, cfg, clock=clock) as s:
        p = s.producer("g")
        for i in range(700):
            r = p.send(Message("orders", b"order-%04d-" % i + b"x" * 300))
            sent.append((r.commitlog_offset, r.queue_offset, b"order-%04d-" % i + b"x" * 300))
    assert len(glob.glob(os.path.join(store_path, "commitlog", "*"))) >= 4
    return store_path, cfg, sent


def _segment(path, n):
    return sorted(glob.glob(os.path.join(path, "commitlog", "0*")))[n]


def _readable(store, sent):
    """Queue offset -> body of every message a pull returns; a pull serves the messages
    before a damaged one, and the pull from the damaged one raises: it is skipped."""
    out, errors = {}, []
    off, hi = store.min_offset("orders", 0), store.max_offset("orders", 0)
    while off < hi:
        try:
            views = store.pull("orders", 0, off, 50)
        except CorruptRecordError as exc:
            errors.append((off, exc))
            off += 1
            continue
        if not views:
            break
        for v in views:
            out[v.queue_offset] = v.body
        off = views[-1].queue_offset + 1
    return out, errors


@pytest.mark.parametrize("how", ["truncate", "extend"])
@pytest.mark.parametrize("read_only", [True, False])
def test_an_older_commitlog_segment_of_the_wrong_length(filled, clock, how, read_only):
    path, cfg, sent = filled
    seg = _segment(path, 1)
    if how == "truncate":
        os.truncate(seg, SEG // 2)
    else:
        with open(seg, "ab") as fh:
            fh.write(b"\x13" * 100)
    with MessageStore.open(path, cfg, clock=clock, read_only=read_only) as s:
        got, errors = _readable(s, sent)
    size = len(sent[0][2]) + 200  # a record's bytes beyond the body, generously
    lost = {q for off, q, _ in sent if how == "truncate" and SEG * 1.5 < off + size
            and off < SEG * 2}
    assert all(got[q] == body for _, q, body in sent if q not in lost)  # the rest is served
    assert {off for off, _ in errors} == lost
    assert all(e.file == seg for _, e in errors)
    if read_only:  # nothing changed on disk
        assert os.path.getsize(seg) != SEG and not glob.glob(seg + ".damaged-*")
    else:  # kept aside, replaced by a full-length copy; writes go on, a reopen is clean
        assert os.path.getsize(seg) == SEG and glob.glob(seg + ".damaged-1")
        with MessageStore.open(path, cfg, clock=clock) as s:
            s.producer("g").send(Message("orders", b"after"))
        with MessageStore.open(path, cfg, clock=clock, read_only=True) as s:
            got2, _ = _readable(s, sent)
        assert got2[len(sent)] == b"after" and len(got2) == len(got) + 1


def test_a_truncated_newest_segment_ends_the_log_where_its_records_end(filled, clock):
    path, cfg, sent = filled
    seg = _segment(path, -1)
    start = int(os.path.basename(seg))
    cut = start + 5000
    os.truncate(seg, 5000)
    with MessageStore.open(path, cfg, clock=clock) as s:
        got, errors = _readable(s, sent)
        kept = [q for off, q, _ in sent if off + 400 <= cut]
        assert set(got) == set(kept) and not errors  # the queue ends with the valid records
        r = s.producer("g").send(Message("orders", b"after"))
        assert r.queue_offset == len(kept) and r.commitlog_offset < cut
    os.remove(os.path.join(path, "checkpoint"))  # a full rescan finds no gap
    with MessageStore.open(path, cfg, clock=clock) as s:
        got, errors = _readable(s, sent)
        assert len(got) == len(kept) + 1 and not errors


def test_a_full_rescan_skips_damage_in_an_older_segment(filled, clock):
    """Before: recovery without a checkpoint cut the log at the first bad record, and with it
    every later segment."""
    path, cfg, sent = filled
    seg = _segment(path, 1)
    target = next(off for off, _, _ in sent if off > SEG + 1000)
    with open(seg, "r+b") as fh:  # a record's header
        fh.seek(target - SEG)
        fh.write(b"\xff" * 64)
    os.remove(os.path.join(path, "checkpoint"))
    with MessageStore.open(path, cfg, clock=clock) as s:
        got, errors = _readable(s, sent)
    later = [q for off, q, _ in sent if off >= 2 * SEG]
    assert later and all(q in got for q in later)
    assert [e.position for _, e in errors] == [target]


@pytest.mark.parametrize("where", ["head", "tail", "file"])
def test_a_queue_that_lost_entries_is_rebuilt_by_the_open(filled, clock, where):
    path, cfg, sent = filled
    (qfile,) = glob.glob(os.path.join(path, "consumequeue", "orders", "0", "0*"))
    if where == "file":
        os.remove(qfile)
    else:
        with open(qfile, "r+b") as fh:
            fh.seek(0 if where == "head" else 20 * (len(sent) - 50))
            fh.write(bytes(20 * 50))
    with MessageStore.open(path, cfg, clock=clock) as s:
        got, errors = _readable(s, sent)
    assert got == {q: body for _, q, body in sent} and not errors
    table = json.load(open(os.path.join(path, "config", "queueTable.json")))
    assert table["queues"]["orders"]["0"] == [0, len(sent)]


def test_a_clean_open_rebuilds_nothing(filled, clock, caplog):
    path, cfg, sent = filled
    for _ in range(2):
        with MessageStore.open(path, cfg, clock=clock) as s:
            assert not s.recovered
    assert "rebuilding" not in caplog.text


def test_a_queue_entry_pointing_at_another_record_is_rebuilt_not_served_as_that_record(
        filled, clock):
    """The entry's record does not match it, the CommitLog says otherwise: the read rebuilds
    the queue (in memory, the store being opened read-only) and serves the right records."""
    path, cfg, sent = filled
    (qfile,) = glob.glob(os.path.join(path, "consumequeue", "orders", "0", "0*"))
    with open(qfile, "r+b") as fh:  # entry 5 now points at record 6 (offset and size)
        fh.seek(20 * 6)
        six = fh.read(12)
        fh.seek(20 * 5)
        fh.write(six)
    bodies = {q: body for _, q, body in sent}
    with MessageStore.open(path, cfg, clock=clock, read_only=True) as s:
        assert [v.body for v in s.pull("orders", 0, 5, 1)] == [bodies[5]]
        batch = s.read_arrow("orders", 0, 0, 10)
        assert batch.column("queue_offset").to_pylist() == list(range(10))
        assert batch.column("body").to_pylist() == [bodies[q] for q in range(10)]
    with open(qfile, "rb") as fh:  # a reader changed nothing on disk
        fh.seek(20 * 5)
        assert fh.read(12) == six


def test_verify_crc_finds_a_flipped_body_bit(filled, clock):
    path, cfg, sent = filled
    off, q, body = sent[300]
    seg_path = _segment(path, off // SEG)
    with open(seg_path, "r+b") as fh:
        fh.seek(off % SEG + 100)  # inside the body
        b = fh.read(1)
        fh.seek(off % SEG + 100)
        fh.write(bytes([b[0] ^ 0x10]))
    with MessageStore.open(path, cfg, clock=clock, read_only=True) as s:
        assert s.pull("orders", 0, q, 1)[0].body != body  # served as is without the check
        with pytest.raises(CorruptRecordError, match="body CRC") as info:
            s.pull("orders", 0, q, 1, verify_crc=True)
        assert info.value.file == seg_path and info.value.position == off
        with pytest.raises(CorruptRecordError, match="body CRC") as info:
            s.read_arrow("orders", 0, 0, len(sent), verify_crc=True)
        assert info.value.position == off
        batch = s.read_arrow("orders", 0, 0, len(sent), verify_crc=True, skip_corrupt=True)
        assert batch.num_rows == len(sent) - 1
        assert q not in batch.column("queue_offset").to_pylist()
        report = s.verify_commitlog()
    assert report.records == len(sent) - 1
    assert report.bad_crc == [(seg_path, off, "body CRC does not match")] and not report.damaged

    from rmq_cli.cli import main

    r = CliRunner().invoke(main, ["stats", "--store", path, "--verify", "--json"])
    assert r.exit_code == 1
    data = json.loads(r.output)
    assert data["verify"]["bad_crc"] == [{"file": seg_path, "offset": off,
                                          "reason": "body CRC does not match"}]


def test_verify_of_an_intact_store(filled, clock):
    path, cfg, sent = filled
    with MessageStore.open(path, cfg, clock=clock, read_only=True) as s:
        report = s.verify_commitlog()
    assert report.ok and report.records == len(sent)
    from rmq_cli.cli import main

    r = CliRunner().invoke(main, ["stats", "--store", path, "--verify"])
    assert r.exit_code == 0 and "all intact" in r.output


def test_a_damaged_store_json_falls_back_to_its_backup(filled, clock, small_config):
    path, cfg, sent = filled
    store_json = os.path.join(path, "config", "store.json")
    data = json.load(open(store_json))
    data["layout"]["commitlog_file_size_bytes"] = 65537  # valid JSON, wrong value
    with open(store_json, "w") as fh:
        json.dump(data, fh)
    with MessageStore.open(path, small_config.replace(commitlog_file_size_bytes=1 << 20),
                           clock=clock, read_only=True) as s:
        assert s.config.commitlog_file_size_bytes == SEG
        got, errors = _readable(s, sent)
    assert len(got) == len(sent) and not errors


@pytest.mark.parametrize("content", [{"offsetTable": [1, 2]}, {"a": {"b": None}}])
def test_a_garbled_transaction_progress_file_is_read_past(filled, clock, content):
    path, cfg, sent = filled
    with MessageStore.open(path, cfg, clock=clock) as s:
        s.check_transactions(lambda v: None)
    progress = glob.glob(os.path.join(path, "config", "transactionOffset.json*"))
    assert progress
    for name in progress:
        with open(name, "w") as fh:
            json.dump(content, fh)
    with MessageStore.open(path, cfg, clock=clock) as s:
        s.check_transactions(lambda v: None)  # before: AttributeError


def _patch(path, offset, data):
    seg = _segment(path, offset // SEG)
    with open(seg, "r+b") as fh:
        fh.seek(offset % SEG)
        fh.write(data)


@pytest.mark.parametrize("field,value", [("queue_id", 70_000), ("queue_offset", 1 << 40),
                                         ("queue_offset", 3)])
def test_a_rebuild_does_not_index_a_record_whose_header_was_damaged(filled, clock, field,
                                                                    value):
    """The body CRC does not cover the header: a flipped queue id or offset passes the record
    checks.  Before, a rebuild widened the topic to 70,001 queues, or wrote an entry at
    offset 2**40, or let the record replace entry 3."""
    from store.formats.record_codec import FIELD_OFFSET

    path, cfg, sent = filled
    off, q, body = sent[400]
    width = 4 if field == "queue_id" else 8
    _patch(path, off + FIELD_OFFSET[field], value.to_bytes(width, "big"))
    with MessageStore.open(path, cfg, clock=clock) as s:
        result = s.rebuild_queues()
        assert s.queue_ids("orders") == [0]
        assert s.max_offset("orders", 0) == len(sent)
        got, errors = _readable(s, sent)
    assert result.entries >= len(sent) - 1
    assert got == {qo: b for _, qo, b in sent if qo != q}
    assert [o for o, _ in errors] == [q]  # the damaged one is reported, typed


def test_a_delayed_record_naming_no_valid_topic_is_skipped(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        p = s.producer("g")
        bad = p.send(Message("reminders", b"damaged"), delay_ms=500)
        p.send(Message("reminders", b"fine"), delay_ms=500)
    seg_path = _segment(store_path, 0)
    data = open(seg_path, "rb").read()
    start = bad.commitlog_offset if bad.commitlog_offset else 0
    where = data.index(b"reminders", start, start + 400)  # the REAL_TOPIC value of the first
    with open(seg_path, "r+b") as fh:
        fh.seek(where)
        fh.write(b"remi/ders")
    clock.advance(2_000)
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        s.deliver_due()
        bodies = [v.body for q in s.queue_ids("reminders")
                  for v in s.pull("reminders", q, 0, 10)]
    assert bodies == [b"fine"]
    assert not os.path.exists(os.path.join(store_path, "consumequeue", "remi"))


def test_a_rebuild_indexes_the_records_after_damage_in_the_newest_segment(filled, clock):
    """Before: the rebuild's scan stopped at the damaged record, so every later record of the
    newest segment lost its queue entry (and delayed copies there were delivered twice)."""
    path, cfg, sent = filled
    newest = int(os.path.basename(_segment(path, -1)))
    mine = [(off, q) for off, q, _ in sent if off >= newest]
    off, q = mine[len(mine) // 2]
    _patch(path, off + 100, b"\x00\xff\x00\xff")  # inside the body: its CRC fails
    (qfile,) = glob.glob(os.path.join(path, "consumequeue", "orders", "0", "0*"))
    os.remove(qfile)
    with MessageStore.open(path, cfg, clock=clock) as s:  # the open rebuilds the queue
        got, errors = _readable(s, sent)
        assert s.max_offset("orders", 0) == len(sent)
    assert set(got) == {qo for _, qo, _ in sent} - {q} and [o for o, _ in errors] == [q]


def test_verify_reports_progress_per_segment(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as store:
        p = store.producer("g")
        for _ in range(5):
            p.send_batch([Message("t", bytes(900)) for _ in range(20)])
        seen = []
        report = store.verify_commitlog(lambda done, total: seen.append((done, total)))
        assert report.ok and len(seen) == len(store.commit_log.files.files) > 1
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
        assert seen[-1][0] == seen[-1][1] == report.bytes_checked
