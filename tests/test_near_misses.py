"""Near misses found by `make mutation`: a rule one step from the right one, which the checks' data once could not
tell apart from it. Each row is now caught by the check named, because that check's data was chosen so the two
rules give different answers (docs/mutation.md lists the mutants; docs/grading.md the requirement each row breaks).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib.grading import notebook
from test_grading_variants import judge_row

REPO = Path(__file__).resolve().parents[1]


def _solution_edited(number: str, old: str, new: str) -> str:
    """The solution's exercise cells with ``old`` replaced by ``new`` once (the mutant `make mutation` made)."""
    (path,) = sorted((REPO / "solutions").glob(f"{number}_*.ipynb"))
    cells = [notebook.source(c) for c in notebook.read(path)["cells"]
             if c.get("cell_type") == "code" and "exercise" in notebook.tags(c)]
    source = "\n\n".join(cells)
    assert source.count(old) >= 1, f"the solution of {number} no longer contains {old!r}"
    return source.replace(old, new, 1)


# (exercise, the near miss, the code, a word from the name of the check that must fail)
NEAR_MISSES = [
    ("01", "a flag without its value found only at position 0 (1 >= len(argv) instead of i + 1)",
     _solution_edited("01", "if i + 1 >= len(argv) or", "if 1 >= len(argv) or"), "malformed"),
    ("01", "the argument before a flag checked for being a flag, not the one after it (argv[i - 1]): --depth 5 "
     "after the switch --no-keep-last refused",
     _solution_edited("01", "argv[i + 1].startswith", "argv[i - 1].startswith"), "types"),
    ("01", "always the second argument checked for being a flag (argv[1])",
     _solution_edited("01", "argv[i + 1].startswith", "argv[1].startswith"), "malformed"),
    ("03", "break-even without the floor of one call (max(0, ...)): 0 when the first call is as cheap as a steady one",
     _solution_edited("03", "return max(1, math.ceil(", "return max(0, math.ceil("), "break-even"),
    ("03", "warmup=0 refused (warmup <= 0 instead of < 0)", """
        def steady_state(times, warmup):
            if warmup <= 0 or warmup >= len(times):
                raise ValueError(f"warmup={warmup} out of range")
            return statistics.median(times[warmup:])
        """, "steady state"),
    ("03", "a step exactly factor x the median counted as slow (>= instead of >)", """
        def slow_steps(times, factor=3.0):
            limit = factor * statistics.median(times)
            return [i for i, t in enumerate(times) if t >= limit]
        """, "slow steps"),
    ("05", "the cosine's denominator guarded at 2 instead of 1", """
        def lr_at(step, cfg):
            if step < cfg.warmup:
                return cfg.lr * step / cfg.warmup
            t = min(1.0, (step - cfg.warmup) / max(2, cfg.steps - cfg.warmup))
            return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
        """, "cosine"),
    ("07", "gradients the model arrived with are kept in the first group's step (zeroed only after each step)", """
        def train_accumulated(model, loader, optimizer, device, microbatches=4):
            model.train()
            total_loss, total_count, sizes = 0.0, 0, []
            for group in _groups(loader, microbatches):
                count = sum(int((y != IGNORE).sum()) for _, y in group)
                for x, y in group:
                    loss_sum = F.cross_entropy(model(x), y, ignore_index=IGNORE, reduction="sum")
                    (loss_sum / count).backward()
                    total_loss += loss_sum.item()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                total_count += count
                sizes.append(count)
            return {"loss": total_loss / total_count, "steps": len(sizes), "group_sizes": sizes}
        """, "big batch"),
    ("07", "a group's target count guarded at 2 (a group with one real target halves its gradient)", """
        def train_accumulated(model, loader, optimizer, device, microbatches=4):
            model.train()
            optimizer.zero_grad(set_to_none=True)
            total_loss, total_count, sizes = 0.0, 0, []
            for group in _groups(loader, microbatches):
                count = sum(int((y != IGNORE).sum()) for _, y in group)
                for x, y in group:
                    loss_sum = F.cross_entropy(model(x), y, ignore_index=IGNORE, reduction="sum")
                    (loss_sum / max(count, 2)).backward()
                    total_loss += loss_sum.item()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                total_count += count
                sizes.append(count)
            return {"loss": total_loss / total_count, "steps": len(sizes), "group_sizes": sizes}
        """, "big batch"),
    ("07", "the model left in the eval mode it arrived in (no model.train())",
     _solution_edited("07", "    model.train()\n    optimizer.zero_grad", "    optimizer.zero_grad"), "big batch"),
    ("07", "class-weighted: group_sizes counts the ignored targets", """
        _solution_weighted = train_accumulated_weighted
        def train_accumulated_weighted(model, loader, optimizer, device, class_weights, microbatches=4):
            out = _solution_weighted(model, loader, optimizer, device, class_weights, microbatches)
            sizes = [sum(len(y) for _, y in group) for group in _groups(loader, microbatches)]
            return dict(out, group_sizes=sizes)
        """, "class-weighted"),
    ("08", "amp_step does not zero the gradients first (an earlier step's are added in)", """
        _solution_step = amp_step
        def amp_step(model, batch, optimizer, scaler, device, amp_dtype, max_norm):
            optimizer.zero_grad = lambda set_to_none=True: None
            return _solution_step(model, batch, optimizer, scaler, device, amp_dtype, max_norm)
        """, "unscale_"),
    ("18", "three rounds decide nothing (fewer than 4 instead of fewer than 3)", """
        _solution_verdict = verdict
        def verdict(a_times, b_times, band=0.05):
            outcome, ratio = _solution_verdict(a_times, b_times, band)
            return ("too_close" if len(a_times) < 4 else outcome), ratio
        """, "decided only"),
    ("18", "a ratio exactly 1 + band is not decided (> instead of >=)", """
        _solution_verdict = verdict
        def verdict(a_times, b_times, band=0.05):
            outcome, ratio = _solution_verdict(a_times, b_times, band)
            return ("too_close" if ratio == 1 + band else outcome), ratio
        """, "decided only"),
    ("18", "the per-round times of b taken for the per-round ratios b/a", """
        def verdict(a_times, b_times, band=0.05):
            ratio = statistics.median(b_times) / statistics.median(a_times)
            if len(a_times) < 3:
                return "too_close", ratio
            low, _, high = statistics.quantiles(b_times, n=4, method="inclusive") if len(a_times) >= 4 else (
                min(b_times), 0, max(b_times))
            if ratio >= 1 + band and low > 1:
                return "faster", ratio
            if ratio <= 1 / (1 + band) and high < 1:
                return "slower", ratio
            return "too_close", ratio
        """, "decided only"),
    ("13", "MultiHead's trunk in another order (ReLU before the Linear): the same modules, other outputs", """
        _solution_multi = MultiHead
        class MultiHead(_solution_multi):
            def __init__(self, d_in, d_hidden, heads, p=0.1):
                super().__init__(d_in, d_hidden, heads, p)
                self.trunk = nn.Sequential(nn.ReLU(), nn.Linear(d_in, d_hidden), nn.Dropout(p))
        """, "ModuleDict"),
    ("15", "a budget met exactly by checkpointing every block is refused (>= instead of >)", """
        _solution_plan = blocks_to_checkpoint
        def blocks_to_checkpoint(plain, checkpointed, budget):
            if sum(checkpointed) >= budget:
                raise ValueError(f"{sum(checkpointed) - budget} bytes over the budget")
            return _solution_plan(plain, checkpointed, budget)
        """, "fewest"),
    ("15", "a block's plain bytes subtracted instead of what checkpointing it saves", """
        def blocks_to_checkpoint(plain, checkpointed, budget):
            if sum(checkpointed) > budget:
                raise ValueError(f"{sum(checkpointed) - budget} bytes over the budget")
            total, chosen = sum(plain), []
            for i in sorted(range(len(plain)), key=lambda i: (-(plain[i] - checkpointed[i]), i)):
                if total <= budget:
                    break
                total -= plain[i]
                chosen.append(i)
            return sorted(chosen)
        """, "fewest"),
]


@pytest.mark.parametrize("number, mistake, code, check", NEAR_MISSES, ids=[f"{r[0]}-{r[1]}" for r in NEAR_MISSES])
def test_a_near_miss_fails_its_check(number: str, mistake: str, code: str, check: str) -> None:
    results = judge_row(number, code, only=check)
    assert results, f"no check of exercise {number} is named like {check!r}"
    failing = {name: r.message for name, r in results.items() if not r.passed}
    assert any(check in name for name in failing), f"{mistake!r} should fail {check!r}; failing: {failing}"
