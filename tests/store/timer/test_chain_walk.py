"""The compiled TimerLog chain walk against a plain Python walker, on damaged chains too."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.timer.timer_log import (MAGIC_DEFAULT, MAGIC_ROLL, UNIT, UNIT_DTYPE, UNIT_SIZE,
                                   TimerLog, units_per_file)

FILE = 1024  # 19 units per file: chains cross files often


def _model_walk(log: TimerLog, last: int, end: int) -> list[tuple[int, int, int, int]]:
    """(position, magic, enqueueTime, offsetPy) newest first, one unpack per unit."""
    out, pos, per = [], last, units_per_file(FILE)
    while 0 <= pos < end:
        f = log.files.find(pos)
        rel = pos - (pos - pos % FILE)
        if f is None or rel % UNIT_SIZE or rel // UNIT_SIZE >= per:
            break
        size, prev, magic, enq, _d, off, _s, _h, _r = UNIT.unpack_from(f.buffer(), rel)
        if size != UNIT_SIZE or magic & ~0xF:
            break
        out.append((pos, magic, enq, off))
        if prev >= pos:
            break
        pos = prev
    return out


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slots=st.lists(st.integers(0, 3), min_size=1, max_size=80),
       damage=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(
           ["size", "magic", "forward", "self", "misaligned"])), max_size=3),
       cut=st.integers(0, 80), hint=st.integers(0, 10**9))
def test_walk_matches_the_model(fresh_dir, slots, damage, cut, hint):
    damage = [(int(at * len(slots)), kind) for at, kind in damage]  # a unit that exists
    log = TimerLog(str(fresh_dir("tl")), FILE)
    positions, _blanks, end = log.place(0, len(slots))
    units = np.zeros(len(slots), dtype=UNIT_DTYPE)
    last = {}
    for i, slot in enumerate(slots):  # four interleaved chains, as slots fill in turn
        units[i] = (UNIT_SIZE, last.get(slot, -1), MAGIC_DEFAULT | (MAGIC_ROLL * (i % 5 == 0)),
                    1_000 + i, slot, 10**12 + 7 * i, 100, 0, 0)
        last[slot] = int(positions[i])
    for i, kind in damage:
        if kind == "size":
            units[i]["size"] = 51
        elif kind == "magic":
            units[i]["magic"] = 0x10
        elif kind == "forward":
            units[i]["prev_pos"] = int(positions[-1]) + UNIT_SIZE
        elif kind == "self":
            units[i]["prev_pos"] = int(positions[i])
        else:
            units[i]["prev_pos"] = int(positions[i]) - 7
    log.write(positions, units, _blanks)
    valid_end = int(positions[min(cut, len(slots) - 1)]) + UNIT_SIZE if cut < len(slots) else end
    for slot, pos in last.items():
        got_pos, got = log.walk_chain(pos, valid_end, hint)
        want = _model_walk(log, pos, valid_end)
        assert got_pos.tolist() == [w[0] for w in want]
        assert list(zip(got["position"].tolist(), got["magic"].tolist(),
                        got["enqueue_time"].tolist(), got["offset_py"].tolist())) == want
