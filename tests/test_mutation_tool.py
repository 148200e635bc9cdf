"""The mutation tool's operators make the mutants they claim, on a toy function (the full run is `make mutation`)."""

from __future__ import annotations

from course_lib.grading.mutation import Mutant, mutants, mutate_source, region_lines

TOY = '''def scaled(x, limit, scale=2):
    """A docstring is never mutated."""
    if x.numel() < limit and not x.is_cuda:
        x = x.to(torch.float32, device="cpu")
    total = x.sum() * scale + limit
    total -= 1
    print("done")
    return max(total, 0.5), torch.full((2,), 3)
'''


def _made() -> set[tuple[str, str, str]]:
    return {(operator, before, after) for _, operator, before, after, _ in mutate_source(TOY)}


def test_each_operator_makes_its_mutants() -> None:
    made = _made()
    expected = {
        ("boundary", "x.numel() < limit", "(x.numel() <= limit)"),
        ("comparison", "x.numel() < limit", "(x.numel() >= limit)"),
        ("logic", "x.numel() < limit and not x.is_cuda", "(x.numel() < limit or not x.is_cuda)"),
        ("logic", "not x.is_cuda", "x.is_cuda"),
        ("dtype/device", "torch.float32", "torch.float64"),
        ("dtype/device", '"cpu"', "'cuda'"),
        ("dtype/device", 'x.to(torch.float32, device="cpu")', "x.to(torch.float32)"),
        ("arithmetic", "x.sum() * scale", "(x.sum() / scale)"),
        ("arithmetic", "x.sum() * scale + limit", "(x.sum() * scale - limit)"),
        ("dropped term", "x.sum() * scale + limit", "(x.sum() * scale)"),
        ("dropped term", "x.sum() * scale + limit", "limit"),
        ("dropped term", "x.sum() * scale", "x.sum()"),
        ("dropped term", "x.sum() * scale", "scale"),
        ("constant", "2", "3"),
        ("constant", "2", "1"),
        ("constant", "0.5", "1.0"),
        ("constant", "0.5", "0.0"),
        ("constant", "max(total, 0.5)", "min(total, 0.5)"),
        ("arithmetic", "total -= 1", "total += 1"),
        ("dropped statement", "total -= 1", "pass"),
        ("dropped statement", 'print("done")', "pass"),
        ("swapped arguments", "torch.full((2,), 3)", "torch.full(3, (2,))"),
    }
    assert expected <= made, sorted(expected - made)


def test_what_is_not_a_mutant() -> None:
    made = _made()
    befores = {before for _, before, _ in made}
    assert not any("docstring" in b for b in befores), "strings other than devices are left alone"
    assert ("swapped arguments", "max(total, 0.5)", "max(0.5, total)") not in made, "max is symmetric"
    assert all(after != before for _, before, after in made)


def test_only_the_solution_regions_are_mutated() -> None:
    cell = ("def f(a, b):\n    c = a + 1\n    ### BEGIN SOLUTION: the sum\n    return a + b\n    ### END SOLUTION\n")
    assert region_lines(cell) == {4}
    made = mutate_source(cell, region_lines(cell).__contains__)
    assert made and all(line == 4 for line, *_ in made)
    assert {after for _, _, _, after, _ in made} == {"(a - b)", "a", "b"}
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["exercise"]}, "source": cell},
                    {"cell_type": "code", "metadata": {}, "source": "x = 1 + 2\n"}]}
    (first, *_) = mutants(nb)
    assert isinstance(first, Mutant) and first.cell == 0 and first.where == "return a + b"
    assert first.source == cell.replace("return a + b", "return (a - b)")
