"""The Flight face's answers to a replica set's followers: the ``replicate`` ticket of a
``DoGet`` and the ``replicate`` stream kept open on a ``DoExchange``
(:data:`~store.remote.replication_stream.EXCHANGE_OP`), both checked against the replica's
role and terms before the log is read, then sent in chunks of whole records
(:mod:`store.remote.replication_stream`: the requests, the follower's reports and the chunks).

:class:`ReplicationCalls` is a part of :class:`~store.remote.flight_service.StoreService`
(a mixin: it uses the service's replica, reader pool, stream bounds and reading streams);
the service's ``DoGet`` and ``DoExchange`` dispatch their replication ops to it.
"""

from __future__ import annotations

from .replication_stream import (
    CHUNK_SCHEMA,
    END_OF_ANSWER,
    answer,
    exchange_requests,
    first_chunk,
    parse_request,
)
from .rights import caller_of, require_replication


class ReplicationCalls:
    """The followers' calls of :class:`~store.remote.flight_service.StoreService`."""

    def _replicate(self, context, body: dict):
        """The CommitLog from a follower's end (:mod:`store.remote.replication_stream`): whole
        records, checked against the follower's tail first, waiting for appends."""
        require_replication(caller_of(context), "replicate")
        return self._reading_stream(context, "replicate", CHUNK_SCHEMA,
                                    *self._replication_answer(context, parse_request(body)))

    def _replicate_exchange(self, context, body: dict, reader, writer) -> None:
        """``replicate`` requests on one ``DoExchange`` (:data:`EXCHANGE_OP`): each report
        the follower writes is answered as a ``replicate`` ticket is, then an empty batch
        ends the answer; the stream ends with the server's shutdown or the follower."""
        require_replication(caller_of(context), "replicate")
        with self._stream(context, "replicate"):
            writer.begin(CHUNK_SCHEMA)
            for request in exchange_requests(reader, body):
                first_of, rest = self._replication_answer(context, request)
                with self._readers.reader() as log:
                    for batch in rest(log, first_of(log)):
                        writer.write_batch(batch)
                writer.write_batch(END_OF_ANSWER)
                if self._closing.is_set():
                    return

    def _replication_answer(self, context, request: dict):
        """``(first_of, rest)`` of one checked ``replicate`` request, as
        :meth:`_reading_stream` takes them."""
        signal, checked, replica, marks = None, (lambda: None), self.replica, None
        bound, stopping = (lambda: None), self._closing.is_set
        if replica is not None:
            replica.check_source("replicate")  # (only a leader's log is copied)
            epoch = replica.epoch if request["epoch"] is None else request["epoch"]
            replica.check_term("replicate", epoch)
            signal, marks = replica.append_signal, replica.answer_marks

            def bound() -> int | None:  # (a term begun since: its bytes wait for its terms)
                return replica.term_bound(epoch)

            def stopping() -> bool:
                return self._closing.is_set() or bound() is not None

            def checked() -> None:  # (its log is a prefix of ours: its end counts)
                replica.follower_asked(context.peer(), request["from"], request["replica"])

        return (lambda r: first_chunk(r, request, stopping, signal, checked, marks, bound),
                lambda r, first: answer(r, request, first, marks, bound))
