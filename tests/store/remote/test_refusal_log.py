"""A call refused for its token is logged with the client's address, never the token."""

from __future__ import annotations

import logging
import time

import pytest

from store import AuthenticationError, Message, StoreServer, connect

TOKEN = "s3cret-token"


def test_a_refused_call_names_the_client_address(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="store.remote")
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0", token=TOKEN)
    try:
        for token in (None, "wrong"):
            with connect(server.url, token=token) as remote:
                with pytest.raises(AuthenticationError, match="token"):
                    remote.producer("g").send(Message("t", b"x"))
                with pytest.raises(AuthenticationError, match="token"):
                    remote.topics()
    finally:
        server.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "store.remote"]
    refused = [line for line in lines if line.startswith("refused")]
    assert len(refused) == 4, lines
    assert all("127.0.0.1" in line for line in refused), refused
    assert any("no token" in line for line in refused)
    assert any("wrong token" in line for line in refused)
    assert TOKEN not in caplog.text


_STAGE_AND_VANISH = """
import os, sys, threading, time
import pyarrow as pa
from store import connect
n = 600_000
table = pa.table({"topic": ["t"] * n, "body": pa.array([b"x" * 50] * n, pa.binary())})
threading.Thread(target=connect(sys.argv[1]).sink("s1").stage, args=(table,),
                 daemon=True).start()
time.sleep(float(sys.argv[2]))
os._exit(0)
"""


@pytest.mark.slow
def test_a_client_gone_before_its_answer_logs_one_line_without_a_stack(tmp_path, caplog,
                                                                     monkeypatch):
    """A sink stage whose client exits after sending it whole, before the answer: the code
    before logged an ERROR with a stack trace for each (a client could have one logged per
    call it drops); now one warning within the refusals' rate."""
    import os
    import subprocess
    import sys

    from store.sink.sink import Sink

    stage = Sink.stage

    def slow_stage(self, *args, **kwargs):  # (the server's: the client is gone before the
        time.sleep(3.0)                     # answer whatever the machine's speed)
        return stage(self, *args, **kwargs)

    monkeypatch.setattr(Sink, "stage", slow_stage)
    caplog.set_level(logging.WARNING, logger="store.remote")
    server = StoreServer(str(tmp_path / "s"), listen="127.0.0.1:0")
    try:
        for delay in (1.0, 2.0, 3.0, 4.5, 6.0):  # until one exits after sending it whole
            subprocess.run([sys.executable, "-c", _STAGE_AND_VANISH, server.url, str(delay)],
                           env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=120,
                           check=False)
            if any("went away before its answer" in r.getMessage() for r in caplog.records):
                break
    finally:
        server.close()
    records = [r for r in caplog.records if r.name == "store.remote"]
    assert any("went away before its answer" in r.getMessage() for r in records), \
        [r.getMessage()[:200] for r in records]
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info]
