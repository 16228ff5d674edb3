"""The bounds of what clients can make a served store hold, as one setting of ``rmq serve``.

Each network face bounds what one client, and all of them, can make it hold
(:mod:`store.proxy.grpc_limits` for ``--grpc``, :mod:`store.remote.flight_limits` for
``--listen``; docs/operations.md, "Bounds").  The defaults suit a server with thousands of
clients; a deployment with more (or many clients behind one NAT address, which share the
bounds per address) raises them here.  :class:`FaceLimits` holds them, checked once, and
hands each face its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..base.errors import InvalidConfigError
from ..proxy import grpc_limits
from ..remote.flight_limits import MAX_STREAMS, MAX_STREAMS_PER_CLIENT, StreamLimits

#: The most held calls in all: each holds a thread of the gRPC endpoint while it waits.
HELD_CALLS_MOST = 16_384
#: The most of any other bound (each open stream costs memory: tens of KiB).
BOUND_MOST = 1_000_000

#: Each bound's ``rmq serve`` flag.
FLAGS = {
    "grpc_held_calls": "--grpc-max-held-calls",
    "grpc_held_calls_per_client": "--grpc-max-held-calls-per-client",
    "grpc_held_calls_per_peer": "--grpc-max-held-calls-per-peer",
    "grpc_held_calls_per_account": "--grpc-max-held-calls-per-account",
    "grpc_telemetry_streams": "--grpc-max-telemetry-streams",
    "grpc_telemetry_streams_per_peer": "--grpc-max-telemetry-streams-per-peer",
    "flight_streams": "--listen-max-streams",
    "flight_streams_per_host": "--listen-max-streams-per-host",
}


@dataclass(frozen=True, slots=True)
class FaceLimits:
    """The bounds of the gRPC face (``grpc_*``) and of the Flight face (``flight_*``).

    Parameters
    ----------
    grpc_held_calls : int
        Long-polling receives held at once in all (each holds a thread; at most
        :data:`HELD_CALLS_MOST`).
    grpc_held_calls_per_client, grpc_held_calls_per_peer, grpc_held_calls_per_account : int
        ... per client id, per peer address, per account (each at most
        :data:`HELD_CALLS_MOST`; the bound in all holds whatever they allow).
    grpc_telemetry_streams, grpc_telemetry_streams_per_peer : int
        Telemetry streams (client sessions) open at once in all, and per peer address.
    flight_streams, flight_streams_per_host : int
        Flight table and read streams in progress at once in all, and per client host.

    Raises
    ------
    InvalidConfigError
        A bound that is not a whole number from 1 to its most; the message names the
        bound, its flag and what is allowed.
    """

    grpc_held_calls: int = grpc_limits.MAX_HELD_CALLS
    grpc_held_calls_per_client: int = grpc_limits.MAX_HELD_CALLS_PER_CLIENT
    grpc_held_calls_per_peer: int = grpc_limits.MAX_HELD_CALLS_PER_PEER
    grpc_held_calls_per_account: int = grpc_limits.MAX_HELD_CALLS_PER_ACCOUNT
    grpc_telemetry_streams: int = grpc_limits.MAX_TELEMETRY_STREAMS
    grpc_telemetry_streams_per_peer: int = grpc_limits.MAX_TELEMETRY_STREAMS_PER_PEER
    flight_streams: int = MAX_STREAMS
    flight_streams_per_host: int = MAX_STREAMS_PER_CLIENT

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            most = HELD_CALLS_MOST if f.name.startswith("grpc_held_calls") else BOUND_MOST
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise InvalidConfigError(f"{f.name} ({FLAGS[f.name]}) {value!r}; allowed: a "
                                         f"whole number from 1 to {most:,}")

    def grpc_options(self) -> dict[str, int]:
        """The bounds as :class:`~store.proxy.GrpcEndpoint` arguments."""
        return {"max_held_calls": self.grpc_held_calls,
                "max_held_calls_per_client": self.grpc_held_calls_per_client,
                "max_held_calls_per_peer": self.grpc_held_calls_per_peer,
                "max_held_calls_per_account": self.grpc_held_calls_per_account,
                "max_telemetry_streams": self.grpc_telemetry_streams,
                "max_telemetry_streams_per_peer": self.grpc_telemetry_streams_per_peer}

    def flight_stream_limits(self) -> StreamLimits:
        """The Flight face's :class:`~store.remote.flight_limits.StreamLimits`."""
        return StreamLimits(per_client=self.flight_streams_per_host, in_all=self.flight_streams)
