"""The witness of a replica set (``rmq serve --witness --listen HOST:PORT --replica-set
FILE``): a voter that holds no data, so that two data replicas and it make the three voters
an election needs (:mod:`.election`).

It runs a :class:`~store.replication.election.Voter` on its Raft port and answers one
Flight action on ``--listen``: ``leader`` (who leads, as the replicated state says), for
clients that discover the leader through it; it asks for no token (it tells only a URL the
replica-set file lists).  When the replica set's leader is to be
chosen while the witness is the Raft leader, it asks the data replicas for their positions
over their Flight ports, with the replica set's credentials (``account`` / ``secret_file``)
or the server's token.
"""

from __future__ import annotations

import json
import logging
import threading

from ..base.errors import InvalidConfigError
from ..base.remote_address import RemoteAddress
from .election import Voter
from .replica import probe_replica
from .replica_set import ReplicaSet

log = logging.getLogger("store.replication.witness")


class Witness:
    """The witness of the replica set in file ``replica_set`` listening on ``listen``
    (``HOST:PORT``); ``token``: the servers' shared secret; ``state_dir``: where to keep its
    Raft journal (``None``: in memory)."""

    def __init__(self, replica_set: str, listen: str, *, token: str | None = None,
                 state_dir: str | None = None) -> None:
        from pyarrow import flight

        self.replica_set = members = ReplicaSet.read(replica_set)
        if members.witness is None:
            raise InvalidConfigError(f"the replica-set file {members.path} names no witness; "
                                     "allowed: \"witness\": the URL this server listens on")
        address = RemoteAddress.listen(listen)
        self.me = members.member(address, witness=True)
        if state_dir is None:
            log.warning("witness %s keeps its Raft term and vote in memory: restarted within "
                        "a term it could vote twice in it; give it --store DIR to keep them "
                        "on disk", self.me)
        credentials = ({"account": members.account, "secret_file": members.secret_file}
                       if members.account is not None else {"token": token})
        self.voter = Voter(members, self.me,
                           probe=lambda url: probe_replica(url, credentials),
                           journal_dir=state_dir)
        witness = self

        class _Flight(flight.FlightServerBase):
            def do_action(self, context, action):
                if action.type != "leader":
                    raise flight.FlightServerError(f"unknown action {action.type!r}; "
                                                   "allowed: 'leader' (a witness holds no data)")
                return [flight.Result(json.dumps(witness.leader_answer()).encode())]

        self._server = _Flight(address.location)
        self.url = RemoteAddress(address.host, self._server.port).url
        self._stop = threading.Event()

    def leader_answer(self) -> dict:
        raft = self.voter.raft
        return {"leader": raft.leader, "epoch": raft.epoch, "self": self.me, "leading": False,
                "witness": True}

    def status(self) -> dict:
        return {"self": self.me, **self.voter.status()}

    def start(self) -> Witness:
        """Start voting (in threads); :meth:`close` ends it."""
        self.voter.start()
        return self

    def close(self) -> None:
        """Stop voting and answering."""
        self.voter.stop()
        self._server.shutdown()

    def run(self, duration_s: float | None = None) -> None:
        """Vote until :meth:`stop` (or for ``duration_s`` seconds)."""
        self.start()
        try:
            self._stop.wait(duration_s)
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

