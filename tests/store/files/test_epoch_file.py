"""The epoch file (``config/epochs``): terms round-trip, a damaged file is refused, a new
term drops the terms its log does not hold."""

from __future__ import annotations

import os

import pytest

from store.base.errors import StoreError
from store.files.epoch_file import EPOCH_FILE, read_epochs, with_term, write_epochs


def test_terms_round_trip_and_a_new_term_drops_what_the_log_does_not_hold(tmp_path):
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "config"))
    assert read_epochs(root) == []
    write_epochs(root, [(1, 0), (2, 4096), (3, 4096)])
    assert read_epochs(root) == [(1, 0), (2, 4096), (3, 4096)]
    with open(os.path.join(root, EPOCH_FILE)) as fh:
        assert fh.read() == "1\n3\n1 0\n2 4096\n3 4096\n"
    assert with_term(read_epochs(root), 4, 9000) == [(1, 0), (2, 4096), (3, 4096), (4, 9000)]
    assert with_term(read_epochs(root), 4, 100) == [(1, 0), (4, 100)]
    for bad in ([(2, 0), (1, 10)], [(1, 10), (2, 5)], [(1, 0), (1, 0)]):
        with pytest.raises(StoreError, match="rising"):
            write_epochs(root, bad)
    assert read_epochs(root) == [(1, 0), (2, 4096), (3, 4096)]  # a refused write changes nothing
    for text in ("1\n2\n1 0\n", "2\n1\n1 0\n", "x\n", "1\n2\n2 0\n1 5\n", "1\n1\n1 0 7\n"):
        with open(os.path.join(root, EPOCH_FILE), "w") as fh:
            fh.write(text)
        with pytest.raises(StoreError, match="epoch|rising"):
            read_epochs(root)
