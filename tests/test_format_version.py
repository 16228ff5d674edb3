"""The on-disk format version (store.core.format_version): a store written by an earlier
rmq opens and delivers every pending message once and on time; a newer one is refused."""

from __future__ import annotations

import collections
import json
import os
import tarfile

import pytest
from conftest import FakeClock

from store import LocalTransactionState, Message, MessageStore, StoreFormatError
from store.core import format_version as fv
from store.core.store_layout import layout_crc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
T0 = 1_800_000_000_000  # tools/make_format_fixture.py
P = 1000  # the fixture's timer_precision_ms
S, H = 1000, 3_600_000

#: (topic, body) -> due time of every message pending in the fixture store
PENDING = {
    ("timer", b"t5"): T0 + 5 * S, ("timer", b"t60"): T0 + 60 * S,
    ("timer", b"t3600"): T0 + H, ("timer", b"t7200"): T0 + 2 * H,
    ("timer", b"t10800"): T0 + 3 * H,  # past the 4096 s wheel: rolled
    ("levels", b"l3"): T0 + 10 * S, ("levels", b"l5"): T0 + 60 * S,
    ("levels", b"l18"): T0 + 2 * H,
    ("keyed", b"replaced"): T0 + 40 * S, ("keyed", b"other"): T0 + 25 * S,
}
EVERY = [T0 + 10 * S * k for k in range(1, 7)]  # the interval schedule: 6 fires
CRON = [T0 + H * k for k in range(1, 4)]        # hourly (T0 is on the hour)


def _extract(version: int, tmp_path) -> str:
    with tarfile.open(os.path.join(FIXTURES, f"format-v{version}", "store.tar.gz")) as tar:
        try:
            tar.extractall(tmp_path, filter="data")
        except TypeError:  # Python before 3.10.12
            tar.extractall(tmp_path)  # noqa: S202 - our own fixture
    return str(tmp_path / "store")


def _counts(store: MessageStore) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    for topic in store.topics():
        for q in store.queue_ids(topic):
            for v in store.pull(topic, q, 0, store.max_offset(topic, q) + 1):
                seen[(topic, v.body)] += 1
    return seen


def _check(store: MessageStore, now: int) -> None:
    seen = _counts(store)
    for key, due in PENDING.items():
        if due > now:
            assert seen[key] == 0, f"{key} due at T0+{due - T0} surfaced early, at T0+{now - T0}"
        elif due <= now - P:
            assert seen[key] == 1, f"{key} due at T0+{due - T0}: {seen[key]} at T0+{now - T0}"
    assert seen[("timer", b"cancelled")] == 0 and seen[("keyed", b"first")] == 0
    assert seen[("levels", b"l1")] == 1 and seen[("plain", b"p0")] == 1
    for topic, body, fires in (("every", b"tick", EVERY), ("cron", b"hourly", CRON)):
        early = sum(f > now for f in fires)
        assert seen[(topic, body)] <= len(fires) - early, (topic, now - T0)
        assert seen[(topic, body)] >= sum(f <= now - P for f in fires), (topic, now - T0)


def test_the_version_1_store_delivers_everything_once_and_on_time(tmp_path):
    path = _extract(1, tmp_path)
    clock = FakeClock(T0 + 2 * S)
    store = MessageStore.open(path, clock=clock)
    try:
        assert store.format_version == fv.FORMAT_VERSION
        _check(store, clock())
        # the open transactions are asked about, and end once
        clock.set(T0 + 10 * S)
        store.check_transactions(lambda view: LocalTransactionState.COMMIT_MESSAGE)
        store.check_transactions(lambda view: LocalTransactionState.COMMIT_MESSAGE)
        paid = _counts(store)
        assert {b for (t, b), n in paid.items() if t == "paid" and n == 1} == {
            b"open0", b"open1", b"open2", b"committed"}
        assert sum(n for (t, _), n in paid.items() if t == "paid") == 4
        times = sorted({t for d in [*PENDING.values(), *EVERY, *CRON] for t in (d - 1, d + P)})
        for i, now in enumerate(t for t in times if t >= clock()):
            clock.set(now)
            store.deliver_due()
            _check(store, now)
            if i % 5 == 4:  # restarts along the way change nothing
                store.close()
                store = MessageStore.open(path, clock=clock)
    finally:
        store.close()


def test_a_store_of_a_newer_format_is_refused_and_left_unchanged(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        store.producer("g").send(Message("t", b"x"))
    meta = os.path.join(path, "config", "store.json")
    for name in (meta, meta + ".bak"):  # as a newer rmq would write it, checksum included
        data = json.load(open(name))
        data["format_version"] = fv.FORMAT_VERSION + 1
        data["layout_crc32"] = layout_crc(data["layout"], data["store_id"],
                                           data["format_version"])
        json.dump(data, open(name, "w"))
    before = {n: open(os.path.join(path, "config", n), "rb").read()
              for n in os.listdir(os.path.join(path, "config"))}
    for read_only in (False, True):
        with pytest.raises(StoreFormatError, match=f"format version {fv.FORMAT_VERSION + 1}"):
            MessageStore.open(path, read_only=read_only)
    assert {n: open(os.path.join(path, "config", n), "rb").read()
            for n in os.listdir(os.path.join(path, "config"))} == before


def test_an_older_format_is_moved_forward_with_its_files_kept(tmp_path, monkeypatch):
    """The step machinery, with a made-up step from version 1 to 2."""
    path = str(tmp_path / "s")
    with MessageStore.open(path) as store:
        store.producer("g").send(Message("t", b"x"))
    target = os.path.join(path, "config", "topics.json")
    original = open(target, "rb").read()

    def step(root: str) -> None:
        with open(os.path.join(root, "config", "topics.json"), "ab") as fh:
            fh.write(b"\n")

    monkeypatch.setattr(fv, "FORMAT_VERSION", 2)
    monkeypatch.setattr(fv, "MIGRATIONS", {1: ((os.path.join("config", "topics.json"),), step)})
    monkeypatch.setattr("store.core.reading.FORMAT_VERSION", 2)
    monkeypatch.setattr("store.core.store_layout.FORMAT_VERSION", 2)
    with MessageStore.open(path) as store:
        assert store.format_version == 2
    kept = os.path.join(path, "config", "format-v1", "config__topics.json")
    assert open(kept, "rb").read() == original
    assert json.load(open(os.path.join(path, "config", "store.json")))["format_version"] == 2
    with MessageStore.open(path, read_only=True) as reader:  # and it reads as version 2
        assert reader.format_version == 2


def test_a_version_with_no_step_forward_is_refused(tmp_path):
    with pytest.raises(StoreFormatError, match="no step from it"):
        fv.migrate(str(tmp_path), 0, {})
