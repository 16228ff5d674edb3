"""Op messages: the marks that end a transaction (``RMQ_SYS_TRANS_OP_HALF_TOPIC``).

An op message is a CommitLog record (layout: :mod:`store.formats.record_codec`) in the op topic, queue 0
(the half message's queue id), tag ``d``, SYSFLAG 0.  Its body lists the half queue offsets it
ends in RocketMQ 5.1+'s form, each followed by a comma::

    17,18,21,

(4.x wrote one offset without the comma, ``17``; readers accept both).  Readers split on
``,``, ignore empty or non-numeric pieces and every op whose tag is not ``d``.  The store
writes an op in the same append as the commit record(s) it goes with, so both land or
neither does; a body holds at most :data:`OP_BODY_MAX_CHARS` characters (RocketMQ's
``transactionOpMsgMaxSize``), longer lists become several op messages.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..formats.record_codec import RecordSpec
from ..formats.message import PROPERTY_TAGS, TRANS_OP_HALF_TOPIC, java_string_hash

REMOVE_TAG = "d"
#: tagsCode of an op message (Java hash of "d"); lets readers filter on ConsumeQueue entries.
REMOVE_TAG_CODE = java_string_hash(REMOVE_TAG)
OP_BODY_MAX_CHARS = 4096
_COMMA = ord(",")


def encode_op_bodies(offsets: Iterable[int]) -> list[bytes]:
    """Bodies (``"17,18,"``) for ``offsets``, each at most :data:`OP_BODY_MAX_CHARS` long."""
    bodies: list[bytes] = []
    parts: list[str] = []
    size = 0
    for off in offsets:
        piece = f"{int(off)},"
        if parts and size + len(piece) > OP_BODY_MAX_CHARS:
            bodies.append("".join(parts).encode("ascii"))
            parts, size = [], 0
        parts.append(piece)
        size += len(piece)
    if parts:
        bodies.append("".join(parts).encode("ascii"))
    return bodies


def op_specs(offsets: Iterable[int], born_ms: int, queue_id: int = 0) -> list[RecordSpec]:
    """Op records ending the half messages at ``offsets`` of half queue ``queue_id``."""
    return [RecordSpec(topic=TRANS_OP_HALF_TOPIC, body=body, properties={PROPERTY_TAGS: REMOVE_TAG},
                       queue_id=queue_id, born_timestamp_ms=born_ms)
            for body in encode_op_bodies(offsets)]


def parse_op_bodies(data: np.ndarray, starts: np.ndarray,
                    lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse many op bodies at once (vectorised).

    Parameters
    ----------
    data : numpy.ndarray of uint8
        Bytes holding the bodies.
    starts, lengths : numpy.ndarray of int64
        Where each body is in ``data``.

    Returns
    -------
    (offsets, owner) : tuple of numpy.ndarray of int64
        Every half offset named, in order, and the index of the body naming it.
    """
    n = len(starts)
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    # body bytes side by side, each followed by one comma (so "17" and "17," both parse)
    out_starts = np.concatenate(([0], np.cumsum(lengths + 1)[:-1]))
    buf = np.full(total + n, _COMMA, dtype=np.uint8)
    if total:
        within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        buf[np.repeat(out_starts, lengths) + within] = data[np.repeat(starts, lengths) + within]
    is_comma = buf == _COMMA
    commas = np.flatnonzero(is_comma)
    token_start = np.concatenate(([0], commas[:-1] + 1))
    token_len = commas - token_start
    keep = token_len > 0
    # a token is a number when it is all digits and not absurdly long
    is_digit = (buf >= 48) & (buf <= 57)
    bad = np.add.reduceat((~is_digit & ~is_comma).astype(np.int64), token_start[keep]) \
        if keep.any() else np.empty(0, np.int64)
    token_start, token_len = token_start[keep], token_len[keep]
    good = (bad == 0) & (token_len <= 18)
    token_start, token_len = token_start[good], token_len[good]
    if len(token_start) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    # value = sum of digit * 10**(position from the token's end)
    width = int(token_len.max())
    idx = token_start[:, None] + np.arange(width)[None, :]
    valid = np.arange(width)[None, :] < token_len[:, None]
    digits = np.where(valid, buf[np.minimum(idx, len(buf) - 1)].astype(np.int64) - 48, 0)
    power = np.where(valid, token_len[:, None] - 1 - np.arange(width)[None, :], 0)
    values = (digits * (10 ** power)).sum(axis=1)
    owner = np.searchsorted(out_starts, token_start, side="right") - 1
    return values.astype(np.int64), owner.astype(np.int64)


def parse_op_body(body: bytes) -> list[int]:
    """The half offsets one op body names (``b"5"`` and ``b"5,6,"`` both work)."""
    arr = np.frombuffer(body, dtype=np.uint8)
    values, _ = parse_op_bodies(arr, np.array([0]), np.array([len(arr)]))
    return values.tolist()
