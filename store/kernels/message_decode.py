"""Compiled loops of the ``messages`` view's decode: record checks, then a gather of the
body and property columns, one pass each per block.

:func:`check_records` checks every record a block of ConsumeQueue entries names against its
entry (magic, total size, queue id and offset, physical offset, a body length that fits, the
queue's own topic, lengths that add up to the size) and reads the header fields the columns
show; the first record it does not pass goes back to the NumPy checks of
:mod:`store.core.arrow_decode`, which raise the error users know or read a foreign topic.
:func:`gather_messages` then copies every body and parses every properties string in one
compiled loop, writing straight into the buffers of the Arrow columns:

* ``body``: the bytes of each body;
* ``msg_id`` (``UNIQ_KEY``, ``""`` when absent), ``tags``, ``transaction_id`` (commit records
  only): the value of the last pair of that name, null when absent;
* ``keys``: the ``KEYS`` value split on spaces, empty pieces dropped (``[]`` when absent);
* ``deliver_timestamp``: ``__RMQ_DELIVER_MS`` parsed as decimal epoch ms, in µs;
* ``properties``: every user pair (a name that is not a system name), in record order.

Pairs follow RocketMQ's rule (:mod:`store.formats.arrow_properties`): the string splits on
0x02 (the last pair may lack it); a segment is a pair when its first 0x01 is neither its first
nor its last byte; the name is before that 0x01, the value everything after it.

The loop handles the regular case only and says so: a ``__RMQ_DELIVER_MS`` that is not a
string of at most 15 decimal digits makes it stop and return the row, and the caller decodes the
block with the NumPy path, which raises the error users know.  The caller also checks the
string columns for UTF-8 and, when one is not, does the same.  The NumPy path stays the
reference this loop is tested against, byte for byte.

Output buffers are sized by the caller from what it already knows: the bodies' total length
exactly, and every string column's bytes by the total length of the properties strings.
"""

from __future__ import annotations

import numpy as np

from ..formats.record_codec import (FIELD_OFFSET, FIXED_SIZE, HEADER_SIZE, MESSAGE_MAGIC_CODE_V1,
                                    STAGED_QUEUE_OFFSET, TRANSACTION_PREPARED_TYPE,
                                    TRANSACTION_TYPE_MASK)
from ..base.jit import FALLBACK_MAX_WORK, kernel_set
from .record_assembly import memcpy_function

#: Codes of the names with a column of their own (positions in the system-name table).
UNIQ, TAGS, KEYS, DELIVER, TRANSACTION = range(5)
#: Decimal digits of the largest ``__RMQ_DELIVER_MS`` taken (ms * 1000 stays in int64).
_MAX_MS_DIGITS = 15
#: Largest epoch-ms magnitude a header time may have here (ms * 1000 stays in int64).
_MAX_MS = 9 * 10**15
#: A staged record (QUEUEOFFSET -1, PREPARED) sits at the queue offset its commit marker
#: gave it (store.core.index_commit): any offset matches.
_STAGED, _TX_MASK, _TX_PREPARED = (STAGED_QUEUE_OFFSET, TRANSACTION_TYPE_MASK,
                                   TRANSACTION_PREPARED_TYPE)


def _copy(dst, w, src, a, b, mc):
    """``dst[w:w + b - a] = src[a:b]``: C's memcpy for a long run, a loop for a short one
    (a call costs more than a few bytes' loop)."""
    if b - a >= 24:
        mc(dst.ctypes.data + w, src.ctypes.data + a, b - a)
    else:
        for j in range(b - a):
            dst[w + j] = src[a + j]


def _copy_bodies(seg, body_start, body_end, body_data, body_offsets, mc):
    """Copy body ``i`` (``seg[body_start[i]:body_end[i]]``) after the ones before it into
    ``body_data``, its end into ``body_offsets[i + 1]``."""
    w = 0
    body_offsets[0] = 0
    po = body_data.ctypes.data
    ps = seg.ctypes.data
    for i in range(len(body_start)):
        a = body_start[i]
        b = body_end[i]
        if b > a:
            mc(po + w, ps + a, b - a)
        w += b - a
        body_offsets[i + 1] = w


