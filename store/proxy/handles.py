"""Handles the gRPC endpoint gives clients, signed so that they cannot be made up.

A client gets two kinds of handle back and later hands them in: a **recall handle** (a delay
message's topic, id, place in the timer queue and member) and a **receipt handle** (one
hand-out of a message to a consumer group).  Both carry an HMAC-SHA256 tag, cut to
:data:`TAG_BYTES`, made with a secret of the store (:func:`store_secret`), over the handle's
text and what it is bound to:

* a recall handle, over its text: knowing a message id is not enough to cancel it;
* a receipt handle, over its text, the account (access key), the consumer group and the
  topic: another account cannot ack or move what was handed to this one, and a handle of
  one group cannot be spent on another.

The secret is kept in ``config/rmq_handle_secret`` (32 random bytes, made on first use,
owner-readable only), so that a handle stays good across a restart of the server (a delay
message's recall handle may be used hours later).  Deleting the file invalidates every
handle given so far.
"""

from __future__ import annotations

import hmac
import os
import secrets

from ..files.fileio import atomic_write

#: The longest recall or receipt handle read (what this server gives is far shorter).
HANDLE_MAX_LENGTH = 512

SECRET_FILE = os.path.join("config", "rmq_handle_secret")
SECRET_BYTES = 32
#: Bytes of the HMAC-SHA256 tag a handle carries (128 bits: not guessable).
TAG_BYTES = 16


def store_secret(root: str) -> bytes:
    """The store's handle secret, made (atomically, mode 0600) when missing."""
    path = os.path.join(root, SECRET_FILE)
    try:
        with open(path, "rb") as fh:
            secret = fh.read()
        if len(secret) == SECRET_BYTES:
            return secret
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    secret = secrets.token_bytes(SECRET_BYTES)

    def write(fh) -> None:
        os.fchmod(fh.fileno(), 0o600)  # before a byte of the secret is in it
        fh.write(secret)

    atomic_write(path, write)
    with open(path, "rb") as fh:  # a concurrent maker's secret, if it won the race
        return fh.read()


class Signer:
    """Makes and checks the tags of handles with one secret."""

    def __init__(self, secret: bytes) -> None:
        self._key = secret

    def tag(self, *parts: str) -> str:
        """The hex tag of ``parts`` (joined with NUL, which no part may hold)."""
        text = "\0".join(parts).encode("utf-8", "surrogatepass")
        return hmac.digest(self._key, text, "sha256").hex()[:2 * TAG_BYTES]

    def valid(self, tag: str, *parts: str) -> bool:
        return hmac.compare_digest(self.tag(*parts), tag)
