"""Fuzz every kind of file an rmq store writes, and check what the store does with the damage.

Builds one small store (plain sends across several CommitLog segments, a batch, delay-level
and timer messages, committed and open transactions), closes it, then for each case copies
it, damages one file (bits flipped, truncated at a random point, a range zeroed, garbage
appended, garbage or other-shaped JSON, deleted) and uses the copy as a user would: open,
pull every queue, read every queue as Arrow, deliver what is due, run a check round, read it
again read-only, reopen.  Every case is judged on four counts:

* ``raw``: an exception that is not a :class:`~store.base.errors.StoreError` (never allowed);
* ``lost``: a message whose CommitLog record is intact in the damaged copy, that no read
  returned and no typed error reported (never allowed);
* ``refused``: a message whose CommitLog record is intact that every read refused with a
  typed error (never allowed: a damaged derived file is rebuilt from the CommitLog);
* ``bad``: a message served (with ``verify_crc=True`` reads) whose bytes differ from what
  was sent (never allowed);
* ``unreadable``: the store could not be opened at all (allowed only for damage the store
  cannot read past: none of the files it writes, today).

When the damaged file is not a CommitLog segment (so every record is intact), the delayed
messages are judged by what is delivered, too: ``early`` (a message visible before it is
due), ``undelivered`` and ``doubled`` (once all are due, each must be in its topic exactly
once); never allowed.  The ``field`` damage makes one field of the timer checkpoint or of the
delay levels' offsets wrong.

Run ``python tools/fuzz_store.py --cases 300 --seed 1`` for a report; the test suite runs a
bounded number of cases (``tests/store/test_fuzz_files.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from store import (  # noqa: E402
    LocalTransactionState,
    Message,
    MessageStore,
    StoreConfig,
    StoreError,
)

CONFIG = StoreConfig(commitlog_file_size_bytes=64 * 1024, consume_queue_file_entries=200,
                     timer_precision_ms=100, timer_wheel_slots=4096,
                     timer_roll_window_slots=1024, timer_log_file_size_bytes=16 * 1024)
START_MS = 1_700_000_000_000
MUTATIONS = ("flip", "truncate", "zero", "extend", "delete", "garbage", "field")
#: Bodies of the delayed messages the base store holds, pending or delivered already.
DELAYED = tuple(b"%s-%d" % (k, i) for k in (b"level", b"timer") for i in range(30)) + tuple(
    b"far-%d" % i for i in range(10))
#: When the far-* messages are due (1 h after they were sent, at START_MS).
FAR_DUE_MS = START_MS + 3_600_000
USER_TOPICS = ("orders", "payments", "reminders")


class Clock:
    def __init__(self, now: int = START_MS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class _Unknown:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, view):
        return LocalTransactionState.UNKNOW


@dataclass
class Base:
    """The undamaged store and what it holds."""

    path: str
    #: (topic, queue id, queue offset) -> (CommitLog offset, record size, body)
    visible: dict = field(default_factory=dict)
    #: every body sent, delayed ones included
    sent: set = field(default_factory=set)
    clock_ms: int = START_MS


def build_base(path: str) -> Base:
    clock = Clock()
    with MessageStore.open(path, CONFIG, clock=clock, flush_service=False) as s:
        p = s.producer("fuzz")
        for i in range(600):
            p.send(Message("orders", b"order-%05d-" % i + b"x" * (i % 97), tags=f"t{i % 3}",
                           keys=f"o-{i}", properties={"n": str(i)}))
        p.send_batch([Message("payments", b"pay-%d" % i, tags="paid") for i in range(40)])
        for i in range(30):
            p.send(Message("reminders", b"level-%d" % i), delay_level=1 + i % 3)
            p.send(Message("reminders", b"timer-%d" % i), delay_ms=500 + 100 * i)
        for i in range(10):
            p.send(Message("reminders", b"far-%d" % i), delay_ms=3_600_000)
        tx = s.transaction_producer("pay", _Unknown())
        ids = [tx.send_in_transaction(Message("payments", b"tx-%d" % i)).transaction_id
               for i in range(12)]
        for i, tid in enumerate(ids[:8]):
            s.end_transaction(tid, LocalTransactionState.COMMIT_MESSAGE if i % 2
                              else LocalTransactionState.ROLLBACK_MESSAGE)
        clock.now += 3_000
        s.deliver_due()
        clock.now += 7_000
        s.check_transactions(lambda v: LocalTransactionState.UNKNOW)
    base = Base(path, clock_ms=clock.now)
    base.sent = ({b"order-%05d-" % i + b"x" * (i % 97) for i in range(600)}
                 | {b"pay-%d" % i for i in range(40)} | {b"tx-%d" % i for i in range(12)}
                 | {b"%s-%d" % (k, i) for k in (b"level", b"timer") for i in range(30)}
                 | {b"far-%d" % i for i in range(10)} | {b"after"})
    with MessageStore.open(path, CONFIG, read_only=True, clock=clock) as r:
        for topic in USER_TOPICS:
            for q in r.queue_ids(topic):
                for off in range(r.min_offset(topic, q), r.max_offset(topic, q)):
                    (v,) = r.pull(topic, q, off, 1)
                    size = int.from_bytes(_commitlog_bytes(path, v.commitlog_offset, 4), "big")
                    base.visible[(topic, q, off)] = (v.commitlog_offset, size, v.body)
    return base


def _commitlog_bytes(root: str, offset: int, size: int) -> bytes | None:
    seg = CONFIG.commitlog_file_size_bytes
    path = os.path.join(root, "commitlog", f"{offset - offset % seg:020d}")
    try:
        with open(path, "rb") as fh:
            fh.seek(offset % seg)
            data = fh.read(size)
    except OSError:
        return None
    return data if len(data) == size else None


def store_files(root: str) -> list[str]:
    """Every file of the store, relative to it (locks excluded: they hold nothing)."""
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if name not in ("lock", "open.lock"):
                out.append(rel)
    return sorted(out)


def damage(path: str, kind: str, rng: random.Random) -> str:
    """Apply one damage of ``kind`` to the file at ``path``; describe it."""
    size = os.path.getsize(path)
    if kind == "delete":
        os.unlink(path)
        return "deleted"
    if kind == "truncate":
        n = rng.randrange(0, size) if size else 0
        os.truncate(path, n)
        return f"truncated to {n} of {size}"
    if kind == "extend":
        extra = bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 100, 4096))))
        with open(path, "ab") as fh:
            fh.write(extra)
        return f"{len(extra)} bytes appended"
    if kind == "garbage":
        if path.endswith((".json", ".bak")):
            choice = rng.randrange(4)
            data = [b"\xff\xfe{", b"[1, 2, 3]", b'{"topicConfigTable": 7, "offsetTable": []}',
                    json.dumps({"a": {"b": None}}).encode()][choice]
        else:
            data = bytes(rng.randrange(256) for _ in range(min(size, 64) or 8))
        with open(path, "wb") as fh:
            fh.write(data)
        return f"replaced by {len(data)} garbage bytes"
    if kind == "field":
        return _damage_field(path, rng)
    if size == 0:
        return "empty, left as is"
    with open(path, "r+b") as fh:
        data = bytearray(fh.read())
        if kind == "flip":
            n = rng.choice((1, 3, 16))
            where = []
            for _ in range(n):
                i = _interesting_offset(data, rng)
                data[i] ^= 1 << rng.randrange(8)
                where.append(i)
            desc = f"{n} bits flipped at {sorted(where)[:4]}"
        else:  # zero
            start = _interesting_offset(data, rng)
            length = rng.choice((1, 4, 20, 100, 4096, size))
            data[start:start + length] = bytes(len(data[start:start + length]))
            desc = f"zeroed [{start}, {min(size, start + length)})"
        fh.seek(0)
        fh.write(data)
    return desc


def _damage_field(path: str, rng: random.Random) -> str:
    """One field of a progress file made wrong: an 8-byte field of the timer checkpoint
    zeroed or flipped, a delay level's offset in ``delayOffset.json`` moved forward inside
    its queue, moved past it or made no number; other files get a range zeroed."""
    name = os.path.basename(path)
    if name == "timercheck":
        with open(path, "r+b") as fh:
            data = bytearray(fh.read())
            field_no = rng.randrange(12)
            flip = rng.random() < 0.5
            for i in range(8 * field_no, 8 * field_no + 8):
                data[i] = data[i] ^ 0xFF if flip else 0
            fh.seek(0)
            fh.write(data)
        return f"timercheck field {field_no} {'flipped' if flip else 'zeroed'}"
    if name.startswith("delayOffset.json"):
        from store.files.broker_files import read_lenient_json, write_config

        data = read_lenient_json(path)
        if isinstance(data, dict) and isinstance(data.get("offsetTable"), dict):
            if rng.random() < 0.5:  # moved forward, still inside the queue of a level in use
                level = rng.randrange(1, 4)
                table = {int(k): v for k, v in data["offsetTable"].items()}
                value = int(table.get(level, 0)) + rng.randrange(1, 11)
                data["offsetTable"] = {**table, level: value}
            else:
                level = rng.randrange(1, 19)
                value = rng.choice((10**6, 2**62, "x", None))
                data["offsetTable"][level] = value
            write_config(path, data)
            return f"delay level {level}'s offset set to {value!r}"
    with open(path, "r+b") as fh:
        data = bytearray(fh.read())
        if not data:
            return "empty, left as is"
        start = _interesting_offset(data, rng)
        data[start:start + 8] = bytes(len(data[start:start + 8]))
        fh.seek(0)
        fh.write(data)
    return f"zeroed [{start}, {start + 8})"


def _judge_delivery(copy: str, base_clock_ms: int, out: Outcome) -> None:
    """Delayed messages judged by what is delivered: none of the far-* ones before they are
    due, and once they all are, every delayed message in its topic exactly once."""
    clock = Clock(base_clock_ms + 1_000)
    for now in (base_clock_ms + 1_000, FAR_DUE_MS + 60_000):
        clock.now = now
        store = _guard(out, "open to deliver", MessageStore.open, copy, CONFIG, clock=clock,
                       flush_service=False)
        if store is None:
            return
        try:
            for _ in range(3):
                _guard(out, "deliver_due", store.deliver_due)
            counts: Counter = Counter()
            for q in (_guard(out, "queue_ids", store.queue_ids, "reminders") or []):
                end = _guard(out, "max_offset", store.max_offset, "reminders", q) or 0
                views = _guard(out, "pull", store.pull, "reminders", q, 0, end + 1) or []
                counts.update(v.body for v in views)
        finally:
            _guard(out, "close", store.close)
        if now < FAR_DUE_MS:
            out.early += [f"{b!r} visible {FAR_DUE_MS - now} ms before it is due"
                          for b in counts if b.startswith(b"far-")]
    out.undelivered += [repr(b) for b in DELAYED if counts[b] == 0]
    out.doubled += [f"{b!r} x{counts[b]}" for b in DELAYED if counts[b] > 1]


def _interesting_offset(data: bytearray, rng: random.Random) -> int:
    """Mostly inside written data (non-zero bytes), sometimes anywhere."""
    if rng.random() < 0.85:
        end = len(data.rstrip(b"\0"))
        if end:
            return rng.randrange(end)
    return rng.randrange(len(data))


@dataclass
class Outcome:
    case: str
    raw: list = field(default_factory=list)
    typed: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    refused: list = field(default_factory=list)
    bad: list = field(default_factory=list)
    early: list = field(default_factory=list)
    undelivered: list = field(default_factory=list)
    doubled: list = field(default_factory=list)
    unreadable: bool = False


def _guard(out: Outcome, what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except StoreError as exc:
        out.typed.append(f"{what}: {type(exc).__name__}: {exc}"[:300])
    except Exception as exc:  # noqa: BLE001 - the point is to find them
        tb = traceback.format_exc(limit=-3)
        out.raw.append(f"{what}: {type(exc).__name__}: {exc}\n{tb}"[:2000])
    return None


def _read_all(store, out: Outcome, seen: dict, failed: set, verify: bool) -> None:
    topics = _guard(out, "topics", store.topics) or []
    for topic in topics:
        qids = _guard(out, f"queue_ids {topic}", store.queue_ids, topic) or []
        for q in qids:
            lo = _guard(out, f"min_offset {topic}/{q}", store.min_offset, topic, q)
            hi = _guard(out, f"max_offset {topic}/{q}", store.max_offset, topic, q)
            if lo is None or hi is None:
                failed.add((topic, q, None))
                continue
            if hi - lo > 100_000:  # no queue of the base store is that long
                out.typed.append(f"{topic}/{q}: offsets {lo} to {hi}, implausibly many")
                lo = max(lo, hi - 1000)
            off = lo
            while off < hi:
                views = _guard(out, f"pull {topic}/{q}@{off}", store.pull, topic, q, off, 64,
                               **({"verify_crc": True} if verify else {}))
                if views is None:
                    failed.add((topic, q, off))
                    off += 1
                    continue
                if not views:
                    break
                for i, v in enumerate(views):
                    seen.setdefault((topic, q, off + i), set()).add(v.body)
                off += len(views)
            batch = _guard(out, f"read_arrow {topic}/{q}", store.read_arrow, topic, q, lo, hi,
                           **({"verify_crc": True} if verify else {}))
            if batch is not None:  # what Spark would get: invalid UTF-8 would fail there
                batch = _guard(out, f"validate {topic}/{q}", _validated, batch)
            if batch is None:
                failed.update((topic, q, o) for o in range(lo, hi))
            else:
                for o, body in zip(batch.column("queue_offset").to_pylist(),
                                   batch.column("body").to_pylist()):
                    seen.setdefault((topic, q, o), set()).add(body)


def _as_crashed(copy: str, rng: random.Random, boundaries: list[int]) -> str:
    """Leave the crash marker of a process of another boot and move the checkpoint's flushed
    offset back to a record boundary, so the next open recovers (rescans and re-dispatches)
    from there."""
    from store.files.checkpoint import StoreCheckpoint

    with open(os.path.join(copy, "abort"), "w") as fh:
        fh.write("999999 another-boot")
    cp = StoreCheckpoint(os.path.join(copy, "checkpoint"))
    try:
        back = rng.choice(boundaries)
        cp.set("flushed_phy_offset", back)
        cp.flush()
    finally:
        cp.close()
    return f", crashed (rescan from {back})"


def _validated(batch):
    batch.validate(full=True)
    return batch


def run_case(base: Base, work: str, rel: str, kind: str, rng: random.Random,
             verify: bool) -> Outcome:
    copy = os.path.join(work, "store")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(base.path, copy)
    crashed = ""
    if rng.random() < 0.5:  # as if the last process died: recovery rescans from earlier
        crashed = _as_crashed(copy, rng, [0] + sorted(p for p, _, _ in base.visible.values()))
    desc = damage(os.path.join(copy, rel), kind, rng)
    out = Outcome(f"{rel}: {kind} ({desc}){crashed}")
    seen: dict = {}
    failed: set = set()
    clock = Clock(base.clock_ms + 1_000)
    for read_only in (True, False, True):
        store = _guard(out, f"open read_only={read_only}", MessageStore.open, copy, CONFIG,
                       clock=clock, flush_service=False, read_only=read_only)
        if store is None:
            out.unreadable = True
            continue
        try:
            _read_all(store, out, seen, failed, verify)
            if not read_only:
                _guard(out, "deliver_due", store.deliver_due)
                _guard(out, "check_transactions", store.check_transactions,
                       lambda v: LocalTransactionState.UNKNOW)
                _guard(out, "stats", store.pending_delayed_stats)
                _guard(out, "send", store.producer("after").send, Message("orders", b"after"))
        finally:
            _guard(out, "close", store.close)
    failed_queues = {(t, q) for t, q, o in failed if o is None}
    sent = base.sent
    for key, (phys, size, body) in base.visible.items():
        got = seen.get(key)
        intact = (_commitlog_bytes(copy, phys, size)
                  == _commitlog_bytes(base.path, phys, size))
        # a record that is gone may come back elsewhere (a delayed message delivered again
        # after its copy was cut), so another message at its offset is no fault
        if got is not None and verify and ((intact and got != {body}) or got - sent):
            out.bad.append(f"{key}: served {sorted(got)[:2]} instead of {body!r}")
        if got is None and intact and key not in failed and key[:2] not in failed_queues:
            out.lost.append(f"{key} at CommitLog {phys}: not read, no error")
        elif got is None and intact:
            out.refused.append(f"{key} at CommitLog {phys}: intact, refused with an error")
    for key in set(seen) - set(base.visible):
        if verify and seen[key] - sent:
            out.bad.append(f"{key}: served {sorted(seen[key])[:2]}, never sent")
    if not rel.startswith("commitlog"):
        _judge_delivery(copy, base.clock_ms, out)  # every record is intact: judge delivery
    return out


def fuzz(cases: int, seed: int, *, verify: bool = True, work: str | None = None,
         log=print, only: str = "", kinds: tuple[str, ...] = MUTATIONS) -> dict:
    rng = random.Random(seed)
    own = work is None
    work = work or tempfile.mkdtemp(prefix="rmq-fuzz-")
    try:
        base = build_base(os.path.join(work, "base"))
        files = [f for f in store_files(base.path) if f.startswith(only)]
        counts: Counter = Counter()
        problems = []
        t0 = time.perf_counter()
        for n in range(cases):
            rel = rng.choice(files)
            usable = [k for k in kinds if (k != "garbage" or rel.endswith((".json", ".bak"))
                      or rng.random() < 0.3) and (k != "field" or "timercheck" in rel
                                                  or "delayOffset" in rel)] or list(kinds)
            kind = rng.choice(usable)
            if os.environ.get("RMQ_FUZZ_TRACE"):
                print(f"case {n}: {rel} {kind}", file=sys.stderr, flush=True)
            out = run_case(base, os.path.join(work, "case"), rel, kind, rng, verify)
            counts["cases"] += 1
            counts[f"kind:{kind}"] += 1
            counts["typed errors"] += len(out.typed)
            for name in ("raw", "lost", "refused", "bad", "early", "undelivered", "doubled"):
                if getattr(out, name):
                    counts[f"cases with {name}"] += 1
                    problems.append((name, out.case, getattr(out, name)[:3]))
            if out.unreadable:
                counts["cases unreadable"] += 1
                problems.append(("unreadable", out.case, out.typed[:2]))
            if out.typed:
                counts["cases with typed errors"] += 1
            if log and (n + 1) % 50 == 0:
                log(f"{n + 1} cases, {time.perf_counter() - t0:.1f} s")
        return {"counts": dict(counts), "problems": problems,
                "seconds": time.perf_counter() - t0}
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-verify", action="store_true", help="reads without CRC checks")
    ap.add_argument("--only", default="", help="damage only files under this path prefix "
                    "(e.g. commitlog/)")
    ap.add_argument("--kinds", default=",".join(MUTATIONS),
                    help=f"damage kinds, comma-separated (default: {','.join(MUTATIONS)})")
    args = ap.parse_args(argv)
    report = fuzz(args.cases, args.seed, verify=not args.no_verify, only=args.only,
                  kinds=tuple(k for k in args.kinds.split(",") if k))
    for name, case, details in report["problems"]:
        print(f"[{name}] {case}")
        for d in details:
            print("    " + str(d).replace("\n", "\n    "))
    print(json.dumps(report["counts"], indent=1, sort_keys=True))
    print(f"{report['seconds']:.1f} s")
    bad = sum(report["counts"].get(f"cases with {n}", 0)
              for n in ("raw", "lost", "bad", "early", "undelivered", "doubled"))
    return 1 if bad or report["counts"].get("cases unreadable") else 0


if __name__ == "__main__":
    sys.exit(main())
