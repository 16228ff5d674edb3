"""The layers of the ``store`` package, as data: which module sits in which layer.

Imports only go down (a module may import modules of its own layer or of lower ones), type-only
imports included; ``tests/test_layers.py`` checks every import of ``store`` and ``rmq_source``
against this table, and that no import cycle exists at all.  A new module must be placed here.

=====  ==========  ============================================================================
layer  name        what
=====  ==========  ============================================================================
0      formats     errors, settings, record and file layouts, one class per on-disk structure
1      core        StoreCore: opening, locks, the Appender, the one dispatch path, reading,
                   Arrow decoding, recovery, retention; the port and hooks services use
2      services    delay levels, the timer wheel, transactions: they see only the port
3      facade      MessageStore, StoreReader, producers, stats: what users call
=====  ==========  ============================================================================

``rmq_source`` (the Spark data source) sits above all of them and may use only the names in
``store.__all__``.
"""

FORMATS, CORE, SERVICES, FACADE = 0, 1, 2, 3

#: Module name -> layer.  A package's ``__init__`` is listed under the package name.
LAYERS: dict[str, int] = {
    "store.abort_marker": FORMATS,
    "store.errors": FORMATS,
    "store.batch_encoding": FORMATS,
    "store.config": FORMATS,
    "store.crc": FORMATS,
    "store.jit": FORMATS,
    "store.codec": FORMATS,
    "store.message": FORMATS,
    "store.message_id": FORMATS,
    "store.fileio": FORMATS,
    "store.segment_bytes": FORMATS,
    "store.mapped_file": FORMATS,
    "store.commit_log": FORMATS,
    "store.consume_queue": FORMATS,
    "store.checkpoint": FORMATS,
    "store.topics": FORMATS,
    "store.broker_files": FORMATS,
    "store.arrow_properties": FORMATS,
    "store.record_gather": FORMATS,
    "store.layers": FORMATS,
    "store.layout": FORMATS,
    "store.group_layout": FORMATS,
    "store.sink_format": FORMATS,
    "store.record_kernels": FORMATS,
    "store.property_kernels": FORMATS,
    "store.property_join": FORMATS,
    "store.scan_kernels": FORMATS,
    "store.index_kernels": FORMATS,
    "store.timer": FORMATS,
    "store.timer.wheel": FORMATS,
    "store.timer.timer_log": FORMATS,
    "store.timer.checkpoint": FORMATS,
    "store.transaction": FORMATS,
    "store.transaction.half": FORMATS,
    "store.transaction.op": FORMATS,
    "store.core": CORE,
    "store.core.ports": CORE,
    "store.core.dispatch": CORE,
    "store.core.append_types": CORE,
    "store.core.appender": CORE,
    "store.core.record_writes": CORE,
    "store.core.reading": CORE,
    "store.core.record_checks": CORE,
    "store.core.verify": CORE,
    "store.core.arrow_decode": CORE,
    "store.core.message_columns": CORE,
    "store.core.recovery": CORE,
    "store.core.recovery_start": CORE,
    "store.core.flushing": CORE,
    "store.core.retention": CORE,
    "store.core.repair": CORE,
    "store.core.queue_healing": CORE,
    "store.core.integrity": CORE,
    "store.core.locking": CORE,
    "store.core.lock_lease": CORE,
    "store.core.placement_chain": CORE,
    "store.core.single_append": CORE,
    "store.core.pipeline": CORE,
    "store.core.store_core": CORE,
    "store.record_copies": SERVICES,
    "store.delayed": SERVICES,
    "store.delayed.routing": SERVICES,
    "store.delayed.restore": SERVICES,
    "store.delayed.schedule": SERVICES,
    "store.timer.recall": SERVICES,
    "store.timer.placement": SERVICES,
    "store.timer.firing": SERVICES,
    "store.timer.service": SERVICES,
    "store.timer.timer_queue": SERVICES,
    "store.transaction.half_records": SERVICES,
    "store.transaction.index": SERVICES,
    "store.transaction.snapshot": SERVICES,
    "store.transaction.check_views": SERVICES,
    "store.transaction.check_round": SERVICES,
    "store.transaction.check": SERVICES,
    "store.transaction.ending": SERVICES,
    "store.transaction.repair": SERVICES,
    "store.transaction.service": SERVICES,
    "store.table_producer": FACADE,
    "store.sink": FACADE,
    "store.sink_halves": FACADE,
    "store.table_rows": FACADE,
    "store.table_properties": FACADE,
    "store.table_queues": FACADE,
    "store.single_send": FACADE,
    "store.producer": FACADE,
    "store.transaction.producer": FACADE,
    "store.stats": FACADE,
    "store.reader": FACADE,
    "store.message_store": FACADE,
    "store.group": FACADE,
    "store.group_writers": FACADE,
    "store.group_routing": FACADE,
    "store.pending_view": FACADE,
    "store.server": FACADE,
    "store.check_rounds": FACADE,
    "store": FACADE,
}
