"""The floors of the ``store`` package: every module's floor is its folder's.

A module may import its own folder and the folders on lower floors, never a folder above it
nor a folder beside it on its own floor; type-only and function-local imports count as well.
``tests/test_layers.py`` checks every import of ``store`` and ``rmq_source`` against
:data:`LAYERS`, and that no import cycle exists at all.  A new module goes into a folder and
takes its floor; a new folder must be placed in :data:`FLOORS`.  The root holds one module,
the package's face (``store/__init__.py``: what users import), above every floor.

=====  ==================================  ====================================================
floor  folders                             what lives there
=====  ==================================  ====================================================
0      ``base/``                           typed errors, settings, this table, the JIT
                                           machinery, CRC32, the addresses of served stores
1      ``formats/``                        bytes, no file opened: the record codec, binary
                                           layouts, message ids, byte columns, batch
                                           encoding, Arrow properties; the message vocabulary
2      ``kernels/``                        the compiled loops over whole batches
3      ``files/``                          what opens files: one module per on-disk structure
4      ``core/``                           StoreCore: locks, the append, the one dispatch
                                           path, reading, recovery, retention; the port
5      ``delayed/``                        what the delay levels and the timer share, and the
                                           delay levels
6      ``timer/``, ``schedule/``,          the timer wheel, recurring schedules,
       ``transaction/``                    transactional messages (each beside the others)
7      ``produce/``                        producers: single sends, tables, transactions
8      ``sink/``                           the exactly-once sink
9      ``facade/``                         MessageStore and StoreReader: what users open
10     ``remote/``, ``proxy/``             the Arrow Flight face and the gRPC face
11     ``replication/``                    replica sets: the follower, the election, the
                                           witness
12     ``group/``, ``operations/``         store groups; the server and the warm-up
=====  ==================================  ====================================================

``rmq_source`` (the Spark data source) sits above all of them and may use only the names in
``store.__all__``.
"""

from __future__ import annotations

import os

#: The folders (subpackages of ``store``), bottom floor first; folders on one floor stand
#: side by side and do not import each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("base",),
    ("formats",),
    ("kernels",),
    ("files",),
    ("core",),
    ("delayed",),
    ("timer", "schedule", "transaction"),
    ("produce",),
    ("sink",),
    ("facade",),
    ("remote", "proxy"),
    ("replication",),
    ("group", "operations"),
)

#: Folder -> its floor.
FOLDERS: dict[str, int] = {folder: floor for floor, folders in enumerate(FLOORS)
                           for folder in folders}

#: The floor of the root's one module, the package face ``store``: above every folder.
TOP = len(FLOORS)


def folder_of(module: str) -> str:
    """The folder of ``module`` (a dotted name under ``store``); ``""`` for the package face;
    ``KeyError`` for a module of the root or of a folder not placed in :data:`FLOORS`."""
    parts = module.split(".")
    if parts == ["store"]:
        return ""
    if len(parts) < 2 or parts[1] not in FOLDERS:
        raise KeyError(f"{module}: a module of the root or of a folder not in FLOORS "
                       "(put it in a folder; place a new folder in FLOORS)")
    return parts[1]


def layer_of(module: str) -> int:
    """The floor of ``module`` (a dotted name under ``store``), by :func:`folder_of`."""
    folder = folder_of(module)
    return TOP if folder == "" else FOLDERS[folder]


def _modules() -> list[str]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for dirpath, _, files in os.walk(here):
        rel = os.path.relpath(dirpath, here)
        package = "store" if rel == "." else "store." + rel.replace(os.sep, ".")
        for name in files:
            if name.endswith(".py"):
                out.append(package if name == "__init__.py" else f"{package}.{name[:-3]}")
    return out


#: Module name -> floor, for every module of the package (a package's ``__init__`` under the
#: package name); a module no rule places is missing, which the layer test reports.
LAYERS: dict[str, int] = {}
for _module in _modules():
    try:
        LAYERS[_module] = layer_of(_module)
    except KeyError:
        pass
