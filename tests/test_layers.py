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
from store.base.layers import LAYERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("store", "rmq_source", "rmq_cli", "pyspark_rmq")


def _modules() -> dict[str, str]:
    """Module name -> file, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, name)
    return out


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def imports_of(module: str, source: str | None = None) -> list[tuple[str, int, list[str]]]:
    """``(imported module, line, names)`` for every import in ``module`` (project modules only)."""
    tree = ast.parse(source if source is not None else open(MODULES[module]).read())
    package = module if _is_package(module) else module.rpartition(".")[0]
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
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            if submodules:
                found.extend((s, node.lineno, []) for s in submodules)
                names = [n for n in names if f"{target}.{n}" not in MODULES]
                if not names:
                    continue
            found.append((target, node.lineno, names))
    return found


def layer_violations(graph: dict[str, list[tuple[str, int, list[str]]]]) -> list[str]:
    bad = []
    for module, edges in graph.items():
        if not module.startswith("store"):
            continue
        for target, line, _ in edges:
            if target.startswith("store") and LAYERS[target] > LAYERS[module]:
                bad.append(f"{module}:{line} (layer {LAYERS[module]}) imports {target} "
                           f"(layer {LAYERS[target]})")
    return bad


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
    services = {"transactions", "timer", "schedule", "appender", "dispatcher", "commit_log",
                "checkpoint", "topic_table"}
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
    "from ..message_store import MessageStore\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..timer.service import X\n",
    "def f():\n    from .. import message_store\n",
])
def test_a_planted_upward_import_is_caught(planted):
    graph = dict(GRAPH)
    graph["store.core.appender"] = imports_of("store.core.appender",
                                              open(MODULES["store.core.appender"]).read()
                                              + "\n" + planted)
    assert layer_violations(graph)
    assert find_cycle(graph) is not None or "timer.service" in planted


@pytest.mark.parametrize("planted", ["from store.core.reading import ReadableStore\n",
                                     "from store import codec\n",
                                     "from store import LAYERS\n"])
def test_a_planted_private_import_in_the_data_source_is_caught(planted):
    graph = dict(GRAPH)
    graph["rmq_source.queues"] = imports_of("rmq_source.queues", planted)
    assert public_api_violations(graph)
