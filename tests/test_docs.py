"""The docs, step by step: a shell block that starts a server says where it runs (``&`` or
"another terminal"), ``pip install`` lines work from a checkout, the token options have one
name per face, and docs/rocketmq-clients.md's Python client block runs as written."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _blocks(text: str, languages=("bash", "sh", "shell", "")) -> list[str]:
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.DOTALL)
            if lang in languages]


def _commands(block: str) -> list[str]:
    """The block's commands, a line continued with ``\\`` joined to the next."""
    return block.replace("\\\n", " ").splitlines()


def test_every_block_that_starts_a_server_says_where_it_runs():
    found = 0
    for path in DOCS:
        for block in _blocks(_text(path)):
            for line in _commands(block):
                command = line.split("#", 1)[0].strip()
                if not re.match(r"(.*&& )?rmq serve\b", command):
                    continue
                found += 1
                assert command.endswith("&") or "another terminal" in block, (
                    f"{os.path.relpath(path, ROOT)}: {line.strip()!r} starts a server that "
                    "blocks the lines after it: end it with & or say 'in another terminal'")
    assert found >= 4  # README's network and gRPC blocks, operations.md, rocketmq-clients.md


def test_pip_install_lines_work_from_a_checkout():
    for path in DOCS:
        text = _text(path)
        for spec in re.findall(r"pip install (?:-\w+ )*(['\"]?[\w.\[\],-]+['\"]?)", text):
            name = spec.strip("'\"")
            assert not re.match(r"rmq\b", name), (
                f"{os.path.relpath(path, ROOT)}: pip install {spec}: rmq is not on a package "
                "index; allowed: pip install . or pip install '.[grpc]' in rmq's directory")


def test_token_options_have_one_name_per_face():
    spark_spellings = set()
    python_spellings = set()
    for path in DOCS:
        text = _text(path)
        spark_spellings.update(re.findall(r"""option\(["'](token\w*)["']""", text, re.IGNORECASE))
        python_spellings.update(re.findall(r"\b(token(?:_\w+)?)=", text))
        assert not re.search(r"""option\(["']token_file["']|tokenfile=|--tokenFile""", text), path
    assert spark_spellings <= {"token", "tokenFile"}, spark_spellings
    assert python_spellings <= {"token", "token_file"}, python_spellings


def test_options_and_sink_docs_list_the_token_options_for_readers_and_writers():
    from rmq_source.offset_spec import OPTION_NAMES, REMOTE_OPTION_NAMES

    remote = {OPTION_NAMES[k] for k in REMOTE_OPTION_NAMES}
    assert {"token", "tokenFile"} <= remote
    for doc in ("options.md", "sink.md"):
        table = _text(os.path.join(ROOT, "docs", doc))
        for name in remote:
            row = re.search(rf"^\| `{name}`[^\n]*", table, re.MULTILINE)
            assert row, f"docs/{doc} has no row for {name}"
    options = _text(os.path.join(ROOT, "docs", "options.md"))
    for name in ("token", "tokenFile"):
        row = re.search(rf"^\| `{name}`[^\n]*", options, re.MULTILINE).group(0)
        assert "readers and writers" in row, row


def test_the_sink_accepts_a_token_file(tmp_path):
    from rmq_source.options import parse_options

    token = tmp_path / "token.txt"
    token.write_text("s3cret\n")
    opts = parse_options({"path": "rmq://127.0.0.1:7911", "tokenFile": str(token),
                          "topic": "t"}, write=True, streaming=False)
    assert opts.remote.token == "s3cret"
    assert "tokenfile" not in opts.raw


def _python_client_block() -> str:
    text = _text(os.path.join(ROOT, "docs", "rocketmq-clients.md"))
    blocks = [b for b in _blocks(text, ("python",)) if "from rocketmq import" in b]
    assert len(blocks) == 1, "docs/rocketmq-clients.md has one Python client block"
    return blocks[0]


@pytest.mark.slow
def test_the_python_client_block_runs_as_written_twice(tmp_path):
    pytest.importorskip("rocketmq.grpc_protocol")
    from store import StoreConfig, StoreServer

    block = _python_client_block()
    for what in ("delivery_timestamp", "begin_transaction", "commit()", "SimpleConsumer",
                 ".receive(", ".ack("):
        assert what in block, what
    server = StoreServer(str(tmp_path / "store"), StoreConfig(timer_precision_ms=100),
                         grpc="127.0.0.1:0")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        script = tmp_path / "client.py"
        script.write_text(block.replace("127.0.0.1:8081", server.grpc_endpoint))
        env = {**os.environ, "PYTHONPATH": ROOT}
        for _ in range(2):  # the second run receives its own messages, as the first did
            done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, check=False,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
            assert done.stdout.count("orders timeout") == 1, done.stdout
            assert "payments" in done.stdout
    finally:
        server.stop()
        thread.join(timeout=30)
