"""The library and its tests pass ruff with the project's configuration (``[tool.ruff]`` in pyproject.toml).

ruff is a declared test dependency (the ``dev`` extra), so a missing ruff is a failure that says how to install it,
not a skip. The failure message is ruff's own list of findings, one per line, ready to fix.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from conftest import REPO


def test_ruff_finds_nothing() -> None:
    assert importlib.util.find_spec("ruff") is not None, (
        "ruff is not installed in this environment; it is a test dependency: pip install -e '.[dev]'")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, (
        f"ruff found problems (fix them, or let `ruff check --fix` fix the safe ones):\n{result.stdout}{result.stderr}")
