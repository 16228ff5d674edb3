"""IndexFile: RocketMQ's message-key index (hash slots over ``topic#key``, chained entries).

Files: ``index/{yyyyMMddHHmmssSSS}``, named by the local time the file was created (a later
file has a larger name); a lookup reads the newest first.  Each file holds ``S`` hash slots
and ``N`` entries (``max_hash_slot_num``, ``max_index_num``: broker settings, not recorded in
the file), ``40 + 4 S + 20 N`` bytes, preallocated sparse (RocketMQ's defaults, 5,000,000 and
20,000,000, make 420,000,040 bytes that cost no disk until entries are written).

Layout (big-endian, as RocketMQ's Java writes it)::

    header, at 0 (40 bytes)
    off  size  type  field
    0    8     i64   beginTimestamp  store time of the file's first entry (ms)
    8    8     i64   endTimestamp    store time of its last entry
    16   8     i64   beginPhyOffset  CommitLog offset of the first entry's record
    24   8     i64   endPhyOffset    CommitLog offset of the last entry's record (its START)
    32   4     i32   hashSlotCount   slots in use
    36   4     i32   indexCount      entries + 1 (entry 0 is never used; 0 in a new file)

    slot i, at 40 + 4 i
    0    4     i32   entry           the slot's newest entry number (0: empty)

    entry n, at 40 + 4 S + 20 n
    0    4     i32   keyHash         abs(Java String.hashCode of "topic#key"); MIN_VALUE: 0
    4    8     i64   phyOffset       CommitLog offset of the record carrying the key
    12   4     i32   timeDiff        whole seconds from beginTimestamp (0..2^31-1)
    16   4     i32   prevIndex       the slot's previous entry (0: end of the chain)

A key's slot is ``keyHash mod S``.  A lookup follows the chain from the slot and keeps the
offsets whose keyHash matches (the key text is not stored: a 32-bit collision returns
another key's record, as in RocketMQ; callers check the record).  A chain ends at a
``prevIndex`` of 0, one past ``indexCount`` or one equal to the entry itself.

Writes go entries first, then slots, then the header: a crash between them leaves entries
or slot heads past ``indexCount``, which a lookup ignores.  Recovery after a crash
(:meth:`IndexFile.rechain`) rebuilds the slots and chains from the entries themselves,
dropping those whose record lies at or past the recovered CommitLog end (a torn tail); a
file whose header cannot be right (:meth:`IndexFile.problem`) is set aside by its owner
and the index rebuilt from the CommitLog.
"""

from __future__ import annotations

import mmap
import os
import time

import numpy as np

from ..formats.binary_layout import layout
from ..kernels.key_walk import chain_entries, check_chains
from .fileio import allocate

HEADER_FIELDS = (
    ("begin_timestamp", ">i8"),  # beginTimestamp
    ("end_timestamp", ">i8"),  # endTimestamp
    ("begin_phy_offset", ">i8"),  # beginPhyOffset
    ("end_phy_offset", ">i8"),  # endPhyOffset (start of the last indexed record)
    ("hash_slot_count", ">i4"),  # hashSlotCount
    ("index_count", ">i4"),  # indexCount (entries + 1)
)
SLOT_FIELDS = (
    ("entry", ">i4"),  # newest entry number of the slot (0: empty)
)
ENTRY_FIELDS = (
    ("key_hash", ">i4"),  # keyHash
    ("phy_offset", ">i8"),  # phyOffset
    ("time_diff", ">i4"),  # timeDiff (s)
    ("prev_index", ">i4"),  # prevIndex
)
_HEADER, _SLOT, _ENTRY = layout(HEADER_FIELDS), layout(SLOT_FIELDS), layout(ENTRY_FIELDS)
HEADER, HEADER_SIZE, HEADER_DTYPE = _HEADER.exports()  # 40 bytes
_SLOT_HEAD, SLOT_SIZE, SLOT_DTYPE = _SLOT.exports()  # 4 bytes
ENTRY, ENTRY_SIZE, ENTRY_DTYPE = _ENTRY.exports()  # 20 bytes
_COUNT_AT = _HEADER.offsets["index_count"]
_MAX_TIME_DIFF = (1 << 31) - 1

