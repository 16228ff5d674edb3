"""Transactional messages: half messages, op messages and the check loop.

Modules:

* :mod:`~store.transaction.half`: the half record (RMQ_SYS_TRANS_HALF_TOPIC) and the records
  derived from it (put-back copy, discard copy, commit record);
* :mod:`~store.transaction.op`: op messages (RMQ_SYS_TRANS_OP_HALF_TOPIC, tag ``d``);
* :mod:`~store.transaction.index`: transaction id -> halves and outcome, read from the queues;
* :mod:`~store.transaction.snapshot`: ``config/transactionIndex.npz``;
* :mod:`~store.transaction.check`: one check round;
* :mod:`~store.transaction.repair`: op messages a reboot tore off their commit records;
* :mod:`~store.transaction.service`: :class:`TransactionService` (end, check, progress);
* :mod:`~store.transaction.producer`: :class:`TransactionProducer` (send_in_transaction).
"""
