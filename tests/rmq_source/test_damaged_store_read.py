"""Spark reads of damaged store copies (issue: damaged files, item 7): the job either reads
every intact message or fails with one of the store's typed errors, never a raw Python one.

Damaged copies come from the file fuzzer (tools/fuzz_store.py); each is read with
``spark.read.format("rmq")`` twice: with the defaults, and with ``verifyCrc=true`` and
``failOnDataLoss=false`` (which must then succeed).
"""

from __future__ import annotations

import os
import random
import re
import shutil

import pytest
from conftest import load_tool

pytestmark = pytest.mark.spark

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAW = re.compile(r"^(UnicodeDecodeError|UnicodeEncodeError|AttributeError|OSError|KeyError|"
                 r"IndexError|ValueError|TypeError|OverflowError|MemoryError)\b", re.M)


def _fuzzer():
    return load_tool("fuzz_store")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    fuzz = _fuzzer()
    root = tmp_path_factory.mktemp("damaged-read")
    return fuzz, fuzz.build_base(str(root / "base")), root


CASES = [("commitlog/", "flip"), ("commitlog/", "truncate"), ("commitlog/", "zero"),
         ("consumequeue/orders/", "flip"), ("consumequeue/orders/", "zero"),
         ("consumequeue/orders/", "truncate"), ("consumequeue/payments/", "delete"),
         ("config/", "garbage"), ("checkpoint", "flip"), ("commitlog/", "extend")]


@pytest.mark.parametrize("prefix,kind", CASES)
def test_spark_reads_a_damaged_copy(spark, base, prefix, kind):
    fuzz, b, root = base
    rng = random.Random(f"{prefix}{kind}")
    copy = str(root / f"case-{prefix.replace('/', '_')}{kind}")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(b.path, copy)
    rel = rng.choice([f for f in fuzz.store_files(copy) if f.startswith(prefix)])
    what = fuzz.damage(os.path.join(copy, rel), kind, rng)
    reader = (spark.read.format("rmq").option("subscribe", "orders,payments")
              .option("deliverDue", "false"))
    try:
        reader.load(copy).count()
    except Exception as exc:  # noqa: BLE001 - the kind of error is what is checked
        text = str(exc)
        assert not RAW.search(text), f"{rel} {what}: raw error\n{text[-3000:]}"
        assert re.search(r"(CorruptRecordError|OffsetOutOfRangeError|DataLossError|"
                         r"StoreError|InvalidOptionError)", text), text[-3000:]
    rows = (reader.option("verifyCrc", "true").option("failOnDataLoss", "false")
            .load(copy).collect())
    intact = {body for (topic, _, _), (phys, size, body) in b.visible.items()
              if topic in ("orders", "payments")
              and fuzz._commitlog_bytes(copy, phys, size) == fuzz._commitlog_bytes(
                  b.path, phys, size)}
    got = {bytes(r["body"]) for r in rows}
    assert got <= b.sent, f"{rel} {what}: a damaged body was served"
    if not prefix.startswith("consumequeue"):  # a reader cannot rebuild a damaged queue
        assert intact <= got, f"{rel} {what}: {len(intact - got)} intact messages not read"
