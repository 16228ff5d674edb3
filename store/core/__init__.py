"""The store's core (``core/``): the CommitLog append path, derived-data dispatch, reading,
recovery and retention.

The core knows the on-disk formats and files (the floors below) and nothing of the services
built on it (delay levels, the timer wheel, transactions): they register themselves through
the hooks of :class:`store.core.ports.StorePort` (a tagsCode rule and queue count per system
topic, retention listeners, recovery listeners).
"""
