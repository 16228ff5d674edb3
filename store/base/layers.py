"""The layers of the ``store`` package: a module's layer is its folder's, but for a few.

Imports only go down (a module may import modules of its own layer or of lower ones), type-only
imports included; ``tests/test_layers.py`` checks every import of ``store`` and ``rmq_source``
against :data:`LAYERS`, and that no import cycle exists at all.  A new folder must be placed
in :data:`FOLDERS`; a new module in a folder takes the folder's layer.

=====  ==========  ============================================================================
layer  name        folders
=====  ==========  ============================================================================
0      formats     ``formats/`` (bytes), ``files/`` (on-disk structures), ``kernels/``
                   (compiled loops); the root's errors, config, message
1      core        ``core/``: StoreCore: opening, locks, the Appender, the one dispatch path,
                   reading, Arrow decoding, recovery, retention; the port services use
2      services    ``delayed/``, ``timer/``, ``transaction/``, ``schedule/``: they see only
                   the port
3      facade      ``produce/``, ``sink/``, ``group/``, ``operations/``, ``remote/``,
                   ``proxy/``; the root's MessageStore and StoreReader: what users call
=====  ==========  ============================================================================

``rmq_source`` (the Spark data source) sits above all of them and may use only the names in
``store.__all__``.
"""

from __future__ import annotations

import os

FORMATS, CORE, SERVICES, FACADE = 0, 1, 2, 3

#: Folder (a subpackage of ``store``) -> layer of its modules.
FOLDERS: dict[str, int] = {
    "formats": FORMATS,
    "files": FORMATS,
    "kernels": FORMATS,
    "core": CORE,
    "delayed": SERVICES,
    "timer": SERVICES,
    "transaction": SERVICES,
    "schedule": SERVICES,
    "produce": FACADE,
    "sink": FACADE,
    "group": FACADE,
    "operations": FACADE,
    "remote": FACADE,
    "proxy": FACADE,
}

#: Modules whose layer is not their folder's: the root's, and the on-disk structures that a
#: service's folder keeps beside the service (as RocketMQ's ``store/timer/`` holds TimerWheel
#: and TimerLog), which lower layers read.
EXCEPTIONS: dict[str, int] = {
    "store": FACADE,
    "store.base.errors": FORMATS,
    "store.base.config": FORMATS,
    "store.formats.message": FORMATS,
    "store.base.layers": FORMATS,
    "store.message_store": FACADE,
    "store.reader": FACADE,
    "store.timer": FORMATS,
    "store.timer.wheel": FORMATS,
    "store.timer.timer_log": FORMATS,
    "store.timer.checkpoint": FORMATS,
    "store.transaction": FORMATS,
    "store.transaction.half": FORMATS,
    "store.transaction.op": FORMATS,
    "store.transaction.producer": FACADE,
    "store.sink.format": FORMATS,
    "store.files.group_file": FORMATS,
    "store.base.remote_address": FORMATS,
}


def layer_of(module: str) -> int:
    """The layer of ``module`` (a dotted name under ``store``); ``KeyError`` for a module of
    the root or of a folder not placed here."""
    if module in EXCEPTIONS:
        return EXCEPTIONS[module]
    parts = module.split(".")
    if len(parts) < 2 or (len(parts) == 2 and parts[1] not in FOLDERS):
        raise KeyError(f"{module}: a module of the root needs its layer in EXCEPTIONS")
    return FOLDERS[parts[1]]


def _modules() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for dirpath, _, files in os.walk(here):
        rel = os.path.relpath(dirpath, here)
        package = "store" if rel == "." else "store." + rel.replace(os.sep, ".")
        for name in files:
            if name.endswith(".py"):
                out.append(package if name == "__init__.py" else f"{package}.{name[:-3]}")
    return out


#: Module name -> layer, for every module of the package (a package's ``__init__`` under the
#: package name); a module no rule places is missing, which the layer test reports.
LAYERS: dict[str, int] = {}
for _module in _modules():
    try:
        LAYERS[_module] = layer_of(_module)
    except KeyError:
        pass
