"""Shared test set-up: every test runs in smoke mode against a data cache inside the repository."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Set before anything imports course_lib, so every module and every notebook kernel started by nbval sees it.
os.environ.setdefault("COURSE_MODE", "smoke")
os.environ.setdefault("COURSE_DATA_DIR", str(REPO / ".cache" / "data"))
os.environ.setdefault("MPLBACKEND", "Agg")