#: Entries' blocks are reserved this many bytes at a time, ahead of the entries written.
_RESERVE_STEP = 1 << 20

#: Puts of at most this many entries take the ``struct`` path (:meth:`IndexFile._put_few`).
_SCALAR_MAX = 8
#: Linux's ``MADV_POPULATE_WRITE`` (5.14+; Python's ``mmap`` names it from 3.12 only).
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
#: and ``MADV_POPULATE_READ``.
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)

#: :attr:`IndexFile.chain_problem` until its owner has run :meth:`IndexFile.check_chains`.
UNCHECKED = "not checked yet"

#: How a file name is made from its creation time (RocketMQ's ``yyyyMMddHHmmssSSS``).
NAME_LENGTH = 17


def file_size(slot_count: int, entry_count: int) -> int:
    """Bytes of an index file with ``slot_count`` slots and ``entry_count`` entries."""
    return HEADER_SIZE + SLOT_SIZE * slot_count + ENTRY_SIZE * entry_count


def file_name(created_ms: int) -> str:
    """The name of a file created at ``created_ms`` (local time, ``yyyyMMddHHmmssSSS``)."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(created_ms // 1000)) + \
        f"{created_ms % 1000:03d}"


def is_index_name(name: str) -> bool:
    """Whether ``name`` is an index file's name (17 digits; set-aside copies are not)."""
    return len(name) == NAME_LENGTH and name.isdigit()


def java_hash_text(text: str) -> int:
    """The keyHash of a key text (``topic#key``): Java's ``String.hashCode`` made
    non-negative as RocketMQ does (``abs``; ``Integer.MIN_VALUE`` becomes 0)."""
    return key_hash_of_unsigned(java_hash_continue(0, text))


def java_hash_continue(h: int, text: str) -> int:
    """Java's ``String.hashCode`` state ``h`` (unsigned 32 bits) continued over ``text``."""
    if text.isascii():  # one UTF-16 unit per byte: the common case, twice as fast
        for c in text.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
        return h
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h


def key_hash_of_unsigned(h: int) -> int:
    """keyHash of a 32-bit hash given unsigned: ``abs`` of its signed value, MIN_VALUE → 0."""
    if h & 0x80000000:
        h = (1 << 32) - h
        return 0 if h == 0x80000000 else h
    return h