def _system_name(seg, p, q, table_data, table_offsets, by_length):
    """The system name ``seg[p:q]`` is (its position in the table: by length, then bytes),
    or -1."""
    length = q - p
    if length < len(by_length) - 1:
        for k in range(by_length[length], by_length[length + 1]):
            t0 = table_offsets[k]
            j = 0
            while j < length and seg[p + j] == table_data[t0 + j]:
                j += 1
            if j == length:
                return k
    return -1


def _decimal_ms(seg, a, b):
    """``seg[a:b]`` as a decimal of at most :data:`_MAX_MS_DIGITS` digits, or -1 for
    anything else."""
    if b - a > _MAX_MS_DIGITS:
        return -1
    ms = 0
    for j in range(a, b):
        d = int(seg[j]) - 48
        if d < 0 or d > 9:
            return -1
        ms = ms * 10 + d
    return ms


def _split_keys(seg, a, b, keys_data, keys_offsets, wk, pieces, mc):
    """Append the pieces of ``seg[a:b]`` between spaces (empty ones dropped) to the keys
    column written up to byte ``wk`` and piece ``pieces``; return both, moved on."""
    j = a
    while j < b:
        while j < b and seg[j] == 32:
            j += 1
        if j == b:
            break
        k0 = j
        while j < b and seg[j] != 32:
            j += 1
        _copy(keys_data, wk, seg, k0, j, mc)
        wk += j - k0
        pieces += 1
        keys_offsets[pieces] = wk
    return wk, pieces


def _gather_messages(seg, body_start, body_end, props_start, props_end, is_commit,
                     table_data, table_offsets, table_codes, by_length, parse,
                     body_data, body_offsets,
                     uniq_data, uniq_offsets, tags_data, tags_offsets, tags_valid,
                     tx_data, tx_offsets, tx_valid, deliver_us, deliver_valid,
                     keys_data, keys_offsets, keys_lists,
                     map_key_data, map_key_offsets, map_value_data, map_value_offsets,
                     map_offsets, counts, mc):
    """Fill every output for rows ``0..n-1``; return -1, or the row whose properties the
    loop does not handle (the caller then decodes with the reference path).

    ``table_*``: the system names sorted by length (``by_length[L]..by_length[L+1]`` are the
    names of length ``L``), ``table_codes`` their codes (0-4 the special names, above: other
    system names, dropped).  ``counts`` receives (keys pieces, user pairs).
    """
    n = len(body_start)
    _copy_bodies(seg, body_start, body_end, body_data, body_offsets, mc)
    if not parse:
        return -1
    wu = 0
    wt = 0
    wx = 0
    wk = 0
    pieces = 0
    wmk = 0
    wmv = 0
    pairs = 0
    uniq_offsets[0] = 0
    tags_offsets[0] = 0
    tx_offsets[0] = 0
    keys_offsets[0] = 0
    keys_lists[0] = 0
    map_key_offsets[0] = 0
    map_value_offsets[0] = 0
    map_offsets[0] = 0
    for i in range(n):
        end = props_end[i]
        p = props_start[i]
        # the last value of each special name: start and end (-1: none)
        us = -1
        ue = -1
        ts = -1
        te = -1
        ks = -1
        ke = -1
        ds = -1
        de = -1
        xs = -1
        xe = -1
        while p < end:
            # the segment [p, s2) up to the next 0x02 (or the end), q its first 0x01
            q = -1
            s2 = p
            while s2 < end:
                c = seg[s2]
                if c == 2:
                    break
                if c == 1 and q < 0:
                    q = s2
                s2 += 1
            if q > p and q < s2 - 1:  # a pair: name [p, q), value [q + 1, s2)
                code = _system_name(seg, p, q, table_data, table_offsets, by_length)
                if code < 0:
                    _copy(map_key_data, wmk, seg, p, q, mc)
                    wmk += q - p
                    _copy(map_value_data, wmv, seg, q + 1, s2, mc)
                    wmv += s2 - q - 1
                    pairs += 1
                    map_key_offsets[pairs] = wmk
                    map_value_offsets[pairs] = wmv
                else:
                    c = table_codes[code]
                    if c == UNIQ:
                        us = q + 1
                        ue = s2
                    elif c == TAGS:
                        ts = q + 1
                        te = s2
                    elif c == KEYS:
                        ks = q + 1
                        ke = s2
                    elif c == DELIVER:
                        ds = q + 1
                        de = s2
                    elif c == TRANSACTION:
                        xs = q + 1
                        xe = s2
            p = s2 + 1
        map_offsets[i + 1] = pairs
        if us >= 0:
            _copy(uniq_data, wu, seg, us, ue, mc)
            wu += ue - us
        uniq_offsets[i + 1] = wu
        tags_valid[i] = ts >= 0
        if ts >= 0:
            _copy(tags_data, wt, seg, ts, te, mc)
            wt += te - ts
        tags_offsets[i + 1] = wt
        tx_valid[i] = xs >= 0 and is_commit[i]
        if xs >= 0 and is_commit[i]:
            _copy(tx_data, wx, seg, xs, xe, mc)
            wx += xe - xs
        tx_offsets[i + 1] = wx
        deliver_valid[i] = ds >= 0
        deliver_us[i] = 0
        if ds >= 0:
            ms = _decimal_ms(seg, ds, de)
            if ms < 0:  # (a sign, spaces, too many digits: the reference path decides)
                return i
            deliver_us[i] = ms * 1000
        if ks >= 0:
            wk, pieces = _split_keys(seg, ks, ke, keys_data, keys_offsets, wk, pieces, mc)
        keys_lists[i + 1] = pieces
    counts[0] = pieces
    counts[1] = pairs
    return -1


