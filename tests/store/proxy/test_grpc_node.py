"""A second language: Apache's official Node.js client (npm ``rocketmq-client-nodejs``) sends
to and receives from ``rmq serve --grpc``.  Skipped where Node.js or the npm package cannot be
installed (the package is installed once into ``~/.cache/rmq-tests/node``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

from store import StoreReader, StoreServer  # noqa: E402

pytestmark = [pytest.mark.xdist_group("grpc"), pytest.mark.slow]

PACKAGE = "rocketmq-client-nodejs@1.0.8"
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def node_modules():
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js / npm are not installed")
    cache = os.path.join(os.path.expanduser("~"), ".cache", "rmq-tests", "node")
    if not os.path.isdir(os.path.join(cache, "node_modules", "rocketmq-client-nodejs")):
        os.makedirs(cache, exist_ok=True)
        try:
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", cache,
                            PACKAGE], check=True, capture_output=True, timeout=300)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"npm could not install {PACKAGE}: {exc}")
    return os.path.join(cache, "node_modules")


def test_node_client_sends_and_receives(tmp_path, node_modules):
    srv = StoreServer(str(tmp_path / "store"), grpc="127.0.0.1:0")
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        out = subprocess.run(
            ["node", os.path.join(HERE, "node", "send_receive.js"), srv.grpc_endpoint,
             "from-node", "node-group"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "NODE_PATH": node_modules, "HOME": str(tmp_path)})
    finally:
        srv.stop()
        thread.join(timeout=30)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["sent"]) == 3
    assert sorted(g["id"] for g in result["got"]) == sorted(result["sent"])
    assert sorted(g["body"] for g in result["got"]) == ["node-0", "node-1", "node-2"]
    assert {g["tag"] for g in result["got"]} == {"node"}
    reader = StoreReader.open(str(tmp_path / "store"))
    try:
        views = [v for q in reader.queue_ids("from-node") for v in reader.pull("from-node", q, 0, 10)]
    finally:
        reader.close()
    assert sorted(v.msg_id for v in views) == sorted(result["sent"])
    assert all(dict(v.properties) == {"lang": "js"} for v in views)
