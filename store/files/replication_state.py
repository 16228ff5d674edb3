"""``config/replication.json``: a replica set's member, as its server last recorded it.

JSON, replaced atomically (temp file, fsync, ``os.replace``)::

    {"role": "leader" | "follower", "epoch": 3, "leader": "rmq://h1:7911",
     "self": "rmq://h2:7911", "replicas": [...], "min_insync_replicas": 2,
     "promoted": true, "high_watermark": 123456}

``high_watermark``: the CommitLog offset its readers saw below
(:mod:`store.replication.watermark`), recorded at most once a second when it moved; -1
before any is known.

Written by the server (:mod:`store.replication.replica`) at start, at each change of role
and when its high watermark moved; read by ``rmq stats`` and ``rmq promote`` for a stopped
store, and by every process that opens the directory for writing: a follower, and a leader
that requires ``min_insync_replicas`` above 1, take appends from their server's process only
(:func:`writer_refusal`). A file that cannot be read counts as none.
"""

from __future__ import annotations

import json
import os

from .fileio import atomic_write

STATE_FILE = os.path.join("config", "replication.json")


def read_state(root: str) -> dict | None:
    """The recorded state of the store at ``root`` (``None``: none, or unreadable)."""
    try:
        with open(os.path.join(root, STATE_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_state(root: str, state: dict) -> None:
    """Replace the recorded state of the store at ``root``."""
    atomic_write(os.path.join(root, STATE_FILE), json.dumps(state, sort_keys=True).encode())


def writer_refusal(root: str) -> str | None:
    """Why a process that is not the replica set's server may not append to the store at
    ``root`` (``None``: it may): a follower's log is a byte-for-byte copy of its leader's
    (an append of its own would make it diverge, and be cut when it next copies); a leader
    with ``min_insync_replicas`` above 1 acknowledges a write only once that many replicas
    hold it, and only the server can wait for them.  (The worker processes of the server's
own gRPC endpoint lift this refusal in the mode their server starts them in, and append
under the role it publishes: :mod:`store.proxy.worker_role`.)"""
    state = read_state(root) or {}
    if state.get("role") == "follower":
        return (f"{root} is a follower of a replica set (its leader: {state.get('leader')}): "
                "its CommitLog is a copy of the leader's, written by its server only; "
                "allowed: writes to the leader (a URL naming the replica set finds it)")
    insync = state.get("min_insync_replicas")
    if state.get("role") == "leader" and isinstance(insync, int) and insync > 1:
        return (f"{root} leads a replica set with min_insync_replicas={insync}: a write is "
                "acknowledged only once that many replicas hold it, which only its server "
                f"waits for; allowed: writes through the server ({state.get('self')})")
    return None
