"""Message ids (RocketMQ's ``UNIQ_KEY``): 16 bytes written as 32 upper-case hex characters.

    off  size  field
    0    4     client IPv4 address
    4    2     process id (low 16 bits)
    6    4     per-generator random int (Java: the class loader's hash)
    10   4     ms since the start of the month, UTC (wraps like Java's int)
    14   2     counter

The born time inside an id is what :mod:`store.timer.recall` uses to find a timer message to
cancel.
"""

from __future__ import annotations

import calendar
import os
import random
import struct
import threading
import time

import numpy as np

from .record_codec import LOCALHOST
from ..base.jit import kernel_set


class MessageIdGenerator:
    """RocketMQ-shaped unique ids (``UNIQ_KEY``), 32 upper-case hex characters.

    16 bytes: client IPv4 (4), pid (2), a per-generator random int standing in for Java's
    class-loader hash (4), ms since the start of the month (UTC, 4, wrapping like Java's int),
    a counter (2).  The random part keeps two generators in one process apart; the counter
    keeps ids within one ms apart.  One ms holds at most 65,536 ids of a generator: when a
    burst (or a clock that stands still, as in tests) needs more, the time part moves ahead
    to the next ms instead of letting the counter repeat, so ids never collide.
    """

    _PREFIX = struct.Struct(">4sHi")
    _SUFFIX = struct.Struct(">IH")

    def __init__(self) -> None:
        self._prefix = self._PREFIX.pack(
            LOCALHOST, os.getpid() & 0xFFFF, random.getrandbits(31)
        ).hex().upper()
        self._prefix_bytes = np.frombuffer(self._prefix.encode("ascii"), dtype=np.uint8)
        self._counter = random.getrandbits(16)
        self._lock = threading.Lock()
        self._month_start_ms = 0
        self._month_end_ms = 0
        self._since = -1  # the time part in use, and how many ids it has given out
        self._used = 0
        #: ``(time part, prefix and time part as text)`` of the last single id
        self._head: tuple[int, str] = (-1, "")

    def _since_month(self, now_ms: int) -> int:
        if not self._month_start_ms <= now_ms < self._month_end_ms:
            t = time.gmtime(now_ms // 1000)
            start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)) * 1000
            ny, nm = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
            end = calendar.timegm((ny, nm, 1, 0, 0, 0)) * 1000
            self._month_start_ms, self._month_end_ms = start, end
            self._since = -1  # a new month starts a new time base
        return now_ms - self._month_start_ms

    def next_id(self, now_ms: int | None = None) -> str:
        """One fresh id (what ``next_ids(1, now_ms)[0]`` gives, without the arrays)."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        with self._lock:
            if not self._month_start_ms <= now_ms < self._month_end_ms:
                self._since_month(now_ms)
            since = now_ms - self._month_start_ms
            if since > self._since:
                self._since, self._used = since, 0
            base, used = self._since, self._used + 1
            first = self._counter
            self._counter = (first + 1) & 0xFFFF
            if used == 65536:  # this ms is used up: the time part moves ahead
                self._since, self._used = base + 1, 0
            else:
                self._used = used
            head = self._head
            if head[0] != base:  # the first id of this time part: its text once
                head = self._head = (base, f"{self._prefix}{base & 0xFFFFFFFF:08X}")
        return f"{head[1]}{first:04X}"

    def next_ids(self, n: int, now_ms: int | None = None) -> list[str]:
        """``n`` fresh ids, built with NumPy rather than one format call each."""
        if n == 1:
            return self._ids(1, now_ms, as_chars=False)
        return _strings(self._ids(n, now_ms, as_chars=True))

    def next_id_chars(self, n: int, now_ms: int | None = None) -> np.ndarray:
        """``n`` fresh ids as one ``(n, 32)`` uint8 array of ASCII characters."""
        return self._ids(n, now_ms, as_chars=True)

    def _ids(self, n: int, now_ms: int | None, *, as_chars: bool):
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        with self._lock:
            since = self._since_month(now_ms)
            if since > self._since:
                self._since, self._used = since, 0
            base, used = self._since, self._used  # a clock that went back keeps the time part
            first = self._counter
            self._counter = (first + n) & 0xFFFF
            total = used + n
            self._since, self._used = base + total // 65536, total % 65536
        if n == 1 and used < 65536 and not as_chars:
            return [self._prefix + self._SUFFIX.pack(base & 0xFFFFFFFF, first).hex().upper()]
        chars = np.empty((n, 32), dtype=np.uint8)
        _kernels(n)["_fill_ids"](self._prefix_bytes, base, used, first, chars, _HEX)
        return chars if as_chars else _strings(chars)


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def _fill_ids(prefix, base, used, first, out, hexd):
    """Row ``i`` of ``out``: the prefix, then the time part ``base + (used + i) // 65536``
    (it moves on every 65,536 ids) in 8 hex digits, then the counter ``first + i`` (16
    bits) in 4: one compiled pass instead of a NumPy pass per part."""
    for i in range(out.shape[0]):
        for j in range(20):
            out[i, j] = prefix[j]
        t = (base + (used + i) // 65536) & 0xFFFFFFFF
        for j in range(8):
            out[i, 27 - j] = hexd[(t >> (4 * j)) & 0xF]
        c = (first + i) & 0xFFFF
        for j in range(4):
            out[i, 31 - j] = hexd[(c >> (4 * j)) & 0xF]


_kernels = kernel_set(globals(), kernels=("_fill_ids",))


def _strings(chars: np.ndarray) -> list[str]:
    """The rows of an ``(n, 32)`` array of ASCII characters as ``str`` objects: widened to
    NumPy's fixed-width unicode, whose ``tolist`` builds the strings in C (a third of the
    time of slicing one long string)."""
    return chars.astype(np.uint32).view(f"U{chars.shape[1]}").ravel().tolist()


#: RocketMQ's offset message id (``MessageDecoder.createMessageId``): the store host and
#: the record's CommitLog offset, 16 bytes written as 32 upper-case hex characters::
#:
#:     off  size  field
#:     0    4     store IPv4 address
#:     4    4     store port
#:     8    8     CommitLog offset
OFFSET_MESSAGE_ID = struct.Struct(">4sIq")


def offset_message_id(commitlog_offset: int, host: bytes = LOCALHOST, port: int = 10911) -> str:
    """The offset message id of the record at ``commitlog_offset`` (RocketMQ's ``offsetMsgId``)."""
    return OFFSET_MESSAGE_ID.pack(host, port, commitlog_offset).hex().upper()


def decode_offset_message_id(msg_id: str) -> tuple[bytes, int, int] | None:
    """``(host, port, CommitLog offset)`` of an offset message id; ``None`` when ``msg_id``
    is not 32 hex characters or its offset is negative (then it can only be a unique key)."""
    if len(msg_id) != 2 * OFFSET_MESSAGE_ID.size:
        return None
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        return None
    host, port, offset = OFFSET_MESSAGE_ID.unpack(raw)
    return None if offset < 0 else (host, port, offset)
