"""DelayKeyTable: the ``timerkeys`` file, which pending timer message each delay key names.

A timer message sent with a key (``producer.send(message, delay_ms=..., key=K)``,
``producer.replace_table``) replaces the one sent before with the same key; a cancel by key
(``producer.cancel(key=K)``) leaves the key naming nothing.  The table maps each key to the
message id it names now; the timer's delivery drops every keyed message whose id is not the
one its key names (:mod:`store.timer.delay_keys`).  The table is derived: the keyed records and the
cancel records in the timer topic's ConsumeQueue are the truth, and the table says up to which
queue offset it has applied them.

File: ``timerkeys`` under the store root, a header then an open-addressing hash table of
``capacity`` slots (a power of two), mapped shared so every process sees every change at once.

Header (64 bytes, big-endian)::

    off  size  type  field
    0    8     i64   magic       0x524D514B45595331 ("RMQKEYS1")
    8    8     i64   capacity    slots in the table (a power of two)
    16   8     i64   used        slots holding a key
    24   8     i64   indexed_to  timer-topic queue offset up to which records are applied
    32   8     i64   generation  + 1 each time the file is replaced by a rebuilt one
    40   24    -     reserved, zero

Slot (40 bytes at ``64 + index * 40``, big-endian)::

    off  size  type  field
    0    8     i64   key_hash    FNV-1a of the key's UTF-8 bytes (0: an empty slot; a hash
                                 of 0 is stored as 1)
    8    8     i64   key_check   CRC32 of the key's bytes << 32 | its length: with the hash,
                                 96 bits tell two keys apart
    16   8     i64   msg_hash    FNV-1a of the message id the key names now (0: cancelled)
    24   8     i64   fire_ms     when that message is due (kept when it is cancelled)
    32   8     i64   queue_offset  its offset in the timer topic's queue (kept likewise):
                                 whether the timer has taken it into the wheel yet

``index`` starts at ``key_hash & (capacity - 1)`` and goes on by one (linear probing).  Slots
are never emptied in place (that would break the probe chains): a slot whose message was due
long ago is dropped when the table is rebuilt, which happens when it is over half full (the
rebuilt table keeps only keys whose message is still pending, at twice the capacity when
that is needed).  A rebuild writes a new file beside the old one and renames it over it, so a
crash leaves the old table or the new one, never half of either.

Crash safety of an update: slots are written first and ``indexed_to`` last; a crash in
between leaves ``indexed_to`` behind, and the next update applies the same records again,
which ends in the same slots (applying records is idempotent).

Memory: the table is file-backed (page cache the kernel can drop), not process heap; the
file is 40 bytes per slot, 2 to 4 slots per pending key.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..base.errors import CorruptRecordError
from ..files.fileio import allocate, fsync_dir
from ..files.mapped_file import release_pages
from ..formats.binary_layout import layout

MAGIC = 0x524D514B45595331  # "RMQKEYS1"
HEADER_FIELDS = (
    ("magic", ">i8"),
    ("capacity", ">i8"),
    ("used", ">i8"),
    ("indexed_to", ">i8"),
    ("generation", ">i8"),
    ("reserved", "V24"),
)
HEADER, HEADER_SIZE, HEADER_DTYPE = layout(HEADER_FIELDS).exports()  # 64 bytes

SLOT_FIELDS = (
    ("key_hash", ">i8"),
    ("key_check", ">i8"),
    ("msg_hash", ">i8"),
    ("fire_ms", ">i8"),
    ("queue_offset", ">i8"),
)
SLOT, SLOT_SIZE, SLOT_DTYPE = layout(SLOT_FIELDS).exports()  # 40 bytes

#: Capacity of a new table.
MIN_CAPACITY = 1 << 12
#: The table is rebuilt when more than this share of its slots is used.
MAX_LOAD = 0.5
FILE_NAME = "timerkeys"


class DelayKeyTable:
    """The shared ``timerkeys`` mapping (see the module docstring).

    Callers hold the store's write lock for every change; :meth:`refresh` maps the file
    again when another process replaced it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._mm: mmap.mmap | None = None
        self._ino = None
        self.slots = np.zeros(0, dtype=SLOT_DTYPE)
        self._map()

    # ------------------------------------------------------------------ file
    @staticmethod
    def create(path: str, capacity: int = MIN_CAPACITY, indexed_to: int = 0,
               generation: int = 0) -> None:
        """Write an empty table file at ``path`` (through a temporary name and a rename)."""
        tmp = path + ".new"
        _write_empty(tmp, capacity, indexed_to, generation)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")

    def _map(self) -> None:
        self.close()
        fd = os.open(self.path, os.O_RDWR)
        try:
            st = os.fstat(fd)
            if st.st_size < HEADER_SIZE:
                raise CorruptRecordError(self.path, 0, f"{st.st_size} bytes, shorter than the "
                                         f"{HEADER_SIZE}-byte header; allowed: a timerkeys file "
                                         "(it is rebuilt from the timer topic)")
            mm = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        magic, capacity, used, indexed_to, _gen, _ = HEADER.unpack_from(mm, 0)
        if magic != MAGIC or capacity < 1 or capacity & (capacity - 1) \
                or st.st_size != HEADER_SIZE + capacity * SLOT_SIZE or not 0 <= used <= capacity \
                or indexed_to < 0:
            mm.close()
            raise CorruptRecordError(
                self.path, 0, f"not a timerkeys file of this version (magic {magic:#x}, "
                f"capacity {capacity}, {st.st_size} bytes); allowed: the layout of "
                "store.timer.delay_key_table (it is rebuilt from the timer topic)")
        self._mm = mm
        self._ino = (st.st_ino, st.st_size)
        self.slots = np.frombuffer(mm, dtype=SLOT_DTYPE, offset=HEADER_SIZE, count=capacity)

    def refresh(self) -> None:
        """Map the file again when it was replaced (by this or another process)."""
        st = os.stat(self.path)
        if (st.st_ino, st.st_size) != self._ino:
            self._map()

    def release_memory(self) -> None:
        """Drop this process's resident pages of the mapping (the data stays in the file
        and the page cache): the table costs no process memory between uses."""
        release_pages([self._mm])

    def close(self) -> None:
        """Unmap the file (the arrays handed out before become invalid)."""
        self.slots = np.zeros(0, dtype=SLOT_DTYPE)
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view is still alive somewhere: the GC unmaps it
                pass
            self._mm = None

    # ------------------------------------------------------------------ header
    def _header(self) -> tuple:
        return HEADER.unpack_from(self._mm, 0)

    @property
    def capacity(self) -> int:
        return self._header()[1]

    @property
    def used(self) -> int:
        return self._header()[2]

    @property
    def indexed_to(self) -> int:
        return self._header()[3]

    @property
    def generation(self) -> int:
        return self._header()[4]

    def set_indexed_to(self, value: int) -> None:
        """Record that every record before timer-topic queue offset ``value`` is applied."""
        magic, capacity, used, _, gen, reserved = self._header()
        HEADER.pack_into(self._mm, 0, magic, capacity, used, value, gen, reserved)

    def _set_used(self, value: int) -> None:
        magic, capacity, _, indexed_to, gen, reserved = self._header()
        HEADER.pack_into(self._mm, 0, magic, capacity, value, indexed_to, gen, reserved)

    # ------------------------------------------------------------------ probing
    def find(self, key_hash: np.ndarray, key_check: np.ndarray) -> np.ndarray:
        """The slot of each key (``-1``: not in the table); vectorised linear probing."""
        return find_slots(self.slots, key_hash, key_check)

    def upsert(self, key_hash: np.ndarray, key_check: np.ndarray, msg_hash: np.ndarray,
               fire_ms: np.ndarray, queue_offset: np.ndarray) -> None:
        """Set the slots of these keys (distinct keys; new ones take empty slots).

        A ``fire_ms`` below 0 keeps the slot's own fire time and queue offset (a cancel of
        a key in the table), and such a key not in the table is left out.  The caller makes
        room first (:meth:`needs_room`).
        """
        slots = self.slots
        at = find_slots(slots, key_hash, key_check)
        have = at >= 0
        if have.any():
            s = at[have]
            slots["msg_hash"][s] = msg_hash[have]
            moved = fire_ms[have] >= 0
            slots["fire_ms"][s[moved]] = fire_ms[have][moved]
            slots["queue_offset"][s[moved]] = queue_offset[have][moved]
        new = np.flatnonzero(~have & (fire_ms >= 0))
        if len(new):
            placed = place_new(slots, key_hash[new])
            slots["key_check"][placed] = key_check[new]
            slots["msg_hash"][placed] = msg_hash[new]
            slots["fire_ms"][placed] = fire_ms[new]
            slots["queue_offset"][placed] = queue_offset[new]
            slots["key_hash"][placed] = key_hash[new]  # last: the slot counts from here
            self._set_used(self.used + len(new))

    def needs_room(self, more: int) -> bool:
        """Whether ``more`` new keys would take the table past :data:`MAX_LOAD`."""
        return self.used + more > self.capacity * MAX_LOAD

    def rebuild(self, more: int, done: "callable") -> None:
        """Replace the file by a table holding the keys whose message is not done
        (``done(slots) -> bool array``: delivered or dropped), with room for ``more`` new
        keys."""
        slots = self.slots
        live = (slots["key_hash"] != 0) & ~done(slots)
        n_live = int(live.sum())
        capacity = MIN_CAPACITY
        while (n_live + more) > capacity * MAX_LOAD:
            capacity *= 2
        tmp = self.path + ".new"
        _write_empty(tmp, capacity, self.indexed_to, self.generation + 1)
        fresh = DelayKeyTable(tmp)
        try:
            src = slots[live]
            fresh.upsert(*(src[name].astype(np.int64) for name, _ in SLOT_FIELDS))
            fresh._mm.flush()
        finally:
            fresh.close()
        os.replace(tmp, self.path)
        fsync_dir(os.path.dirname(self.path) or ".")
        self._map()


