"""Every example runs (in-process, on the shared Spark session), twice in a row on one store:
the second run finds the first run's messages there and still passes, and no run leaves a
checkpoint directory behind."""

from __future__ import annotations

import glob
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)


@pytest.fixture(autouse=True)
def _no_checkpoint_left(monkeypatch, tmp_path):
    """Examples make their checkpoints under the temporary directory: here ``tmp_path``'s
    own, which must hold no ``rmq-*chk-*`` directory when the example is done."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    yield
    assert glob.glob(str(scratch / "*chk-*")) == []


def _load(name):
    if name in sys.modules:
        return importlib.reload(sys.modules[name])
    return importlib.import_module(name)


def test_send_and_read(spark, tmp_path):
    mod = _load("send_and_read")
    for _ in range(2):
        counts = mod.main(spark=spark, store_path=str(tmp_path / "s"))
        assert counts == {"orders": 100, "audit": 50}


def test_delayed_orders_stream(spark, tmp_path):
    mod = _load("delayed_orders_stream")
    for _ in range(2):
        seen = mod.main(spark=spark, store_path=str(tmp_path / "s"))
        assert len(seen) == 4
        assert all(seen_ms >= due for _, due, seen_ms in seen)


def test_backfill_parquet(spark, tmp_path):
    mod = _load("backfill_parquet")
    for _ in range(2):
        n = mod.main(spark=spark, store_path=str(tmp_path / "s"),
                     out_dir=str(tmp_path / "out.parquet"))
        assert n == 40
        assert spark.read.parquet(str(tmp_path / "out.parquet")).count() == 40


def test_check_loop(spark, tmp_path):
    mod = _load("check_loop")
    for _ in range(2):
        keys = mod.main(spark=spark, store_path=str(tmp_path / "s"))
        assert len(keys) == len(set(keys)) == 17


def test_served_orders_runs_twice_against_one_server(spark, tmp_path):
    """As README's network block runs it: over TLS when openssl can make a certificate."""
    from store import StoreServer

    tls, roots = None, None
    if shutil.which("openssl"):
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "1", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key),
                        "-out", str(cert)], check=True, capture_output=True)
        tls, roots = (cert.read_bytes(), key.read_bytes()), str(cert)
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token="example-token",
                         tls=tls)
    try:
        mod = _load("served_orders")
        for _ in range(2):
            result = mod.main(spark=spark, url=server.url, token="example-token",
                              tls_root_certs=roots)
            assert result == {"closed": 40, "distinct": 40, "unpaid": 40, "early": 0}
    finally:
        server.close()
