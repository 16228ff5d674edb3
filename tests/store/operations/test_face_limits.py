"""``rmq serve``'s flags of the faces' bounds: each value reaches its face, a bad one is
refused with what is allowed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rmq_cli.cli import main
from store import FaceLimits, InvalidConfigError, StoreServer
from store.operations.face_limits import FLAGS


def _served(monkeypatch, tmp_path, *flags: str):
    """Run ``rmq serve`` with ``flags`` for a moment; what its faces held: ``(held calls,
    telemetry streams, Flight streams)`` bounds objects (``None`` for a face not served)."""
    seen = {}
    run = StoreServer.run

    def run_briefly(self, duration_s=None):
        service = self.endpoint.service if self.endpoint is not None else None
        seen["held"] = service.held if service is not None else None
        seen["streams"] = service.streams if service is not None else None
        seen["flight"] = self.service._streams if self.service is not None else None
        return run(self, duration_s=0)

    monkeypatch.setattr(StoreServer, "run", run_briefly)
    r = CliRunner().invoke(main, ["serve", "--create", "--store", str(tmp_path / "s"),
                                  "--log-level", "ERROR", *flags])
    assert r.exit_code == 0, r.output
    return seen["held"], seen["streams"], seen["flight"]


def test_the_grpc_bound_flags_reach_the_endpoint(monkeypatch, tmp_path):
    pytest.importorskip("rocketmq.grpc_protocol")
    held, streams, _ = _served(
        monkeypatch, tmp_path, "--grpc", "127.0.0.1:0", "--grpc-max-held-calls", "300",
        "--grpc-max-held-calls-per-client", "7", "--grpc-max-held-calls-per-peer", "30",
        "--grpc-max-held-calls-per-account", "60", "--grpc-max-telemetry-streams", "5000",
        "--grpc-max-telemetry-streams-per-peer", "4000")
    assert (held.total, held.per_client, held.per_peer, held.per_account) == (300, 7, 30, 60)
    assert (streams.total, streams.per_peer) == (5000, 4000)


def test_the_flight_bound_flags_reach_the_service(monkeypatch, tmp_path):
    _, _, flight = _served(monkeypatch, tmp_path, "--listen", "127.0.0.1:0",
                           "--listen-max-streams", "900", "--listen-max-streams-per-host", "300")
    assert (flight.in_all, flight.per_client) == (900, 300)


def test_without_bound_flags_the_faces_keep_their_defaults(monkeypatch, tmp_path):
    pytest.importorskip("rocketmq.grpc_protocol")
    held, streams, flight = _served(monkeypatch, tmp_path, "--grpc", "127.0.0.1:0",
                                    "--listen", "127.0.0.1:0")
    d = FaceLimits()
    assert (held.total, held.per_client, held.per_peer, held.per_account) == (
        d.grpc_held_calls, d.grpc_held_calls_per_client, d.grpc_held_calls_per_peer,
        d.grpc_held_calls_per_account)
    assert (streams.total, streams.per_peer) == (d.grpc_telemetry_streams,
                                                 d.grpc_telemetry_streams_per_peer)
    assert (flight.in_all, flight.per_client) == (d.flight_streams, d.flight_streams_per_host)


@pytest.mark.parametrize("flag, value, allowed", [
    ("--grpc-max-held-calls", "0", "from 1 to 16,384"),
    ("--grpc-max-held-calls-per-peer", "20000", "from 1 to 16,384"),
    ("--grpc-max-telemetry-streams-per-peer", "-3", "from 1 to 1,000,000"),
    ("--listen-max-streams", "0", "from 1 to 1,000,000"),
    ("--listen-max-streams-per-host", "2000000", "from 1 to 1,000,000"),
])
def test_a_bad_bound_is_refused_saying_what_is_allowed(tmp_path, flag, value, allowed):
    r = CliRunner().invoke(main, ["serve", "--create", "--store", str(tmp_path / "s"),
                                  "--grpc", "127.0.0.1:0", "--listen", "127.0.0.1:0",
                                  flag, value])
    assert r.exit_code == 2, r.output
    assert f"({flag}) {value}; allowed: a whole number {allowed}" in r.output, r.output
    assert not (tmp_path / "s").exists()  # (refused before the store is made)


def test_a_bound_flag_without_its_face_is_refused(tmp_path):
    r = CliRunner().invoke(main, ["serve", "--create", "--store", str(tmp_path / "s"),
                                  "--listen", "127.0.0.1:0", "--grpc-max-held-calls", "10"])
    assert r.exit_code == 2 and "--grpc-max-held-calls needs --grpc" in r.output, r.output
    r = CliRunner().invoke(main, ["serve", "--create", "--store", str(tmp_path / "s"),
                                  "--grpc", "127.0.0.1:0", "--listen-max-streams", "10"])
    assert r.exit_code == 2 and "--listen-max-streams needs --listen" in r.output, r.output
    r = CliRunner().invoke(main, ["serve", "--create", "--store", str(tmp_path / "s"),
                                  "--grpc", "127.0.0.1:0", "--grpc-max-held-calls", "many"])
    assert r.exit_code == 2 and "'many' is not a valid integer" in r.output, r.output


def test_face_limits_are_checked_and_name_their_flags():
    assert set(FLAGS.values()) <= {o.opts[0] for o in main.commands["serve"].params}
    with pytest.raises(InvalidConfigError, match=r"grpc_held_calls_per_account "
                                                 r"\(--grpc-max-held-calls-per-account\) 0"):
        FaceLimits(grpc_held_calls_per_account=0)
    with pytest.raises(InvalidConfigError, match="allowed: a whole number"):
        FaceLimits(flight_streams=True)
    with pytest.raises(InvalidConfigError, match="allowed: a whole number"):
        FaceLimits(flight_streams=2.5)
