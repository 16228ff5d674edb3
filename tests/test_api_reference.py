"""docs/api-reference.md is generated from the code and must not drift from it."""

from __future__ import annotations

import os

from conftest import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
    return load_tool("gen_api_reference")


def test_reference_is_up_to_date():
    gen = _generator()
    with open(gen.OUT, encoding="utf-8") as fh:
        on_disk = fh.read()
    assert on_disk == gen.generate(), (
        "docs/api-reference.md is out of date: run `python tools/gen_api_reference.py`")


def test_reference_covers_every_public_name_with_a_description():
    import store

    text = _generator().generate()
    for name in store.__all__:
        assert f"`{name}" in text, name
    undocumented = [line for line in text.splitlines() if line.rstrip().endswith("`:")]
    assert undocumented == [], f"public names without a docstring: {undocumented}"
