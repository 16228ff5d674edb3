"""The gRPC face under malformed protobufs and garbage frames (the fuzzer of
``tools/fuzz_grpc.py``, driven by hypothesis, bounded): every call of ``MessagingService``
answers each with a typed status, the server keeps serving, no answer echoes more than a
bounded text (never the store's directory), and nothing is stored that no request carried."""

from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("rocketmq.grpc_protocol")

import grpc  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from store import StoreConfig, StoreServer  # noqa: E402
from conftest import load_tool

pytestmark = pytest.mark.xdist_group("grpc")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _fuzzer():
    return load_tool("fuzz_grpc")


fuzz = _fuzzer()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = StoreServer(str(tmp_path_factory.mktemp("fuzz") / "store"),
                      StoreConfig(max_message_size_bytes=64 * 1024), grpc="127.0.0.1:0")
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    channel = grpc.insecure_channel(srv.grpc_endpoint)
    yield srv, channel
    channel.close()
    srv.stop()
    thread.join(timeout=30)


def _fuzz(server, cases):
    srv, channel = server
    sent: list[bytes] = []
    seeds = fuzz.seeds()

    @settings(max_examples=cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(rng=st.randoms(use_true_random=False),
           garbage=st.one_of(st.none(), st.binary(max_size=512)))
    def one(rng, garbage):
        method, frames = fuzz.case(rng, seeds)
        if garbage is not None:
            frames = [garbage]
        sent.extend(frames)
        outcome = fuzz.call(channel, method, frames, timeout=5.0,
                            client_id=f"fuzz-{rng.randrange(4)}")
        assert not fuzz.problems(method, outcome, srv.path), (method, frames[:1])
        alive = fuzz.call(channel, "QueryRoute", seeds["QueryRoute"], timeout=10)
        assert alive.error is None, alive

    one()
    assert not fuzz.stored_problems(srv.path, sent)


def test_malformed_frames_to_every_call_get_typed_answers(server):
    _fuzz(server, 300)


def test_the_seeds_are_answered_with_a_status(server):
    srv, channel = server
    for method, frames in fuzz.seeds().items():
        outcome = fuzz.call(channel, method, frames, timeout=5.0)
        assert outcome.error is None, (method, outcome)
        assert not fuzz.problems(method, outcome, srv.path)


@pytest.mark.slow
def test_the_fuzzer_against_a_server_process():
    """``tools/fuzz_grpc.py`` for 20 s against an ``rmq serve`` process of its own."""
    report = fuzz.run(20, seed=7, log=None)
    assert report["counts"]["cases"] > 100
    assert not report["problems"], report["problems"][:20]
