"""Verifying the whole CommitLog: every record's structure and body CRC (``rmq stats --verify``).

:func:`verify_commitlog` walks every segment from the oldest to the confirmed end with the
compiled record walk (:func:`~store.kernels.segment_walk.walk_records`, CRCs on).  Where the walk
stops before the end, the record there is looked at once more without its CRC:

* its structure holds (magic, lengths adding up): a **bad CRC**, reported with its file and
  offset; the walk goes on after it;
* it does not: **damage** from there to the end of the segment (reported as a range); the
  walk goes on with the next segment that begins with a valid record.

Nothing is changed: the store may be open read-only, by other processes too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..formats.record_codec import RecordCheck, check_record
from ..kernels.segment_walk import STOP_BLANK, STOP_INVALID, walk_records


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify_commitlog` found."""

    records: int = 0                 # records whose structure and CRC hold
    bytes_checked: int = 0           # CommitLog bytes walked
    seconds: float = 0.0
    #: ``(segment file, CommitLog offset, reason)`` of each record whose body CRC fails
    bad_crc: list[tuple[str, int, str]] = field(default_factory=list)
    #: ``(segment file, first offset, end offset)`` of each damaged range skipped
    damaged: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad_crc and not self.damaged

    def as_dict(self) -> dict:
        return {"records": self.records, "bytes_checked": self.bytes_checked,
                "seconds": round(self.seconds, 3), "ok": self.ok,
                "bad_crc": [{"file": f, "offset": o, "reason": r} for f, o, r in self.bad_crc],
                "damaged": [{"file": f, "from": a, "to": b} for f, a, b in self.damaged]}


def verify_commitlog(store, progress=None) -> VerifyReport:
    """Check every record of the CommitLog of ``store`` (an open store, read-only or not) up
    to its confirmed end (see the module docstring); ``progress(bytes_checked, bytes_total)``
    is called after each segment when given."""
    t0 = time.perf_counter()
    log = store.commit_log
    files = log.files.refresh()
    report = VerifyReport()
    end = store.confirmed_offset()
    total = max(0, end - (files[0].start if files else end))
    for f in files:
        if f.start >= end:
            break
        raw = np.frombuffer(f.buffer(), dtype=np.uint8)
        limit = min(f.size, end - f.start)
        pos = 0
        while pos < limit:
            positions, _, stop_at, stop = walk_records(raw, pos, f.size, check_crc=True,
                                                       max_records=1 << 20)
            report.records += int(np.count_nonzero(positions < limit))
            if stop == STOP_BLANK or stop_at >= limit:
                break
            if stop != STOP_INVALID:
                pos = stop_at
                continue
            size = check_record(f.buffer(), stop_at, f.size, check_crc=False)
            if size > 0:
                report.bad_crc.append((f.path, f.start + stop_at, "body CRC does not match"))
                pos = stop_at + size
                continue
            if size != RecordCheck.BLANK:
                report.damaged.append((f.path, f.start + stop_at, f.start + limit))
            break
        report.bytes_checked += limit
        if progress is not None:
            progress(report.bytes_checked, total)
    report.seconds = time.perf_counter() - t0
    return report


__all__ = ["VerifyReport", "verify_commitlog"]
