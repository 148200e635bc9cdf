"""docs/coverage.md stays true: every syllabus id is mapped, and every place it names exists.

A row reads ``| S0.3 ★ | notebooks/02_dataloader.ipynb | <heading text> | exercises/02_bottleneck.ipynb, tests/... |``.
The heading must be a Markdown heading in that notebook, and every exercise/test path must exist.
"""

from __future__ import annotations

import json
import re

from conftest import REPO

# The syllabus ids: S0.1-S0.21, S1.1-S1.16, S3.1-S3.9, S4.1-S4.9 and S5.1-S5.8.
# Starred ids must be practised in a graded exercise.
SYLLABUS_IDS = (
    [f"S0.{i}" for i in range(1, 22)] + [f"S1.{i}" for i in range(1, 17)] + [f"S3.{i}" for i in range(1, 10)]
    + [f"S4.{i}" for i in range(1, 10)] + [f"S5.{i}" for i in range(1, 9)]
)
STARRED = {"S0.3", "S0.6", "S0.9", "S0.10", "S0.11", "S0.14", "S0.16", "S0.18", "S0.19",
           "S1.4", "S1.6", "S1.7", "S1.9", "S1.10", "S1.11", "S1.14", "S1.16", "S4.1", "S4.2", "S4.5", "S5.1", "S5.2",
           "S5.3", "S5.4", "S5.5"}

ROW = re.compile(r"^\|\s*(S\d\.\d+)\s*(★)?\s*\|([^|]+)\|([^|]+)\|([^|]*)\|\s*$")


def _rows() -> list[tuple[str, str, str, list[str]]]:
    rows = []
    for line in (REPO / "docs" / "coverage.md").read_text(encoding="utf-8").splitlines():
        match = ROW.match(line.strip())
        if match:
            ident, _, notebook, heading, practice = match.groups()
            refs = [p.strip().strip("`") for p in practice.split(",") if p.strip()]
            rows.append((ident, notebook.strip().strip("`"), heading.strip(), refs))
    return rows


def _headings(notebook: str) -> set[str]:
    nb = json.loads((REPO / notebook).read_text(encoding="utf-8"))
    found = set()
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for line in source.splitlines():
            if line.startswith("#"):
                found.add(line.lstrip("#").strip())
    return found


def test_every_syllabus_id_is_mapped():
    mapped = {ident for ident, *_ in _rows()}
    missing = [i for i in SYLLABUS_IDS if i not in mapped]
    assert not missing, f"docs/coverage.md has no row for {missing}"


def test_every_mapped_section_exists():
    problems = []
    for ident, notebook, heading, _ in _rows():
        if not (REPO / notebook).exists():
            problems.append(f"{ident}: {notebook} does not exist")
        elif heading not in _headings(notebook):
            problems.append(f"{ident}: no heading {heading!r} in {notebook}")
    assert not problems, "\n".join(problems)


def test_starred_ids_are_practised_in_an_exercise_and_references_exist():
    problems = []
    for ident, _, _, refs in _rows():
        for ref in refs:
            path, _, section = ref.partition("::")
            if not (REPO / path).exists():
                problems.append(f"{ident}: {ref} does not exist")
            elif section and path.endswith(".ipynb") and section not in _headings(path):
                problems.append(f"{ident}: no heading {section!r} in {path}")
        if ident in STARRED and not any(r.startswith("exercises/") for r in refs):
            problems.append(f"{ident} is practised in a graded exercise, but its row names none")
    assert not problems, "\n".join(problems)
