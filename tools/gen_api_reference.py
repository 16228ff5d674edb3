"""Write docs/api-reference.md from the code: every public name of ``store.__all__`` and the
public methods of the facade classes, with signatures and the docstrings' first paragraphs.

Run ``python tools/gen_api_reference.py`` after changing the public API;
``tests/test_api_reference.py`` fails while the file is out of date.
"""

from __future__ import annotations

import enum
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "api-reference.md")

HEADER = """# API reference

Generated from the code by `python tools/gen_api_reference.py` (a test fails when this file
is out of date). Every name of `store.__all__`, then the methods of the classes users hold:
`MessageStore` (and the read-only `StoreReader`), `Producer`, `TransactionProducer`, `Sink`,
`StoreGroup`, `GroupProducer` and `GroupSink`.
Prose and examples: the README, `docs/api.md`, `docs/sink.md` and `docs/options.md`.
"""


def _doc(obj) -> str:
    text = inspect.getdoc(obj) or ""
    paragraphs = text.split("\n\n")
    first = paragraphs[0].replace("\n", " ").strip()
    raises = ""
    for i, p in enumerate(paragraphs):
        if p.strip().startswith("Raises"):
            lines = [ln.strip() for ln in "\n\n".join(paragraphs[i:]).splitlines()[2:]
                     if ln.strip() and not ln.strip().startswith("---")]
            names = [ln for ln in lines if ln.endswith("Error") or ln.endswith("Error,")]
            if names:
                raises = " Raises: " + ", ".join(f"`{n.rstrip(',')}`" for n in names) + "."
            break
    return (first + raises).strip()


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _methods(cls) -> list[str]:
    out = []
    for name, member in sorted(vars_all(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            out.append(f"* `{cls.__name__}.{name}` (property): {_doc(member)}")
        elif callable(member):
            out.append(f"* `{cls.__name__}.{name}{_signature(member)}`: {_doc(member)}")
    return out


def vars_all(cls) -> dict:
    members: dict = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        members.update(vars(klass))
    return {k: v for k, v in members.items() if not k.startswith("_")}


def generate() -> str:
    sys.path.insert(0, ROOT)
    import store
    from store.produce.producer import Producer
    from store.sink.sink import Sink
    from store.produce.transaction_producer import TransactionProducer

    errors, classes, functions, values = [], [], [], []
    for name in sorted(store.__all__):
        obj = getattr(store, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            bases = ", ".join(b.__name__ for b in obj.__bases__)
            errors.append(f"* `{name}` ({bases}): {_doc(obj)}")
        elif inspect.isclass(obj):
            # enums and protocols: their signatures differ between Python versions
            plain = issubclass(obj, enum.Enum) or getattr(obj, "_is_protocol", False)
            sig = "" if plain else _signature(obj)
            classes.append(f"* `{name}{sig}`: {_doc(obj)}")
        elif callable(obj):
            functions.append(f"* `{name}{_signature(obj)}`: {_doc(obj)}")
        else:
            values.append(f"* `{name}`: {type(obj).__name__}")
    parts = [HEADER, "## Classes", *classes, "", "## Functions", *functions, "",
             "## Values", *values, "", "## Errors", "",
             "Every error is a `StoreError`; messages say what was wrong and what is allowed.",
             "", *errors, ""]
    for cls in (store.MessageStore, store.StoreReader, Producer, TransactionProducer, Sink,
                store.StoreGroup, store.GroupProducer, store.GroupSink):
        parts += [f"## `{cls.__name__}`", "", _doc(cls), "", *_methods(cls), ""]
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    with open(OUT, "w", encoding="utf-8") as fh:
        fh.write(generate())
    print(f"wrote {OUT}")