def _be(seg, p, width):
    """The big-endian signed integer of ``width`` (2 or 4) bytes at ``seg[p:]``."""
    v = 0
    for j in range(width):
        v = (v << 8) | int(seg[p + j])
    if v >= 1 << (8 * width - 1):
        v -= 1 << (8 * width)
    return v


def _be64(seg, p):
    """The big-endian signed 8-byte integer at ``seg[p:]`` (no step overflows int64)."""
    low = 0
    for j in range(4, 8):
        low = (low << 8) | int(seg[p + j])
    return _be(seg, p, 4) * 4294967296 + low


def _check_records(seg, pos, sizes, phys, queue_id, queue_offsets, topic, at, magic,
                   fixed_size, header_size, queue_ids, sys_flags, born_us, store_us,
                   reconsume, body_end, props_start, body_crcs):
    """Check every record against its entry and read its header fields; return -1, or the
    first row that fails a check or holds another topic than ``topic`` (the caller then runs
    the reference checks, which raise or handle it).

    ``at``: the byte offsets in a header of TOTALSIZE, MAGICCODE, QUEUEID, SYSFLAG,
    BORNTIMESTAMP, STORETIMESTAMP, RECONSUMETIMES, QUEUEOFFSET, PHYSICALOFFSET, BODYLENGTH,
    BODYCRC (read into ``body_crcs``).
    """
    tl = len(topic)
    for i in range(len(pos)):
        p = pos[i]
        size = sizes[i]
        body_len = _be(seg, p + at[9], 4)
        stored_offset = _be64(seg, p + at[7])
        if (_be(seg, p + at[0], 4) != size or _be(seg, p + at[1], 4) != magic
                or _be(seg, p + at[2], 4) != queue_id
                or (stored_offset != queue_offsets[i] and not (
                    stored_offset == _STAGED and (_be(seg, p + at[3], 4) & _TX_MASK)
                    == _TX_PREPARED))
                or _be64(seg, p + at[8]) != phys[i]
                or body_len < 0 or body_len > size - fixed_size):
            return i
        b = p + header_size + body_len
        if b + 3 + tl > p + size or int(seg[b]) != tl:
            return i
        for j in range(tl):
            if seg[b + 1 + j] != topic[j]:
                return i
        props_len = _be(seg, b + 1 + tl, 2)
        if b + 3 + tl + props_len != p + size:
            return i
        born = _be64(seg, p + at[4])
        stored = _be64(seg, p + at[5])
        if abs(born) > _MAX_MS or abs(stored) > _MAX_MS:  # (µs would overflow: the reference)
            return i
        queue_ids[i] = queue_id
        sys_flags[i] = _be(seg, p + at[3], 4)
        born_us[i] = born * 1000
        store_us[i] = stored * 1000
        reconsume[i] = _be(seg, p + at[6], 4)
        body_end[i] = b
        props_start[i] = b + 3 + tl
        body_crcs[i] = _be(seg, p + at[10], 4)
    return -1