def _write_empty(path: str, capacity: int, indexed_to: int, generation: int) -> None:
    size = HEADER_SIZE + capacity * SLOT_SIZE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        allocate(fd, size, path)  # written through the mapping: no holes (SIGBUS)
        os.ftruncate(fd, size)
        os.pwrite(fd, HEADER.pack(MAGIC, capacity, 0, indexed_to, generation, bytes(24)), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def find_slots(slots: np.ndarray, key_hash: np.ndarray, key_check: np.ndarray) -> np.ndarray:
    """For each key, the index of its slot in ``slots`` or ``-1`` (vectorised probing: one
    round per probe step for all the keys still looking)."""
    n = len(key_hash)
    out = np.full(n, -1, dtype=np.int64)
    cap = len(slots)
    if not n or not cap:
        return out
    mask = cap - 1
    table_hash = slots["key_hash"]
    table_check = slots["key_check"]
    looking = np.arange(n)
    pos = key_hash & mask
    for _ in range(cap):
        th = table_hash[pos].astype(np.int64)
        hit = (th == key_hash[looking]) & (table_check[pos] == key_check[looking])
        out[looking[hit]] = pos[hit]
        go_on = ~hit & (th != 0)
        looking, pos = looking[go_on], (pos[go_on] + 1) & mask
        if not len(looking):
            break
    return out


def place_new(slots: np.ndarray, key_hash: np.ndarray) -> np.ndarray:
    """Empty slots for keys not in the table (distinct), one each: where its probe chain
    first finds one no other key of the batch took.  Writes nothing."""
    n = len(key_hash)
    mask = len(slots) - 1
    taken = slots["key_hash"] != 0  # a copy: the batch's own claims go here
    out = np.empty(n, dtype=np.int64)
    looking = np.arange(n)
    pos = key_hash & mask
    while len(looking):
        free = ~taken[pos]
        cand, cpos = looking[free], pos[free]
        won_pos, first = np.unique(cpos, return_index=True)
        out[cand[first]] = won_pos
        taken[won_pos] = True
        won = np.zeros(len(looking), dtype=bool)
        won[np.flatnonzero(free)[first]] = True
        looking, pos = looking[~won], (pos[~won] + 1) & mask
    return out
