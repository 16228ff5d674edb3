"""A call refused for its token is logged with the client's address, never the token."""

from __future__ import annotations

import logging

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
