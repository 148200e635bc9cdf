"""Print pip constraints that pin every dependency pyproject.toml declares to its floor: `make test-oldest`.

The project's dependencies and its `dev` extra each say `name>=floor`; `name==floor` installs the oldest release
the project claims to support. Their own dependencies are left to pip (it picks the newest that fits).
Runs on Python 3.11 or newer (tomllib).
"""

import re
import sys
from pathlib import Path

import tomllib

FLOOR = re.compile(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)$")

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
    match = FLOOR.match(requirement)
    if not match:
        sys.exit(f"pyproject.toml: {requirement!r} has no plain `name>=floor` form, so it has no floor to pin; "
                 "write it as `name>=X` (or teach .ci/oldest_pins.py the new form)")
    print(f"{match[1]}=={match[2]}")