def _select_entries(raw, codes, filler, picked):
    """Of ``n`` ConsumeQueue entries laid out as stored (``raw``: 20 big-endian bytes each,
    offset, size, tagsCode), write to ``picked`` the index of each whose tagsCode is one of
    ``codes``, fillers (size ``filler``) left out; return their count, or -1 at the first
    entry not written (size <= 0: the caller's checks then say why)."""
    count = 0
    for i in range(len(raw) // 20):
        b = i * 20
        size = _be(raw, b + 8, 4)
        if size <= 0:
            return -1
        if size == filler:
            continue
        code = _be64(raw, b + 12)
        for c in codes:
            if code == c:
                picked[count] = i
                count += 1
                break
    return count


_KERNELS = kernel_set(globals(), helpers=("_copy", "_copy_bodies", "_system_name",
                                          "_decimal_ms", "_split_keys", "_be", "_be64"),
                      kernels=("_gather_messages", "_check_records",
                               "_select_entries"))


class NameTable:
    """System names (bytes) by length, for :func:`gather_messages`; ``codes``: each one's
    code (its position in the list given, so 0-4 are the special names)."""

    def __init__(self, names: list[bytes]) -> None:
        order = sorted(range(len(names)), key=lambda k: len(names[k]))
        longest = max(len(n) for n in names)
        self.data = np.frombuffer(b"".join(names[k] for k in order), np.uint8).copy()
        self.offsets = np.zeros(len(names) + 1, np.int64)
        np.cumsum([len(names[k]) for k in order], out=self.offsets[1:])
        self.codes = np.array(order, np.int64)
        lengths = np.array([len(names[k]) for k in order])
        self.by_length = np.searchsorted(lengths, np.arange(longest + 2)).astype(np.int64)


def gather_messages(seg: np.ndarray, body_start: np.ndarray, body_end: np.ndarray,
                    props_start: np.ndarray, props_end: np.ndarray, is_commit: np.ndarray,
                    names: NameTable, parse: bool = True) -> tuple[int, dict]:
    """Bodies and property columns of ``n`` records as buffers (see the module).

    Returns ``(row, out)``: ``row`` is -1 when every record was handled, else the first row
    the loop does not handle (``out`` is then incomplete).  ``out`` holds NumPy arrays:
    ``body_data``/``body_offsets`` and, with ``parse``, ``uniq_*``, ``tags_*``, ``tx_*``,
    ``deliver_us``/``deliver_valid``, ``keys_data``/``keys_offsets``/``keys_lists`` and the map's
    ``map_key_*``, ``map_value_*``, ``map_offsets``, each data buffer cut to its length.
    """
    n = len(body_start)
    body_total = int((body_end - body_start).sum())
    props_total = int((props_end - props_start).sum()) if parse else 0
    cap = props_total if parse else 0
    pair_cap = (props_total // 3 + 1) if parse else 1
    piece_cap = (props_total // 2 + 1) if parse else 1
    rows = n + 1 if parse else 1
    out = {
        "body_data": np.empty(body_total, np.uint8),
        "body_offsets": np.empty(n + 1, np.int32),
        "uniq_data": np.empty(cap, np.uint8), "uniq_offsets": np.empty(rows, np.int32),
        "tags_data": np.empty(cap, np.uint8), "tags_offsets": np.empty(rows, np.int32),
        "tags_valid": np.empty(max(n, 1), np.bool_),
        "tx_data": np.empty(cap, np.uint8), "tx_offsets": np.empty(rows, np.int32),
        "tx_valid": np.empty(max(n, 1), np.bool_),
        "deliver_us": np.empty(max(n, 1), np.int64), "deliver_valid": np.empty(max(n, 1), np.bool_),
        "keys_data": np.empty(cap, np.uint8), "keys_offsets": np.empty(piece_cap, np.int32),
        "keys_lists": np.empty(rows, np.int32),
        "map_key_data": np.empty(cap, np.uint8), "map_key_offsets": np.empty(pair_cap, np.int32),
        "map_value_data": np.empty(cap, np.uint8),
        "map_value_offsets": np.empty(pair_cap, np.int32),
        "map_offsets": np.empty(rows, np.int32),
    }
    counts = np.zeros(2, np.int64)
    args = (seg, body_start, body_end, props_start, props_end, is_commit,
            names.data, names.offsets, names.codes, names.by_length, parse,
            out["body_data"], out["body_offsets"],
            out["uniq_data"], out["uniq_offsets"], out["tags_data"], out["tags_offsets"],
            out["tags_valid"], out["tx_data"], out["tx_offsets"], out["tx_valid"],
            out["deliver_us"], out["deliver_valid"],
            out["keys_data"], out["keys_offsets"], out["keys_lists"],
            out["map_key_data"], out["map_key_offsets"], out["map_value_data"],
            out["map_value_offsets"], out["map_offsets"], counts, memcpy_function())
    if not _ready("_gather_messages", n, args):
        return 0, out
    row = _KERNELS(n)["_gather_messages"](*args)
    if row >= 0 or not parse:
        return int(row), out
    pieces, pairs = int(counts[0]), int(counts[1])
    out["keys_offsets"] = out["keys_offsets"][:pieces + 1]
    out["map_key_offsets"] = out["map_key_offsets"][:pairs + 1]
    out["map_value_offsets"] = out["map_value_offsets"][:pairs + 1]
    for name in ("uniq", "tags", "tx"):
        out[f"{name}_data"] = out[f"{name}_data"][:int(out[f"{name}_offsets"][n])]
    out["keys_data"] = out["keys_data"][:int(out["keys_offsets"][pieces])]
    out["map_key_data"] = out["map_key_data"][:int(out["map_key_offsets"][pairs])]
    out["map_value_data"] = out["map_value_data"][:int(out["map_value_offsets"][pairs])]
    for name in ("tags_valid", "tx_valid", "deliver_us", "deliver_valid"):
        out[name] = out[name][:n]
    return -1, out


def check_records(seg: np.ndarray, pos: np.ndarray, sizes: np.ndarray, phys: np.ndarray,
                  queue_id: int, queue_offsets: np.ndarray, topic: bytes, fields: dict,
                  body_end: np.ndarray, props_start: np.ndarray, body_crcs: np.ndarray) -> int:
    """:func:`_check_records` over a block: fills ``fields`` (``queue_id``, ``sys_flag``,
    ``born_timestamp``/``store_timestamp`` in µs, ``reconsume_times``), ``body_end``,
    ``props_start`` and the stored ``body_crcs``; returns -1, or the first row left to the
    reference checks."""
    at = np.array([FIELD_OFFSET[name] for name in (
        "total_size", "magic", "queue_id", "sys_flag", "born_timestamp", "store_timestamp",
        "reconsume_times", "queue_offset", "physical_offset", "body_length", "body_crc")],
        np.int64)
    args = (seg, pos, sizes, phys, queue_id, queue_offsets, np.frombuffer(topic, np.uint8), at,
            MESSAGE_MAGIC_CODE_V1, FIXED_SIZE, HEADER_SIZE, fields["queue_id"],
            fields["sys_flag"], fields["born_timestamp"], fields["store_timestamp"],
            fields["reconsume_times"], body_end, props_start, body_crcs)
    if not _ready("_check_records", len(pos), args):
        return 0
    return int(_KERNELS(len(pos))["_check_records"](*args))


def select_entries(raw: np.ndarray, codes: np.ndarray, filler: int) -> np.ndarray | None:
    """:func:`_select_entries`: the indexes of the entries of ``raw`` (stored ConsumeQueue
    entries, big-endian) with one of the tagsCodes ``codes``, fillers left out; ``None``
    when an entry is not written (the caller's NumPy checks then raise) or while the compiled
    loop is not loaded for a large block (the caller's NumPy path is then as fast)."""
    raw = raw.reshape(-1).view(np.uint8)
    raw.setflags(write=False)  # a file's view or a copy: one compiled signature for both
    picked = np.empty(len(raw) // 20, np.int64)
    args = (raw, codes, filler, picked)
    if not _ready("_select_entries", len(picked), args):
        return None
    count = int(_KERNELS(len(picked))["_select_entries"](*args))
    return None if count < 0 else picked[:count]


def _ready(name: str, work: int, args: tuple) -> bool:
    """Whether to run kernel ``name`` now: a small block always (as Python until the compiled
    loop is in), a large one only once the compiled loop is loaded.  Until then a large
    block is left to the NumPy path, which is as fast as reads were before these loops, so
    a read never waits for numba's load (0.3 s) or, on a fresh install, its compile (2 s)."""
    return work <= FALLBACK_MAX_WORK or _KERNELS.loaded_or_ask(name, args)
