"""Every committed notebook is stored clean (no outputs, counts or volatile metadata)."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from course_lib import nbclean

NOTEBOOKS = nbclean.notebooks([REPO / d for d in ("notebooks", "exercises", "solutions") if (REPO / d).exists()])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(REPO)) for p in NOTEBOOKS])
def test_notebook_is_stored_clean(path):
    assert nbclean.is_clean(path), f"{path} has outputs or volatile metadata: run `python -m course_lib.nbclean {path}`"


def test_clean_removes_outputs_and_volatile_metadata():
    dirty = {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "language_info": {"name": "python", "version": "3.11.7"}, "widgets": {"state": {}}},
        "cells": [{"cell_type": "code", "id": "a1", "execution_count": 7, "source": "1+1",
                   "metadata": {"tags": ["check"], "execution": {"iopub.status.busy": "2026"}},
                   "outputs": [{"output_type": "execute_result", "data": {"text/plain": "2"}}]}],
    }
    cleaned = nbclean.clean(dirty)
    cell = cleaned["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert cell["metadata"] == {"tags": ["check"]}
    assert "widgets" not in cleaned["metadata"]
    assert cleaned["metadata"]["language_info"] == {"name": "python"}
    assert nbclean.clean(cleaned) == cleaned  # idempotent
    assert json.loads(nbclean.dumps(cleaned)) == cleaned
