"""Transactional messages: half messages, op messages and the check loop.

Modules:

* :mod:`~store.transaction.half`: the half record (RMQ_SYS_TRANS_HALF_TOPIC) and the records
  derived from it (put-back copy, discard copy, commit record);
* :mod:`~store.transaction.op`: op messages (RMQ_SYS_TRANS_OP_HALF_TOPIC, tag ``d``);
* :mod:`~store.transaction.transaction_index`: transaction id -> halves and outcome, read
  from the queues;
* :mod:`~store.transaction.snapshot`: ``config/transactionIndex.npz``;
* :mod:`~store.transaction.check_loop`: one check round (:mod:`~store.transaction.check_chunks`:
  its bookkeeping as columns; :mod:`~store.transaction.check_views`: what it asks about);
* :mod:`~store.transaction.published_checks`: the rounds a server publishes for resolvers
  elsewhere;
* :mod:`~store.transaction.commit_repair`: op messages a reboot tore off their commit records;
* :mod:`~store.transaction.transaction_service`: :class:`TransactionService` (end, check,
  progress).

The producer of half messages is :mod:`store.produce.transaction_producer` (a producer, on
the floor above).
"""