class IndexFile:
    """One index file, memory-mapped (see the module docstring).

    Parameters
    ----------
    path : str
        The file.
    slot_count, entry_count : int
        ``S`` and ``N`` (the file's size must be :func:`file_size` of them).
    create : bool
        Make the file (sparse) when missing.
    read_only : bool
        Map it read-only (a :class:`~store.StoreReader`, a RocketMQ store read as it is).
    """

    def __init__(self, path: str, slot_count: int, entry_count: int, *, create: bool = False,
                 read_only: bool = False) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self.slot_count = int(slot_count)
        self.entry_count = int(entry_count)
        self.read_only = read_only
        size = file_size(self.slot_count, self.entry_count)
        flags = os.O_RDONLY if read_only else os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(fd).st_size
            if actual == 0 and create and not read_only:
                os.ftruncate(fd, size)  # sparse: no disk until entries are written
                actual = size
            #: the size found on disk (:meth:`problem` compares it with the settings)
            self.actual_size = actual
            length = min(actual, size)
            self._mm = (mmap.mmap(fd, length, access=mmap.ACCESS_READ if read_only
                                  else mmap.ACCESS_WRITE) if length >= HEADER_SIZE else None)
            self._fd = None if read_only else os.dup(fd)
        finally:
            os.close(fd)
        self.size = size
        #: what :meth:`check_chains` found when the owner ran it (``None``: sound; the
        #: owner's marker until it has run, see :class:`~store.core.key_index.KeyIndex`)
        self.chain_problem: str | None = UNCHECKED
        #: how the owner's first use took the file: ``"checked"`` (:meth:`check_chains`),
        #: ``"sealed"`` (a writer's seal matched, :mod:`store.files.index_seal`), ``None``
        self.first_use: str | None = None
        #: where the blocks reserved for writing end (writes through a mapping into a hole
        #: of a full filesystem would be a SIGBUS: blocks are reserved first, as the
        #: CommitLog's are); the header and slots at once, entries ahead of each put
        self._reserved = 0
        self._populated = read_only
        if not read_only and actual == size:
            self._reserve(HEADER_SIZE + SLOT_SIZE * self.slot_count)

    def _reserve(self, end: int) -> None:
        """Reserve the file's blocks up to ``end`` (rounded up a step);
        :class:`~store.base.errors.DiskFullError` when the disk has no room."""
        if end <= self._reserved or self._fd is None:
            return
        target = min(self.size, -(-end // _RESERVE_STEP) * _RESERVE_STEP)
        allocate(self._fd, target - self._reserved, self.path, offset=self._reserved)
        self._reserved = target

    # -- structure ------------------------------------------------------------------------------
    def problem(self) -> str | None:
        """Why the file cannot be this index's (``None``: it can): a wrong size for the
        configured slots and entries, or a header no writer could have left."""
        if self.actual_size != self.size:
            return (f"{self.actual_size} bytes; allowed: {self.size} (40 + 4 x "
                    f"{self.slot_count} slots + 20 x {self.entry_count} entries)")
        (begin_ts, end_ts, begin_phy, end_phy, slots_used,
         count) = HEADER.unpack_from(self._mm, 0)
        if not 0 <= count <= self.entry_count:
            return f"indexCount {count}; allowed: 0 to {self.entry_count}"
        if not 0 <= slots_used <= self.slot_count:
            return f"hashSlotCount {slots_used}; allowed: 0 to {self.slot_count}"
        if count > 1 and not (0 <= begin_phy <= end_phy and begin_ts <= end_ts):
            return (f"beginPhyOffset {begin_phy} / endPhyOffset {end_phy}, beginTimestamp "
                    f"{begin_ts} / endTimestamp {end_ts}: a begin after its end")
        return None

    def verify(self, log_end: int) -> str | None:
        """Why the file's slots or entries cannot be trusted (``None``: they can), past what
        :meth:`problem` checks: every slot head within the entries written, every entry's
        keyHash non-negative, its ``prevIndex`` an earlier entry, its record offsets in
        CommitLog order, inside the header's range and before ``log_end``, and its chains
        (:meth:`check_chains`).  ``rmq repair``'s check (it reads the whole file)."""
        problem = self.problem()
        if problem is not None:
            return problem
        count = self.index_count
        slots = self._slots()
        bad = np.flatnonzero((slots < 0) | (slots >= count))
        if len(bad):
            return (f"slot {int(bad[0])} points at entry {int(slots[bad[0]])}; allowed: 0 to "
                    f"{count - 1} (indexCount {count})")
        entries = self.entries()
        if not len(entries):
            return None
        numbers = np.arange(1, count, dtype=np.int64)
        begin_phy, end_phy = self.header()[2:4]
        phys = entries["phy_offset"].astype(np.int64)
        checks = (
            ("keyHash", "key_hash", entries["key_hash"] < 0, "a non-negative int"),
            ("prevIndex", "prev_index",
             (entries["prev_index"] < 0) | (entries["prev_index"] >= numbers),
             "0 or an earlier entry's number"),
            ("phyOffset", "phy_offset", (phys < begin_phy) | (phys > end_phy) | (phys >= log_end),
             f"{begin_phy} to {end_phy} (the header's range), below the log end {log_end}"),
            ("timeDiff", "time_diff", entries["time_diff"] < 0, "a non-negative int"),
        )
        for label, field, wrong, allowed in checks:
            at = np.flatnonzero(wrong)
            if len(at):
                return (f"entry {int(at[0]) + 1} has {label} {int(entries[field][at[0]])}; "
                        f"allowed: {allowed}")
        if len(phys) > 1 and (np.diff(phys) < 0).any():
            at = int(np.flatnonzero(np.diff(phys) < 0)[0]) + 2
            return f"entry {at} has a phyOffset before the previous entry's; allowed: ascending"
        return self.check_chains()

    def check_chains(self) -> str | None:
        """Why the slots and chains cannot answer every published entry (``None``: they can):
        every slot head is the newest entry hashing to that slot, every entry's
        ``prevIndex`` the newest older entry of its slot (0 for the slot's oldest), every
        keyHash non-negative, and ``hashSlotCount`` the number of slots in use.  One compiled
        pass over the entries in order (:func:`~store.kernels.key_walk.check_chains`), then
        NumPy over the slots: no loop per entry in Python.

        A put publishes its entries and slot heads before the header (a put in progress, or
        one a killed writer left torn, shows heads past ``indexCount``): the entries up to
        the largest head are checked with the published ones, and ``hashSlotCount`` only
        when no head is past them.  The check a process runs the first time it uses the file
        (see :class:`~store.core.key_index.KeyIndex`); its cost on a full file is in
        docs/benchmarks.md."""
        problem = self.problem()
        if problem is not None:
            return problem
        count = self.index_count
        heads = self._slots().astype(np.int32)  # a copy: a writer may move them meanwhile
        top = int(heads.max(initial=0))
        wrong = np.flatnonzero((heads < 0) | (heads >= self.entry_count))
        if len(wrong):
            at = int(wrong[0])
            return (f"slot {at} points at entry {int(heads[at])}; allowed: 0 to "
                    f"{self.entry_count - 1}")
        last = max(count - 1, top)  # entries 1 .. last are checked
        if not self._populated and last > 0:
            self._read_ahead(HEADER_SIZE + SLOT_SIZE * self.slot_count, ENTRY_SIZE * (last + 1))
        newest, code, entry, value = check_chains(
            np.frombuffer(self._mm, dtype=np.uint8), HEADER_SIZE + SLOT_SIZE * self.slot_count,
            self.slot_count, last)
        if code == 1:
            return f"entry {entry} has keyHash {value}; allowed: a non-negative int"
        if code == 2:
            return (f"entry {entry} has prevIndex {value}; allowed: the newest earlier entry "
                    "of its slot (0 when it is the slot's first)")
        wrong = np.flatnonzero(heads != newest)
        if len(wrong):
            at = int(wrong[0])
            return (f"slot {at} points at entry {int(heads[at])}; allowed: {int(newest[at])}, "
                    f"the newest entry of that slot ({len(wrong)} slots are wrong)")
        slots_used = self.header()[4]
        if top < count and slots_used != (used := int(np.count_nonzero(heads))):
            return f"hashSlotCount {slots_used}; allowed: {used} (the slots in use)"
        return None

    def _read_ahead(self, offset: int, length: int) -> None:
        """Fault ``length`` bytes from ``offset`` in at once (a whole-file read: one
        ``madvise`` rather than a page fault per page)."""
        page = mmap.PAGESIZE
        begin = offset - offset % page
        try:
            self._mm.madvise(_MADV_POPULATE_READ, begin, min(offset + length, len(self._mm)) - begin)
        except (OSError, ValueError, AttributeError):  # an older kernel: fault as they come
            pass

    def header(self) -> tuple[int, int, int, int, int, int]:
        """``(begin_timestamp, end_timestamp, begin_phy_offset, end_phy_offset,
        hash_slot_count, index_count)``, read from the mapping (another process may write)."""
        return HEADER.unpack_from(self._mm, 0)

    @property
    def index_count(self) -> int:
        """``indexCount`` made at least 1 (a new file's 0 means no entry, as 1 does)."""
        return max(1, _SLOT_HEAD.unpack_from(self._mm, _COUNT_AT)[0])

    @property
    def end_phy_offset(self) -> int:
        """Start of the last indexed record; -1 when the file has no entry."""
        header = self.header()
        return header[3] if header[5] > 1 else -1

    def is_full(self) -> bool:
        """Whether no entry fits any more (``indexCount`` reached ``N``)."""
        return self.index_count >= self.entry_count

    def _slots(self) -> np.ndarray:
        """The slot heads (writable unless the file is mapped read-only)."""
        return np.frombuffer(self._mm, dtype=SLOT_DTYPE["entry"], count=self.slot_count,
                             offset=HEADER_SIZE)

    def _entries(self) -> np.ndarray:
        return np.frombuffer(self._mm, dtype=ENTRY_DTYPE, count=self.entry_count,
                             offset=HEADER_SIZE + SLOT_SIZE * self.slot_count)

    def entries(self) -> np.ndarray:
        """The written entries ``1 .. indexCount - 1`` (a view of the mapping)."""
        return self._entries()[1:self.index_count]

    # -- writing --------------------------------------------------------------------------------
    def put(self, key_hashes: np.ndarray, phy_offsets: np.ndarray,
            store_timestamps: np.ndarray) -> int:
        """Add entries (keyHash, record offset, record store time), in CommitLog order, as
        many as fit; returns how many were added.  The chains are built by a compiled loop
        (:func:`~store.kernels.key_walk.chain_entries`, which runs without the GIL: the
        builder thread leaves the sending thread free): each entry's ``prevIndex`` is its
        slot's head, which then becomes it."""
        count = self.index_count
        k = min(len(key_hashes), self.entry_count - count)
        if k <= 0:
            return 0
        if not self._populated:
            self._populate()
        self._reserve(HEADER_SIZE + SLOT_SIZE * self.slot_count + ENTRY_SIZE * (count + k))
        if k <= _SCALAR_MAX:
            return self._put_few(count, k, key_hashes, phy_offsets, store_timestamps)
        hashes = np.asarray(key_hashes[:k], dtype=np.int64)
        phys = np.asarray(phy_offsets[:k], dtype=np.int64)
        stamps = np.asarray(store_timestamps[:k], dtype=np.int64)
        begin_ts, _, begin_phy, _, slots_used, _ = self.header()
        if count <= 1:  # the file's first entry sets its begin (its timeDiff is 0)
            begin_ts, begin_phy = int(stamps[0]), int(phys[0])
        fresh = chain_entries(np.frombuffer(self._mm, dtype=np.uint8), HEADER_SIZE,
                              HEADER_SIZE + SLOT_SIZE * self.slot_count, self.slot_count,
                              count, hashes, phys, stamps, begin_ts, _MAX_TIME_DIFF)
        HEADER.pack_into(self._mm, 0, begin_ts, int(stamps[-1]), begin_phy, int(phys[-1]),
                         slots_used + fresh, count + k)  # the header last
        return k

    def _put_few(self, count: int, k: int, key_hashes, phy_offsets, store_timestamps) -> int:
        """:meth:`put` of a few entries (a single send's), with ``struct`` rather than NumPy
        (whose fixed cost per call is most of a send's index work); the same bytes."""
        mm = self._mm
        begin_ts, _, begin_phy, _, slots_used, _ = HEADER.unpack_from(mm, 0)
        if count <= 1:
            begin_ts, begin_phy = int(store_timestamps[0]), int(phy_offsets[0])
        entry_base = HEADER_SIZE + SLOT_SIZE * self.slot_count
        written: set[int] = set()
        for i in range(k):
            h, n = int(key_hashes[i]), count + i
            slot_at = HEADER_SIZE + SLOT_SIZE * (h % self.slot_count)
            prev = _SLOT_HEAD.unpack_from(mm, slot_at)[0]
            if slot_at not in written and not 0 <= prev <= count:
                prev = 0  # past indexCount: a torn write's, ignored
            if prev == 0 and slot_at not in written:
                slots_used += 1
            diff = min(max((int(store_timestamps[i]) - begin_ts) // 1000, 0), _MAX_TIME_DIFF)
            ENTRY.pack_into(mm, entry_base + ENTRY_SIZE * n, h, int(phy_offsets[i]), diff, prev)
            _SLOT_HEAD.pack_into(mm, slot_at, n)
            written.add(slot_at)
        HEADER.pack_into(mm, 0, begin_ts, int(store_timestamps[k - 1]), begin_phy,
                         int(phy_offsets[k - 1]), slots_used, count + k)
        return k

    def _populate(self) -> None:
        """Fault the slot pages in at once before the first put of this process: a put's
        slots are random, and one page fault each is most of a fresh file's cost."""
        self._populated = True
        try:
            self._mm.madvise(_MADV_POPULATE_WRITE, 0, HEADER_SIZE + SLOT_SIZE * self.slot_count)
        except (OSError, ValueError, AttributeError):  # an older kernel: fault as they come
            pass

    def rechain(self, log_end: int) -> int:
        """Rebuild the slots, chains and header from the entries whose record starts before
        ``log_end`` (entries are in CommitLog order: the others are a torn tail); returns
        how many entries were dropped.  Recovery's step after a crash."""
        if self.index_count <= 1:
            return 0
        entries = self.entries()  # (put reads each entry before writing its place)
        keep = int(np.searchsorted(entries["phy_offset"], log_end, side="left"))
        kept = entries[:keep]
        begin_ts, end_ts = self.header()[:2]
        self.first_use = None  # (rewritten: what its first use found holds no more)
        slots = self._slots()
        slots[np.flatnonzero(slots)] = 0  # only the used slots: the file stays sparse
        HEADER.pack_into(self._mm, 0, 0, 0, 0, 0, 0, 1)
        if keep:
            stamps = begin_ts + kept["time_diff"].astype(np.int64) * 1000
            self.put(kept["key_hash"], kept["phy_offset"], stamps)
            # entries keep whole seconds only: the recorded times stand where still true
            h = self.header()
            end = end_ts if keep == len(entries) else int(stamps[-1]) + 999
            HEADER.pack_into(self._mm, 0, begin_ts, max(end, begin_ts), *h[2:])
        return len(entries) - keep

    # -- reading --------------------------------------------------------------------------------
    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        """Whether the file's time range meets ``[begin_ms, end_ms]``."""
        begin_ts, end_ts = self.header()[:2]
        return begin_ts <= end_ms and end_ts >= begin_ms

    def lookup(self, key_hash: int, max_results: int, begin_ms: int = 0,
               end_ms: int = (1 << 63) - 1) -> list[int]:
        """CommitLog offsets of the entries with ``key_hash`` stored in ``[begin_ms,
        end_ms]``, newest first, at most ``max_results`` (RocketMQ's chain walk)."""
        mm = self._mm
        begin_ts, _, _, _, _, count = HEADER.unpack_from(mm, 0)
        if count <= 1 or max_results <= 0:
            return []
        entry_base = HEADER_SIZE + SLOT_SIZE * self.slot_count
        n = _SLOT_HEAD.unpack_from(mm, HEADER_SIZE + SLOT_SIZE * (key_hash % self.slot_count))[0]
        found: list[int] = []
        steps = 0
        # a head at or past indexCount is a put in progress (its entries are written before
        # the heads, the header last) or a torn one's: its entries are passed over, not
        # returned, and the chain followed down to the published ones
        while 0 < n < self.entry_count and steps < self.entry_count:
            steps += 1  # a chain of a damaged file could loop: bounded by its size
            h, phy, diff, prev = ENTRY.unpack_from(mm, entry_base + ENTRY_SIZE * n)
            if n < count:
                stamp = begin_ts + diff * 1000
                if stamp < begin_ms:
                    break
                if h == key_hash and stamp <= end_ms:
                    found.append(phy)
                    if len(found) >= max_results:
                        break
            if prev >= n:  # chains run to older entries (its own number: the end)
                break
            n = prev
        return found

    # -- lifetime -------------------------------------------------------------------------------
    def flush(self) -> None:
        if self._mm is not None and not self.read_only:
            self._mm.flush()

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a NumPy view still alive: the mapping goes with it
                pass
            self._mm = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
