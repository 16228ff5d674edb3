"""The shape of the code: imports go down the layers of ``store.base.layers``, and no cycle exists.

Every import is counted: module level, under ``TYPE_CHECKING``, and inside functions.  So a
type-only back edge or a function-local import cannot hide a cycle.  ``rmq_source`` may use
only ``from store import NAME`` with ``NAME`` in ``store.__all__``.
"""

from __future__ import annotations

import ast
import os

import pytest

import store
from store.base.layers import LAYERS, folder_of, layer_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("store", "rmq_source", "rmq_cli", "pyspark_rmq")


def _modules(root: str = ROOT) -> dict[str, str]:
    """Module name -> file, for every module of the project's packages under ``root``."""
    out = {}
    for package in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, name)
    return out


MODULES = _modules()


def _is_package(module: str, modules: dict[str, str] = MODULES) -> bool:
    return modules[module].endswith("__init__.py")


def imports_of(module: str, source: str | None = None,
               modules: dict[str, str] = MODULES) -> list[tuple[str, int, list[str]]]:
    """``(imported module, line, names)`` for every import in ``module`` (project modules only)."""
    tree = ast.parse(source if source is not None else open(modules[module]).read())
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    found.append((alias.name, node.lineno, []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] not in PACKAGES:
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if submodules:
                found.extend((s, node.lineno, []) for s in submodules)
                names = [n for n in names if f"{target}.{n}" not in modules]
                if not names:
                    continue
            found.append((target, node.lineno, names))
    return found


def layer_violations(graph: dict[str, list[tuple[str, int, list[str]]]],
                     layers: dict[str, int] = LAYERS) -> list[str]:
    """Every import of a ``store`` module that goes up a floor, or sideways into another
    folder of its own floor."""
    bad = []
    for module, edges in graph.items():
        if not module.startswith("store"):
            continue
        for target, line, _ in edges:
            if not target.startswith("store"):
                continue
            up = layers[target] > layers[module]
            beside = (layers[target] == layers[module]
                      and folder_of(target) != folder_of(module))
            if up or beside:
                bad.append(f"{module}:{line} (floor {layers[module]}) imports {target} "
                           f"(floor {layers[target]}{', beside it' if beside else ''})")
    return bad


def check_tree(root: str) -> tuple[list[str], list[str]]:
    """The layer check of the tree under ``root`` from scratch (its files, read afresh):
    ``(modules no floor places, import violations)``."""
    modules = _modules(root)
    layers, unplaced = {}, []
    for m in modules:
        if m.startswith("store"):
            try:
                layers[m] = layer_of(m)
            except KeyError:
                unplaced.append(m)
    graph = {m: imports_of(m, modules=modules) for m in modules if m not in unplaced}
    return unplaced, layer_violations(graph, layers)


def find_cycle(graph: dict[str, list[tuple[str, int, list[str]]]]) -> list[str] | None:
    """One import cycle of the graph, or ``None`` (package ``__init__`` edges excluded)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target, _, _ in graph.get(node, ()):
            if target == node or (target in MODULES and _is_package(target)
                                  and node.startswith(target + ".")):
                continue  # a module importing its own package's names
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_store_module_has_a_layer():
    missing = sorted(m for m in MODULES if m.startswith("store") and m not in LAYERS)
    stale = sorted(m for m in LAYERS if m not in MODULES)
    assert not missing, f"place these modules in store/layers.py: {missing}"
    assert not stale, f"store/layers.py names modules that do not exist: {stale}"


def test_store_imports_only_go_down():
    assert layer_violations(GRAPH) == []


def test_no_import_cycle_counting_type_only_and_function_local_imports():
    assert find_cycle(GRAPH) is None


def public_api_violations(graph) -> list[str]:
    bad = []
    for module, edges in graph.items():
        if module.startswith("store"):
            continue
        for target, line, names in edges:
            if target.startswith("store") and (target != "store"
                                               or set(names) - set(store.__all__)):
                bad.append(f"{module}:{line} imports {target} {names}")
    return bad


def test_rmq_source_uses_only_the_public_names_of_store():
    assert public_api_violations(GRAPH) == []


def test_rmq_source_calls_no_private_or_service_member_of_a_store():
    """No ``store._x``, ``store.transactions``, ``store.timer`` ... in the data source."""
    services = {"transactions", "timer", "schedule", "delay_levels", "appender", "dispatcher",
                "commit_log", "checkpoint", "topic_table"}
    bad = []
    for module in (m for m in MODULES if not m.startswith("store")):
        for node in ast.walk(ast.parse(open(MODULES[module]).read())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ("store", "s", "reader")
                    and (node.attr.startswith("_") or node.attr in services)):
                bad.append(f"{module}:{node.lineno} uses store.{node.attr}")
    assert bad == []


# -- the checks can fail ---------------------------------------------------------------------
@pytest.mark.parametrize("planted", [
    "from ..facade.message_store import MessageStore\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..timer.timer_service import X\n",
    "def f():\n    from ..facade import message_store\n",
])
def test_a_planted_upward_import_is_caught(planted):
    graph = dict(GRAPH)
    graph["store.core.appender"] = imports_of("store.core.appender",
                                              open(MODULES["store.core.appender"]).read()
                                              + "\n" + planted)
    assert layer_violations(graph)
    assert find_cycle(graph) is not None or "timer_service" in planted


@pytest.mark.parametrize("planted", ["from store.core.reading import ReadableStore\n",
                                     "from store import codec\n",
                                     "from store import LAYERS\n"])
def test_a_planted_private_import_in_the_data_source_is_caught(planted):
    graph = dict(GRAPH)
    graph["rmq_source.queues"] = imports_of("rmq_source.queues", planted)
    assert public_api_violations(graph)


# -- a planted module in a copy of the tree: the whole check, from the files ---------------------
def _copy_of_the_tree(tmp_path) -> str:
    import shutil

    for package in PACKAGES:
        shutil.copytree(os.path.join(ROOT, package), os.path.join(tmp_path, package),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return str(tmp_path)


def test_the_tree_as_it_is_passes_the_whole_check(tmp_path):
    assert check_tree(_copy_of_the_tree(tmp_path)) == ([], [])


@pytest.mark.parametrize("path, source, caught", [
    # up: the files floor imports the facade
    ("store/files/planted.py", "from ..facade.message_store import MessageStore\n",
     "store.files.planted:1 (floor 3) imports store.facade.message_store (floor 9)"),
    # up, inside a function and under a type-only guard
    ("store/formats/planted.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..core.store_core import X\n"
     "def f():\n    from ..kernels import record_assembly\n",
     "store.formats.planted:3 (floor 1) imports store.core.store_core (floor 4)"),
    # beside: the timer imports the recurring schedules on its own floor
    ("store/timer/planted.py", "from ..schedule.schedule_book import ScheduleBook\n",
     "store.timer.planted:1 (floor 6) imports store.schedule.schedule_book (floor 6, beside it)"),
    # absolute import up
    ("store/base/planted.py", "import store.files.commit_log\n",
     "store.base.planted:1 (floor 0) imports store.files.commit_log (floor 3)"),
])
def test_a_planted_upward_module_is_caught_by_the_whole_check(tmp_path, path, source, caught):
    root = _copy_of_the_tree(tmp_path)
    with open(os.path.join(root, path), "w") as f:
        f.write(source)
    unplaced, bad = check_tree(root)
    assert unplaced == []
    assert caught in bad


def test_a_planted_module_of_the_root_has_no_floor(tmp_path):
    root = _copy_of_the_tree(tmp_path)
    with open(os.path.join(root, "store", "planted.py"), "w") as f:
        f.write("from .base.errors import StoreError\n")
    assert check_tree(root)[0] == ["store.planted"]
