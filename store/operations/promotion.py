"""``rmq promote --store DIR``: make a follower of a replica set its leader, by hand.

A **running** follower is promoted by its server, in place
(:mod:`store.replication.promote_request`: a request file the server answers at its next
step with :meth:`~store.replication.replica.Replica.become_leader`); it takes writes and
runs the services at once.  The rest of this docstring is about a **stopped** one.

A promotion starts a new term: the epoch after every one the replica knows, starting at its
CommitLog end, recorded in its epoch file (:mod:`store.files.epoch_file`) and in
``config/replication.json`` (``role`` ``leader``, ``promoted``).  It is refused
(:class:`~store.base.errors.ReplicaBehindError`) when the replica holds less than its leader had
acknowledged as far as it last heard (the leader's confirmed end its server recorded in
``config/serve.json``, written every second and when it stops), or when it never heard
from its leader; ``force=True`` promotes anyway and says how many bytes are given up.

A stopped replica: promote it, set the replica-set file's
``"leader"`` to this replica on every replica, and start the servers again.  A promoted
replica refuses to start with a file that names another leader, so that two replicas never
both take writes because of a file left unchanged.  The old leader, started with the new
file, follows the new one, cutting first the tail the new leader's history does not hold
(:mod:`store.replication.truncation`: set aside under ``config/truncated/``).

A replica of an **elected** set (one with a witness) is never promoted by hand, running or
stopped: its voters choose its leader (:mod:`store.replication.election`).
"""

from __future__ import annotations

import os

from ..base.errors import InvalidConfigError, StoreError
from ..facade.store_reader import StoreReader
from ..files.epoch_file import read_epochs, with_term, write_epochs
from ..files.replication_state import STATE_FILE, read_state, write_state
from ..replication.promote_request import refuse_if_behind, request_promotion
from ..replication.truncation import set_aside_service_progress
from ..schedule.schedule_book import recorded_book_files
from .server import server_status


def promote_replica(path: str | os.PathLike, *, force: bool = False,
                    timeout_s: float = 15.0) -> dict:
    """Make the follower at ``path`` the leader of a new term (see the module docstring):
    a stopped one here, a running one through its server (``timeout_s``: how long to wait
    for its answer).  Returns ``epoch``, ``start_offset`` (its CommitLog end), ``leader_end``
    (the old leader's end as last heard, ``None``: never), ``lost_bytes`` and ``forced``."""
    path = os.path.abspath(os.fspath(path))
    status = server_status(path) or {}
    if status.get("attached"):  # its server promotes it, in place
        return request_promotion(path, force=force, timeout_s=timeout_s,
                                 pid=status.get("pid"))
    state = read_state(path)
    if state is None:
        raise InvalidConfigError(f"{path} is no replica set's member (no {STATE_FILE}); "
                                 "allowed: a store served with --replica-set once")
    if state.get("elected"):
        raise StoreError(f"cannot promote {path}: its replica set elects its leader (it has a "
                         "witness); allowed: stop the leader, and the voters elect the replica "
                         "that holds every acknowledged message")
    if state.get("role") == "leader":
        raise StoreError(f"{path} leads its replica set already (epoch {state.get('epoch')})")
    with StoreReader.open(path) as reader:
        end = reader.confirmed_offset()
        book = recorded_book_files(reader)  # (taken from the log by the new leader)
    heard = status.get("replication") if isinstance(status.get("replication"), dict) else {}
    leader_end = heard.get("leader_end")
    lost = refuse_if_behind(path, state.get("leader"), end, leader_end, force)
    terms = read_epochs(path)
    epoch = max([int(state.get("epoch") or 1)] + [e for e, _ in terms]) + 1
    write_epochs(path, with_term(terms, epoch, end))
    set_aside_service_progress(path, f"promoted to leader in epoch {epoch}", book)
    state.update(role="leader", epoch=epoch, previous_leader=state.get("leader"),
                 leader=state.get("self"), promoted=True)
    write_state(path, state)
    return {"epoch": epoch, "start_offset": end, "leader_end": leader_end,
            "lost_bytes": lost, "forced": bool(force and (leader_end is None or lost))}
