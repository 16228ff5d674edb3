"""Write the store fixture of an on-disk format version: ``tests/fixtures/format-v<N>/``.

The store holds, at the fake time ``T0``, what a store in use holds: timer messages pending
(seconds and hours ahead, one past the wheel so that it rolls), delay-level messages pending,
a cancelled timer message, keyed delayed messages (one replaced), recurring schedules (an
interval and a cron one), open transactions (and one committed, one rolled back) and plain
messages.  ``tests/test_format_version.py`` opens it with every later rmq and checks that
each pending message is delivered once and on time.  Run it only when a new format version
is introduced (the fixture of an older version is never rewritten)::

    python tools/make_format_fixture.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from store import LocalTransactionState, Message, MessageStore, StoreConfig  # noqa: E402
from store.core.format_version import FORMAT_VERSION  # noqa: E402

#: The fake time the fixture store was written at (epoch ms).
T0 = 1_800_000_000_000

#: Small files, so that the fixture stays small (the wheel spans 4096 s).
CONFIG = StoreConfig(commitlog_file_size_bytes=256 * 1024, consume_queue_file_entries=1000,
                     timer_precision_ms=1000, timer_wheel_slots=4096,
                     timer_roll_window_slots=1024, timer_log_file_size_bytes=64 * 1024)


class _Undecided:
    """A transaction listener whose local transactions stay open (UNKNOW)."""

    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, view):
        return LocalTransactionState.UNKNOW


def write_store(path: str) -> None:
    now = [T0]
    with MessageStore.open(path, CONFIG, clock=lambda: now[0]) as store:
        p = store.producer("fixture")
        p.send(Message("plain", b"p0", keys="k0"))
        for delay_s in (5, 60, 3_600, 2 * 3_600, 3 * 3_600):  # the last rolls (wheel: 4096 s)
            p.send(Message("timer", b"t%d" % delay_s, tags="t"), delay_ms=delay_s * 1000)
        gone = p.send(Message("timer", b"cancelled"), delay_ms=30_000)
        p.cancel("timer", gone.msg_id)
        for level in (1, 3, 5, 18):  # 1 s, 10 s, 1 min, 2 h
            p.send(Message("levels", b"l%d" % level), delay_level=level)
        p.send(Message("keyed", b"first"), delay_ms=20_000, key="order-1")
        p.send(Message("keyed", b"replaced"), delay_ms=40_000, key="order-1")
        p.send(Message("keyed", b"other"), delay_ms=25_000, key="order-2")
        p.schedule(Message("every", b"tick"), key="tick", every_ms=10_000,
                   start_at_ms=T0 + 10_000, max_fires=6)
        p.schedule(Message("cron", b"hourly"), key="hourly", cron="0 * * * *")
        tx = store.transaction_producer("fixture-tx", _Undecided())
        for i in range(3):
            tx.send_in_transaction(Message("paid", b"open%d" % i), LocalTransactionState.UNKNOW)
        tx.send_in_transaction(Message("paid", b"committed"), LocalTransactionState.COMMIT_MESSAGE)
        tx.send_in_transaction(Message("paid", b"rolled-back"),
                               LocalTransactionState.ROLLBACK_MESSAGE)
        now[0] = T0 + 2_000
        store.deliver_due()  # the 1 s level message is delivered before the fixture is taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(
        ROOT, "tests", "fixtures", f"format-v{FORMAT_VERSION}", "store.tar.gz"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="rmq-format-fixture-")
    try:
        path = os.path.join(work, "store")
        write_store(path)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with tarfile.open(args.out, "w:gz") as tar:
            tar.add(path, arcname="store")
        size = os.path.getsize(args.out)
        print(f"wrote {args.out} ({size} bytes), format version {FORMAT_VERSION}, T0={T0}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    subprocess.run(["git", "-C", ROOT, "status", "--short", os.path.dirname(args.out)])


if __name__ == "__main__":
    main()
