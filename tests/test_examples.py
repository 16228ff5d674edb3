"""Every example runs (in-process, on the shared Spark session)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)


def _load(name):
    if name in sys.modules:
        return importlib.reload(sys.modules[name])
    return importlib.import_module(name)


def test_send_and_read(spark, tmp_path):
    counts = _load("send_and_read").main(spark=spark, store_path=str(tmp_path / "s"))
    assert counts == {"orders": 100, "audit": 50}


def test_delayed_orders_stream(spark, tmp_path):
    seen = _load("delayed_orders_stream").main(spark=spark, store_path=str(tmp_path / "s"))
    assert len(seen) == 4
    assert all(seen_ms >= due for _, due, seen_ms in seen)


def test_backfill_parquet(spark, tmp_path):
    n = _load("backfill_parquet").main(spark=spark, store_path=str(tmp_path / "s"),
                                       out_dir=str(tmp_path / "out.parquet"))
    assert n == 40
    assert spark.read.parquet(str(tmp_path / "out.parquet")).count() == 40


def test_check_loop(spark, tmp_path):
    mod = _load("check_loop")
    result = mod.main(spark=spark, store_path=str(tmp_path / "s"))
    assert result is not None


def test_served_orders(spark):
    result = _load("served_orders").main(spark=spark)
    assert result == {"closed": 40, "distinct": 40, "unpaid": 40, "early": 0}
