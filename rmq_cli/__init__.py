"""The ``rmq`` command line (``stats``, ``send``, ``tail``, ``demo``) and the demo pipeline.

Kept apart from :mod:`rmq_source`, the Spark data source: the command line uses only the
store's public API (``store.__all__``), and the demo reads and writes the store through Spark's
``format("rmq")`` like any user pipeline.
"""
