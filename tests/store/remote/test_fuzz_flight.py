"""The Flight fuzzer (tools/fuzz_flight.py) in the suite, bounded: malformed Arrow tables,
garbage commands, tickets and actions against a running ``rmq serve --listen``; the server
never dies, never answers with bytes it was not sent, and answers each with a typed error."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from conftest import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
fuzz_flight = load_tool("fuzz_flight")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    served = fuzz_flight.FlightTarget(str(tmp_path_factory.mktemp("fuzz-flight")))
    yield served
    served.close()


@pytest.mark.slow
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=fuzz_flight.cases)
def test_the_server_holds_against_malformed_requests(target, case):
    assert target.run(case) == []


def test_a_long_field_quoted_in_an_error_stays_a_typed_error(target):
    """The fuzzer once reported an untyped internal error for a ``query_round`` ticket whose
    stream name (thousands of characters) the error quoted; alone it answers typed, here and
    before the change.  Error texts are cut to 1,000 characters now (what a client chose to
    send is never echoed whole); this case stays as a check."""
    case = ("get", json.dumps({"op": "query_round", "stream": "n" * 16_000,
                               "round": 0}).encode())
    assert target.run(case) == []


@pytest.mark.slow
def test_after_the_fuzz_the_canary_is_stored_once_and_sends_work(target):
    assert target.final_problems() == []
