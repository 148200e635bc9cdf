"""Shared test set-up: every test runs in smoke mode against a data cache inside the repository."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Set before anything imports course_lib, so every module and every notebook kernel started by nbval sees it.
os.environ.setdefault("COURSE_MODE", "smoke")
os.environ.setdefault("COURSE_DATA_DIR", str(REPO / ".cache" / "data"))
os.environ.setdefault("MPLBACKEND", "Agg")


import pytest  # noqa: E402 - after the environment is set


@pytest.fixture
def one_thread():
    """One intra-op thread: on a small shared CPU, two OpenMP threads contend and tiny ops get many times slower."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
