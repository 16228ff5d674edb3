"""Fixtures of the gRPC face's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def endpoint_of(tmp_path):
    """Makes ``GrpcEndpoint``s on loopback (``options``: its bounds ...) over stores of 1 MiB
    messages of their own; all closed at the end."""
    from store import MessageStore, StoreConfig
    from store.proxy import GrpcEndpoint

    made = []

    def make(**options) -> GrpcEndpoint:
        store = MessageStore.open(str(tmp_path / f"store{len(made)}"),
                                  StoreConfig(max_message_size_bytes=1 << 20))
        endpoint = GrpcEndpoint(store, "127.0.0.1:0", **options)
        made.append((endpoint, store))
        return endpoint

    yield make
    for endpoint, store in made:
        endpoint.close(grace_s=0)
        store.close()
