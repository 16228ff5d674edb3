"""``rmq promote`` on a running follower: a request file its server answers.

The operator's command and the server share only the store directory (as ``rmq promote``
runs on the replica's host), so the request travels as a file, with no credentials or
network involved:

* ``config/promote.request``, JSON ``{"id": "<random hex>", "force": false}``, written
  atomically by :func:`request_promotion`;
* the server looks for it at each step (one ``stat``), removes it, calls
  :meth:`~store.replication.replica.Replica.become_leader` and writes
  ``config/promote.answer``: ``{"id": ..., "result": {...}}`` or
  ``{"id": ..., "error": {"type": "ReplicaBehindError", "message": ...}}``
  (:func:`serve_promotion_request`);
* :func:`request_promotion` waits for the answer with its id, and returns the result or
  raises the error's class.

A request left by a command that gave up is answered all the same when the server next
looks (a promotion is what was asked); an answer is for the request with its id only.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time

from ..base import errors as store_errors
from ..base.errors import ReplicaBehindError, StoreError
from ..files.fileio import atomic_write

log = logging.getLogger("store.replication")

REQUEST_FILE = os.path.join("config", "promote.request")
ANSWER_FILE = os.path.join("config", "promote.answer")


def refuse_if_behind(who: str, leader, end: int, leader_end, force: bool) -> int | None:
    """The bytes a promotion gives up (``None``: unknown, never heard from ``leader``); raise :class:`~store.base.errors.ReplicaBehindError` unless ``force`` when the replica
    ``who`` (holding the CommitLog up to ``end``) never heard from ``leader`` (``leader_end``
    ``None``) or holds less than the end ``leader`` had confirmed (``leader_end``)."""
    lost = None if leader_end is None else max(0, int(leader_end) - end)
    if force or (leader_end is not None and not lost):
        return lost
    why = (f"it never heard from its leader {leader}" if leader_end is None
           else f"it holds the CommitLog up to {end}, its leader {leader} had confirmed up "
                f"to {leader_end} ({lost} bytes would be lost)")
    raise ReplicaBehindError(
        f"cannot promote {who}: {why}; allowed: a follower that holds everything its leader "
        "acknowledged, or force=True (rmq promote --force) to give the rest up")


def request_promotion(root: str, *, force: bool = False, timeout_s: float = 15.0,
                      pid=None) -> dict:
    """Ask the server of the running follower at ``root`` to become leader (see the module
    docstring); returns :meth:`~store.replication.replica.Replica.become_leader`'s result."""
    ident = secrets.token_hex(8)
    atomic_write(os.path.join(root, REQUEST_FILE),
                 json.dumps({"id": ident, "force": bool(force)}).encode())
    deadline = time.monotonic() + timeout_s
    answer_path = os.path.join(root, ANSWER_FILE)
    while time.monotonic() < deadline:
        try:
            with open(answer_path, encoding="utf-8") as fh:
                answer = json.load(fh)
        except (OSError, ValueError):
            answer = None
        if isinstance(answer, dict) and answer.get("id") == ident:
            if "error" in answer:
                error = answer["error"]
                kind = getattr(store_errors, str(error.get("type")), None)
                kind = kind if isinstance(kind, type) and issubclass(kind, StoreError) \
                    else StoreError
                raise kind(str(error.get("message")))
            return answer["result"]
        time.sleep(0.02)
    raise StoreError(f"a server runs for {root} (pid {pid}) but did not answer the promotion "
                     f"request within {timeout_s:g} s; allowed: a running server that "
                     "serves a replica set (its request stays and is answered when it looks)")


def serve_promotion_request(replica) -> bool:
    """Answer a waiting ``config/promote.request`` of ``replica``'s store, if there is one
    (the server calls this at each step); returns whether there was one."""
    root = replica.store.root
    path = os.path.join(root, REQUEST_FILE)
    if not os.path.exists(path):
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            request = json.load(fh)
        os.remove(path)
    except (OSError, ValueError):
        return False
    if not isinstance(request, dict):
        return False
    answer: dict = {"id": request.get("id")}
    try:
        answer["result"] = replica.become_leader(force=bool(request.get("force")))
        log.warning("promoted by request: leader in epoch %d from CommitLog offset %d",
                    answer["result"]["epoch"], answer["result"]["start_offset"])
    except StoreError as exc:
        answer["error"] = {"type": type(exc).__name__, "message": str(exc)}
    atomic_write(os.path.join(root, ANSWER_FILE), json.dumps(answer).encode())
    return True
