"""Checks of records read through a ConsumeQueue: header against entry, and the body CRC.

Every read checks that the record an entry points at is the one the entry describes: magic,
total size, physical offset, queue id and queue offset in the header equal what the entry
and its position say (a flipped or zeroed queue entry would otherwise serve another
message).  The body CRC is only checked on request (``verify_crc``): RocketMQ's BODYCRC,
CRC32 of the body masked to 31 bits, recomputed by a compiled loop over the mapped segment
(:func:`~store.kernels.segment_walk.body_crcs`).  A record failing a check is a
:class:`~store.base.errors.CorruptRecordError` naming the segment file and the record's CommitLog
offset; :func:`intact_mask` instead says which entries pass, for reads that skip damage.
"""

from __future__ import annotations

import numpy as np

from ..formats.record_codec import (FIXED_SIZE, HEADER_SIZE, MESSAGE_MAGIC_CODE_V1,
                                    STAGED_QUEUE_OFFSET, TRANSACTION_PREPARED_TYPE,
                                    TRANSACTION_TYPE_MASK, Record, body_crc, gather_headers)
from ..files.commit_log import CommitLog
from ..base.errors import CorruptRecordError
from ..kernels.segment_walk import body_crcs


def header_matches(header: np.ndarray, sizes: np.ndarray, phys: np.ndarray, queue_id: int,
                   queue_offsets: np.ndarray) -> np.ndarray:
    """Which gathered record headers (:func:`~store.formats.record_codec.gather_headers`) describe the
    records their queue entries name: magic, total size, physical offset, queue id and
    offset, and a body length that fits."""
    body_len = header["body_length"].astype(np.int64)
    return ((header["magic"] == MESSAGE_MAGIC_CODE_V1) & (header["total_size"] == sizes)
            & (header["physical_offset"] == phys) & (header["queue_id"] == queue_id)
            & queue_offset_matches(header["queue_offset"], header["sys_flag"], queue_offsets)
            & (body_len >= 0) & (body_len <= sizes - FIXED_SIZE))


def queue_offset_matches(stored, sys_flags, queue_offsets):
    """Whether records whose headers say QUEUEOFFSET ``stored`` and SYSFLAG ``sys_flags``
    can sit at ``queue_offsets``: the same number, or any for a staged record (PREPARED,
    QUEUEOFFSET -1: its commit marker gave it its place, :mod:`store.core.index_commit`)."""
    return (stored == queue_offsets) | ((stored == STAGED_QUEUE_OFFSET) & (
        (sys_flags & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE))


def check_body_crcs(f, mm, pos: np.ndarray, body_end: np.ndarray, stored: np.ndarray,
                    phys: np.ndarray) -> None:
    """Raise unless the bodies ``[pos + HEADER_SIZE, body_end)`` of segment ``f`` (mapped as
    ``mm``) have the CRCs ``stored`` (their headers' BODYCRC)."""
    crcs = body_crcs(np.frombuffer(mm, dtype=np.uint8), pos + HEADER_SIZE, body_end)
    bad = crcs != stored.astype(np.int64)
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordError(
            f.path, int(phys[i]), f"body CRC {int(crcs[i])} does not match the record's BODYCRC "
            f"{int(stored[i])}: the body is damaged ({int(bad.sum())} such record(s) in this "
            "read)")


def record_entry_problem(rec: Record, queue_id: int, queue_offset: int, size: int,
                         position: int, *, verify_crc: bool = False) -> str | None:
    """Why the decoded ``rec`` (read at CommitLog offset ``position``) is not the record of
    entry ``queue_offset`` of queue ``queue_id`` (``size`` bytes) or, with ``verify_crc``,
    why its body fails its CRC; ``None`` when it passes (the caller raises, naming the
    segment file)."""
    if rec.physical_offset != position:
        return (f"record header says PHYSICALOFFSET {rec.physical_offset} but it lies at "
                f"{position}: its header is damaged (the body CRC does not cover it)")
    if (rec.queue_id, rec.total_size) != (queue_id, size) or not queue_offset_matches(
            rec.queue_offset, rec.sys_flag, queue_offset):
        return (f"record of queue {rec.queue_id} offset {rec.queue_offset} ({rec.total_size} "
                f"bytes) does not match its ConsumeQueue entry (queue {queue_id} offset "
                f"{queue_offset}, {size} bytes): the queue file is damaged; `rmq repair` "
                "rebuilds it")
    if verify_crc and body_crc(rec.body) != rec.body_crc:
        return (f"body CRC {body_crc(rec.body)} does not match the record's BODYCRC "
                f"{rec.body_crc}: the body is damaged")
    return None


def blank_holes(entries: np.ndarray) -> np.ndarray:
    """Indexes of unwritten entries (size 0) below a written one: a zeroed range of a queue
    file (a queue is written in order, so a blank is only ever at its end)."""
    written = entries["size"] > 0
    if written.all() or not written.any():
        return np.empty(0, dtype=np.int64)
    last = len(written) - 1 - int(np.argmax(written[::-1]))
    return np.flatnonzero(~written[:last])


def intact_mask(log: CommitLog, queue_id: int, entries: np.ndarray, queue_offsets: np.ndarray,
                *, verify_crc: bool) -> np.ndarray:
    """Which ``entries`` (of queue ``queue_id``, at ``queue_offsets``) point at a record that
    passes the checks: inside a stored segment, header matching the entry, lengths adding
    up and, with ``verify_crc``, the body CRC."""
    phys = entries["offset"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    ok = np.zeros(len(phys), dtype=bool)
    segments = phys // log.file_size
    for seg in np.unique(segments).tolist():
        idx = np.flatnonzero(segments == seg)
        f = log.files.find(int(seg) * log.file_size)
        if f is None:
            continue
        pos = phys[idx] - f.start
        inside = (sizes[idx] >= FIXED_SIZE) & (pos + sizes[idx] <= f.size)
        idx, pos = idx[inside], pos[inside]
        if not len(idx):
            continue
        mm = f.buffer()
        h = gather_headers(mm, f.size, pos)
        body_len = h["body_length"].astype(np.int64)
        good = header_matches(h, sizes[idx], phys[idx], queue_id, queue_offsets[idx])
        u8 = np.frombuffer(mm, dtype=np.uint8)
        end = pos + sizes[idx]
        body_end = pos + HEADER_SIZE + np.where(good, body_len, 0)
        topic_len = u8[np.minimum(body_end, f.size - 1)].astype(np.int64)
        props_at = body_end + 1 + topic_len
        good &= (topic_len > 0) & (props_at + 2 <= end)
        props_len = np.full(len(idx), -1, dtype=np.int64)
        props_len[good] = ((u8[props_at[good]].astype(np.int64) << 8) | u8[props_at[good] + 1])
        good &= props_at + 2 + props_len == end
        if verify_crc and good.any():
            sel = np.flatnonzero(good)
            crcs = body_crcs(u8, pos[sel] + HEADER_SIZE, body_end[sel])
            good[sel] = crcs == h["body_crc"][sel].astype(np.int64)
        ok[idx] = good
    return ok


__all__ = ["blank_holes", "check_body_crcs", "header_matches", "intact_mask",
           "record_entry_problem"]
