"""Exercise 19 (a step's FLOPs, the roofline, MFU): realistic mistakes fail a named check, correct alternatives pass.

Judged exactly as the grader judges (observe -> save -> load -> replay), see tests/test_grading_variants.py.
"""

from __future__ import annotations

# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG = [
    ("the backward forgotten (forward only)", """
        def step_flops(widths, batch, tokens, vocab):
            return sum(2 * batch * tokens * a * b for a, b in zip(widths[:-1], widths[1:]))
        """, "float inputs"),
    ("backward counted as one forward instead of two", """
        def step_flops(widths, batch, tokens, vocab):
            return sum(2 * 2 * batch * tokens * a * b for a, b in zip(widths[:-1], widths[1:]))
        """, "float inputs"),
    ("a multiply-add counted as one FLOP", """
        def step_flops(widths, batch, tokens, vocab):
            total = 0
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
                forward = batch * tokens * a * b
                total += 2 * forward + (forward if i > 0 or vocab is not None else 0)
            return total
        """, "float inputs"),
    ("the embedding counted as a matmul (2*B*T*V*d)", """
        def step_flops(widths, batch, tokens, vocab):
            total = 2 * batch * tokens * vocab * widths[0] if vocab is not None else 0
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
                forward = 2 * batch * tokens * a * b
                total += 2 * forward + (forward if i > 0 or vocab is not None else 0)
            return total
        """, "embedding"),
    ("the 6N rule applied blindly (an input gradient for the raw data)", """
        def step_flops(widths, batch, tokens, vocab):
            params = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
            return 6 * params * batch * tokens
        """, "float inputs"),
    ("tokens ignored (batch rows only)", """
        def step_flops(widths, batch, tokens, vocab):
            total = 0
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
                forward = 2 * batch * a * b
                total += 2 * forward + (forward if i > 0 or vocab is not None else 0)
            return total
        """, "embedding"),
    ("intensity upside down (bytes per FLOP)", """
        def roofline(flops, bytes_moved, peak_flops, bandwidth):
            intensity = bytes_moved / flops
            bound = "compute" if intensity >= peak_flops / bandwidth else "memory"
            return intensity, min(peak_flops, intensity * bandwidth), bound
        """, "intensity"),
    ("max instead of min for the roof", """
        def roofline(flops, bytes_moved, peak_flops, bandwidth):
            intensity = flops / bytes_moved
            bound = "compute" if intensity >= peak_flops / bandwidth else "memory"
            return intensity, max(peak_flops, intensity * bandwidth), bound
        """, "attainable"),
    ("the ridge point assigned to memory", """
        def roofline(flops, bytes_moved, peak_flops, bandwidth):
            intensity = flops / bytes_moved
            bound = "compute" if intensity > peak_flops / bandwidth else "memory"
            return intensity, min(peak_flops, intensity * bandwidth), bound
        """, "ridge"),
    ("mfu with the seconds multiplied instead of divided", """
        def mfu(step_flops, step_seconds, peak_flops):
            return step_flops * step_seconds / peak_flops
        """, "mfu"),
]

RIGHT = [
    ("a closed form with sum(); the first layer's input gradient subtracted; a float that is integral", """
        def step_flops(widths, batch, tokens, vocab):
            n = batch * tokens
            matmuls = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
            no_input_grad = 0 if vocab else widths[0] * widths[1]
            return float(2 * n * (3 * matmuls - no_input_grad))
        """),
    ("numpy throughout; a list from roofline; the ridge compared by multiplying", """
        import numpy as np

        def step_flops(widths, batch, tokens, vocab):
            w = np.array(widths, dtype=np.int64)
            per_layer = 2 * batch * tokens * w[:-1] * w[1:]
            needs = np.ones(len(per_layer), dtype=np.int64)
            needs[0] = 0 if vocab is None else 1
            return np.int64(np.sum(2 * per_layer + needs * per_layer))

        def roofline(flops, bytes_moved, peak_flops, bandwidth):
            intensity = np.float64(flops) / np.float64(bytes_moved)
            roof = np.minimum(peak_flops, intensity * bandwidth)
            return [intensity, roof, "compute" if flops * bandwidth >= peak_flops * bytes_moved else "memory"]

        def mfu(step_flops, step_seconds, peak_flops):
            return np.float64(step_flops) / (np.float64(step_seconds) * peak_flops)
        """),
    ("the bound read from which roof is lower", """
        def roofline(flops, bytes_moved, peak_flops, bandwidth):
            intensity = flops / bytes_moved
            memory_roof = intensity * bandwidth
            if memory_roof < peak_flops:
                return (intensity, memory_roof, "memory")
            return (intensity, peak_flops, "compute")
        """),
]

# (what the mistake is, the code, a word from the name of the check that must fail, words its hint must contain):
# the hint names the mistake that was made, not only the rule.
HINTS = [
    ("the bias add counted (N*b per Linear, forward only)", """
        def step_flops(widths, batch, tokens, vocab):
            rows, total = batch * tokens, 0
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
                forward = 2 * rows * a * b
                total += 3 * forward - (forward if i == 0 and vocab is None else 0) + rows * b
            return total
        """, "float inputs", ("bias",)),
    ("the bias counted as a weight row: Linear(a, b) as an (a + 1) x b matmul", """
        def step_flops(widths, batch, tokens, vocab):
            rows, total = batch * tokens, 0
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
                forward = 2 * rows * (a + 1) * b
                total += 3 * forward - (forward if i == 0 and vocab is None else 0)
            return total
        """, "embedding", ("bias",)),
    ("the backward forgotten: the hint teaches the rule, it does not blame the bias", """
        def step_flops(widths, batch, tokens, vocab):
            return sum(2 * batch * tokens * a * b for a, b in zip(widths[:-1], widths[1:]))
        """, "float inputs", ("gradient", "-bias")),
]
