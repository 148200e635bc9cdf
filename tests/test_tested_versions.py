"""README's "Tested versions" names the floors pyproject.toml declares: the oldest end of the range is what
`make test-oldest` installs (.ci/oldest_pins.py), so the two cannot drift apart unnoticed."""

from __future__ import annotations

import re

import pytest

from conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the course still runs on 3.10


def floors() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return dict(re.match(r"^([A-Za-z0-9_.-]+)\s*>=\s*(\S+)$", r).groups() for r in project["dependencies"])


def test_readme_states_the_floors_as_the_oldest_tested_versions() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### Tested versions", 1)[1].split("\n### ", 1)[0]
    oldest = section.split("the oldest", 1)[1].split("the newest", 1)[0]
    for name in ("torch", "torchvision", "lightning"):
        stated = re.search(rf"\b{name} (\d+(?:\.\d+)*)", oldest)
        assert stated, f"README's Tested versions does not state the oldest {name}"
        floor = floors()[name]
        assert stated[1].removesuffix(".0") == floor.removesuffix(".0"), (name, stated[1], floor)
