"""The five commands of the report: serve a store; send three messages delayed 1 s; wait;
``rm -rf`` the store; send one delayed 2 s to the same path.  The server notices that its
store was replaced, says so and exits non-zero, writing nothing into the new store; the new
store's delayed message surfaces once, on time, when a server runs for it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from store import MessageStore, server_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rmq(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "rmq_cli.cli", *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=120, check=check)


def _serve(path: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "rmq_cli.cli", "serve", "--store", path,
                             "--log-level", "WARNING"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _bodies(path: str, topic: str) -> list[str]:
    with MessageStore.open(path, read_only=True) as store:
        if topic not in store.topics():
            return []
        return sorted(v.body.decode() for q in store.queue_ids(topic)
                      for v in store.pull(topic, q, 0, store.max_offset(topic, q) + 1))


def _attached(path: str) -> bool:
    status = server_status(path)
    return bool(status and status["attached"] and status.get("running"))


@pytest.mark.slow
def test_a_server_whose_store_is_replaced_stops_and_the_new_store_delivers(tmp_path):
    path = str(tmp_path / "store")
    _rmq("send", "--store", path, "--create", "--topic", "warm", stdin="w\n")
    server = _serve(path)
    try:
        _wait(lambda: _attached(path) or server.poll() is not None, 90, "server never ran")
        assert server.poll() is None, server.communicate()
        _rmq("send", "--store", path, "--topic", "t", "--delay-ms", "1000", stdin="a\nb\nc\n")
        _wait(lambda: len(_bodies(path, "t")) == 3, 30, "the first three never surfaced")
        shutil.rmtree(path)
        sent_ms = time.time() * 1000
        # a send to a path holding no store is refused unless told to create one
        refused = _rmq("send", "--store", path, "--topic", "t", "--delay-ms", "2000",
                       stdin="d\n", check=False)
        assert refused.returncode == 2 and "--create" in refused.stderr, refused.stderr
        assert not os.path.exists(path)
        _rmq("send", "--store", path, "--create", "--topic", "t", "--delay-ms", "2000",
             stdin="d\n")
        new_config = os.path.join(path, "config")
        before = sorted(os.listdir(new_config))
        # the server notices within one delivery step (1 s), says why and exits non-zero
        try:
            _, err = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError(f"the server kept serving a replaced store: "
                                 f"{server.communicate()[1][-2000:]}") from None
        assert server.returncode == 3, err[-2000:]
        assert "replaced by another store" in err or "was removed" in err, err[-2000:]
        # it wrote nothing into the new store: no status, no timer or queue progress of its own
        assert sorted(os.listdir(new_config)) == before
        assert "serve.json" not in before
        # a server for the new store delivers its message once, not before it is due
        assert _bodies(path, "t") == []
        server = _serve(path)
        _wait(lambda: _bodies(path, "t") == ["d"], 60, "the new store's message never surfaced")
        assert time.time() * 1000 >= sent_ms + 2000
        time.sleep(1.5)  # a few more delivery steps: nothing twice
        assert _bodies(path, "t") == ["d"]
        status = json.loads(_rmq("stats", "--store", path, "--json").stdout)
        assert status  # stats reads the new store
    finally:
        if server.poll() is None:
            server.terminate()
            server.communicate(timeout=30)


def test_the_quick_start_keeps_a_served_store(tmp_path):
    """The quick start deletes its store to start afresh, but never one a server holds."""
    from store import StoreServer
    from test_readme import quick_start_code

    path = str(tmp_path / "store")
    code = quick_start_code().replace("/tmp/rmq-quickstart", path)
    code = code.split("\nspark = ", 1)[0]  # the store part: Spark is not what is tested here
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=ROOT)
    server = StoreServer(path)  # holds the server lock, as rmq serve does
    try:
        with MessageStore.open(path) as store:
            store.producer("g").send(__import__("store").Message("keep", b"k"))
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert _bodies(path, "keep") == ["k"]  # the store is still there, the order added
        assert len(_bodies(path, "orders")) == 1
    finally:
        server.close()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _bodies(path, "keep") == []  # no server: a fresh store


def test_a_failed_write_in_a_delivery_step_does_not_stop_the_server(tmp_path, monkeypatch):
    """Out of open files for a moment (EMFILE): the step is logged and retried, the server
    goes on (the soak test saw one such error end rmq serve)."""
    import errno

    from store import Message, StoreServer

    path = str(tmp_path / "store")
    with MessageStore.open(path) as store:
        store.producer("g").send(Message("t", b"x"), delay_ms=1_000)
    server = StoreServer(path)
    real, calls = server.store.deliver_due, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(*args, **kwargs)

    monkeypatch.setattr(server.store, "deliver_due", flaky)
    counters = server.run(duration_s=3.5)
    assert counters.replaced is None
    assert any("Too many open files" in e for e in counters.errors)
    assert len(calls) >= 2 and counters.delivered == 1
