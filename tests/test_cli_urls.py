"""``rmq`` commands given a served store's URL (``--store rmq://HOST:PORT``) and paths that
hold no store: a URL is used (with ``--token-file``) or refused naming what to use instead
(exit 2), never taken for a folder; a missing store is an error unless ``--create``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from rmq_cli.cli import main
from store import Message, MessageStore, StoreError, connect

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "cli-url-secret"
#: Bound on waiting for the server to answer, and on a tail to print.
WAIT_S = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real ``rmq serve --listen 127.0.0.1:PORT --token-file F`` on a store of its own:
    ``(url, token file)``."""
    base = tmp_path_factory.mktemp("served")
    token_file = base / "token"
    token_file.write_text(TOKEN + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    MessageStore.open(str(base / "s")).close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_cli.cli", "serve", "--store", str(base / "s"), "--listen",
         f"127.0.0.1:{port}", "--token-file", str(token_file), "--log-level", "WARNING"],
        env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
        stderr=open(base / "serve.log", "w"))  # noqa: SIM115 - the server's, closed with it
    url = f"rmq://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:  # answering once a call succeeds
            try:
                with connect(url, token_file=str(token_file), timeout_s=2) as remote:
                    remote.info()
                break
            except StoreError:
                assert proc.poll() is None, (base / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "rmq serve never answered"
                time.sleep(0.1)
        yield url, str(token_file)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from an empty directory; afterwards no ``rmq:`` folder may be in it."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert not {"rmq:", "rmqs:"} & set(os.listdir(tmp_path))


def rmq(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def test_send_tail_stats_and_cancel_take_a_url(server, in_tmp):
    url, token_file = server
    auth = ("--store", url, "--token-file", token_file)
    r = rmq("send", *auth, "--topic", "url-orders", "--tags", "created", input="a\nb\nc\n")
    assert r.exit_code == 0, r.output
    assert "sent 3 message(s) to url-orders" in r.output
    with connect(url, token_file=token_file) as remote:  # on the server, not in a folder
        assert sum(remote.max_offset("url-orders", q)
                   for q in remote.queue_ids("url-orders")) == 3

    r = rmq("tail", *auth, "--topic", "url-orders", "--from", "earliest", "--no-follow",
            "--format", "json")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted(row["body"] for row in rows) == ["a", "b", "c"]
    assert {row["tags"] for row in rows} == {"created"}

    r = rmq("stats", *auth, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["store"] == url and data["remote"] is True
    assert [t["messages"] for t in data["topics"] if t["topic"] == "url-orders"] == [3]
    r = rmq("stats", *auth)
    assert r.exit_code == 0 and "url-orders" in r.output and "server's host" in r.output

    r = rmq("send", *auth, "--topic", "url-orders", "--delay-ms", "3600000", "--print-ids",
            input="later\n")
    assert r.exit_code == 0, r.output
    msg_id = r.stdout.strip()
    r = rmq("cancel", *auth, "--topic", "url-orders", "--msg-id", msg_id)
    assert r.exit_code == 0 and f"cancelled {msg_id}" in r.output
    r = rmq("cancel", *auth, "--topic", "url-orders", "--msg-id", msg_id)
    assert r.exit_code == 1  # not pending any more


def test_schedules_over_a_url(server, in_tmp):
    url, token_file = server
    auth = ("--store", url, "--token-file", token_file)
    r = rmq("schedule", "add", *auth, "--key", "url-remind", "--topic", "url-reminders",
            "--body", "pay", "--every-ms", "60000")
    assert r.exit_code == 0 and "scheduled url-remind: next fire" in r.output, r.output
    r = rmq("schedules", *auth, "--json")
    assert r.exit_code == 0, r.output
    assert {s["key"]: s["state"] for s in json.loads(r.stdout)}["url-remind"] == "active"
    for verb, state in (("pause", "paused"), ("resume", "active")):
        assert rmq("schedule", verb, *auth, "--key", "url-remind").exit_code == 0
        listed = json.loads(rmq("schedules", *auth, "--json").stdout)
        assert {s["key"]: s["state"] for s in listed}["url-remind"] == state
    assert rmq("schedule", "remove", *auth, "--key", "url-remind").exit_code == 0
    assert "url-remind" not in rmq("schedules", *auth).output


def test_tail_of_a_url_prints_a_message_sent_after_it_started(server, in_tmp):
    """``rmq tail --store URL`` from the latest message: lines sent while it runs appear."""
    url, token_file = server
    tail = subprocess.Popen(
        [sys.executable, "-m", "rmq_cli.cli", "tail", "--store", url, "--token-file",
         token_file, "--topic", "url-live", "--max-messages", "1", "--poll-ms", "50"],
        env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        with connect(url, token_file=token_file) as remote:
            producer = remote.producer("g")
            i = 0
            while tail.poll() is None:  # sent until the tail, started before, prints one
                assert time.monotonic() < deadline, "rmq tail printed nothing"
                producer.send(Message("url-live", b"live-%d" % i))
                i += 1
                time.sleep(0.2)
        out, err = tail.communicate(timeout=WAIT_S)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    assert tail.returncode == 0, err
    assert "url-live/" in out and "live-" in out


def test_a_wrong_token_is_one_line_and_exit_1(server, in_tmp):
    url, _ = server
    bad = in_tmp / "bad-token"
    bad.write_text("not-the-token\n")
    r = rmq("tail", "--store", url, "--token-file", str(bad), "--topic", "t", "--no-follow")
    assert r.exit_code == 1 and r.output.startswith("rmq: error:"), r.output


@pytest.mark.parametrize("args, says", [
    (["repair"], "rmq repair --store DIR"),
    (["retention", "--dry-run"], "server's host"),
    (["pending"], "server's host"),
    (["serve", "--duration-s", "0"], "rmq serve --store DIR"),
    (["stats", "--verify"], "--verify"),
    (["stats", "--system"], "--system"),
    (["demo", "--quiet"], "give --store DIR"),
])
def test_commands_that_read_files_refuse_a_url_naming_what_to_use(in_tmp, args, says):
    r = rmq(*args, "--store", "rmq://127.0.0.1:1")
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert isinstance(r.exception, SystemExit)


def test_lag_refuses_a_url(in_tmp):
    (in_tmp / "ckpt").mkdir()
    r = rmq("lag", "--checkpoint", str(in_tmp / "ckpt"), "--store", "rmq://127.0.0.1:1")
    assert r.exit_code == 2 and "query_lag" in r.output, r.output


@pytest.mark.parametrize("args, says", [
    (["send", "--store", "rmq://h1:7911,h1:7911", "--topic", "t"], "names a server twice"),
    (["tail", "--store", "rmq://h1:7911,h2", "--topic", "t"], "a host and a port"),
    (["send", "--store", "rmq://h:7911", "--create", "--topic", "t"], "leave --create out"),
    (["send", "--store", "rmq://h:7911", "--token-file", "/nonexistent/token", "--topic",
      "t"], "cannot be read"),
    (["send", "--store", "rmq://h:7911/path", "--topic", "t"], "nothing may follow"),
    (["schedules", "--store", "rmq://h:7911", "--token", "a", "--token-file", "f"],
     "not both"),
])
def test_bad_urls_and_token_options_are_usage_errors(in_tmp, args, says):
    r = rmq(*args, input="x\n")
    assert r.exit_code == 2, r.output
    assert says in r.output


def test_a_token_with_a_directory_is_a_usage_error(in_tmp):
    MessageStore.open(str(in_tmp / "s")).close()
    r = rmq("tail", "--store", str(in_tmp / "s"), "--token", "x", "--topic", "t")
    assert r.exit_code == 2 and "go with a served store's URL" in r.output


@pytest.mark.parametrize("command, rest", [
    (["send"], ["--topic", "t"]),
    (["schedule", "add"], ["--key", "k", "--topic", "t", "--body", "b", "--every-ms", "1000"]),
    (["serve"], ["--duration-s", "0"]),
])
def test_a_path_holding_no_store_is_an_error_unless_create(in_tmp, command, rest):
    """A typo is an error naming the path, not a new empty store; --create makes one."""
    missing = in_tmp / "typo" / "store"
    r = rmq(*command, "--store", str(missing), *rest, input="x\n")
    assert r.exit_code == 2, r.output
    assert str(missing) in r.output and "does not exist" in r.output and "--create" in r.output
    assert not (in_tmp / "typo").exists()
    (in_tmp / "empty").mkdir()  # a directory, but no store in it
    r = rmq(*command, "--store", str(in_tmp / "empty"), *rest, input="x\n")
    assert r.exit_code == 2 and "holds no rmq store" in r.output, r.output
    assert os.listdir(in_tmp / "empty") == []
    r = rmq(*command, "--store", str(missing), "--create", *rest, input="x\n")
    assert r.exit_code == 0, r.output
    assert (missing / "config" / "store.json").is_file()
